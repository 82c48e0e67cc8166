#include "core/errors.hpp"

namespace ferry {

const char* to_string(errc e) {
  switch (e) {
    case errc::ok:
      return "ok";
    case errc::config_invalid:
      return "config_invalid";
    case errc::fabric_unavailable:
      return "fabric_unavailable";
    case errc::fabric_write_failed:
      return "fabric_write_failed";
    case errc::fabric_error:
      return "fabric_error";
    case errc::checksum_mismatch:
      return "checksum_mismatch";
    case errc::peer_unreachable:
      return "peer_unreachable";
    case errc::peer_incompatible:
      return "peer_incompatible";
    case errc::peer_lost:
      return "peer_lost";
    case errc::malformed_frame:
      return "malformed_frame";
    case errc::frame_too_large:
      return "frame_too_large";
    case errc::unsupported_version:
      return "unsupported_version";
    case errc::access_denied:
      return "access_denied";
    case errc::invalid_request:
      return "invalid_request";
    case errc::duplicate_room:
      return "duplicate_room";
    case errc::unknown_room:
      return "unknown_room";
    case errc::room_finished:
      return "room_finished";
    case errc::wrong_role:
      return "wrong_role";
    case errc::timed_out:
      return "timed_out";
    case errc::cancelled:
      return "cancelled";
    case errc::draining:
      return "draining";
    case errc::internal:
      return "internal";
    case errc::system_error:
      return "system_error";
  }
  return nullptr;
}

}  // namespace ferry
