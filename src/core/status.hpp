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

namespace ferry {

/// The status rule of one side of a room: statuses only increase, Failed may interrupt any
/// non-terminal status, and terminal statuses are final. Messages from the two planes (CAF
/// control, fabric completions) may arrive in either order, so a late event never moves a room
/// backwards (e.g. a prepare ack arriving after the first write landed).
class room_state {
 public:
  room_status status() const { return status_; }
  /// Move forward to `s`; false (no change) when `s` is not above the current status, or the
  /// room is terminal. Use `fail` for Failed.
  bool advance(room_status s) {
    if (is_terminal(status_) || s == room_status::failed || s <= status_) return false;
    status_ = s;
    return true;
  }
  /// Fail the room; false when it was already terminal.
  bool fail() {
    if (is_terminal(status_)) return false;
    status_ = room_status::failed;
    return true;
  }

 private:
  room_status status_ = room_status::bootstrapping;
};

}  // namespace ferry
