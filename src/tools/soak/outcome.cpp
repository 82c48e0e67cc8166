#include "tools/soak/outcome.hpp"

#include <regex>

namespace ferry::soak {

kind classify(errc code) {
  switch (code) {
    case errc::cancelled:
      return k_cancelled;
    case errc::peer_unreachable:
    case errc::peer_incompatible:
    case errc::peer_lost:
    case errc::fabric_write_failed:  // a write to the decode failed: the peer or the link
      return k_peer_failed;
    case errc::timed_out:
      return k_timed_out;
    default:
      return k_other;
  }
}

std::string normalize(const std::string& reason) {
  static const std::regex instance("\\b[0-9a-f]{8}\\b");
  static const std::regex number("[0-9]+");
  auto s = std::regex_replace(reason, instance, "<inst>");
  s = std::regex_replace(s, number, "#");
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return s;
}

}  // namespace ferry::soak
