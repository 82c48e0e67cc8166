#include "soak/outcome.hpp"

#include <regex>

namespace ferry::soak {

kind classify(const std::string& reason) {
  if (reason.find("cancelled") != std::string::npos) return k_cancelled;
  for (const char* s : {" lost", "unresponsive", "restarted", "could not use peer", "not retried",
                        "went down", "write to decode", "connection closed", "fenced"})
    if (reason.find(s) != std::string::npos) return k_peer_failed;
  if (reason.find("timed out") != std::string::npos) return k_timed_out;
  return k_other;
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
