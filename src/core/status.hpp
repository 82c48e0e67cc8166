#pragma once
/// Room status, numerically identical to SGLang's KVPoll so engines can map it 1:1.
/// The ordering matters: Failed is the minimum (an all-reduce MIN fails a request everywhere) and
/// statuses otherwise only increase.

#include <cstdint>

namespace ferry {

enum class room_status : uint8_t {
  failed = 0,
  bootstrapping = 1,
  waiting_for_input = 2,
  transferring = 3,
  success = 4,
};

/// "Failed", "Bootstrapping", "WaitingForInput", "Transferring", "Success".
constexpr const char* to_string(room_status s) {
  switch (s) {
    case room_status::failed:
      return "Failed";
    case room_status::bootstrapping:
      return "Bootstrapping";
    case room_status::waiting_for_input:
      return "WaitingForInput";
    case room_status::transferring:
      return "Transferring";
    case room_status::success:
      return "Success";
  }
  return "Unknown";
}

constexpr bool is_terminal(room_status s) {
  return s == room_status::failed || s == room_status::success;
}

/// Sentinel for "no state slot" / "no aux row" in scalar index fields.
inline constexpr uint32_t no_index = 0xFFFFFFFFu;

}  // namespace ferry
