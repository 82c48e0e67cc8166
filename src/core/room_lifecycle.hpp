#pragma once
/// The lifecycle every room shares, on either side, as a pure state machine: its inputs are
/// events (start, advance, fail, drained, a deadline expired), its outputs are effects (report
/// this status, arm or cancel this deadline, end the actor). The Sender and the Receiver keep
/// what only they know (their links, writes and drain rule) and feed this one machine.
///
/// The rules:
/// - Statuses only move forward: Bootstrapping < WaitingForInput < Transferring < Success.
/// - Each non-terminal status has its own deadline (timeouts.<status>_ms), cancelled when the
///   room leaves it, besides the whole room's (timeouts.transfer_ms).
/// - A failure first drains: the room stops moving forward and reports Failed only once its side
///   says nothing of it can be in flight any more (`drained`). A side that may have writes in
///   flight arms the drain deadline (timeouts.drain_ms); what happens at that deadline is the
///   side's rule (the Sender reports anyway, the Receiver fences its peers first).
/// - A terminal status is reported once; it cancels every deadline and ends the actor.
/// - A deadline that fires after the room left the status it was armed for, or after it was
///   cancelled, is ignored (its generation is not the current one).
///
/// The table of every (phase, event) pair is tests/unit/test_room_lifecycle.cpp.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "core/status.hpp"

namespace ferry {

/// The deadlines of a room.
enum class deadline_kind : uint8_t { state, room, drain };
inline constexpr int deadline_kind_count = 3;
const char* to_string(deadline_kind k);

/// Where a room is: its status, or draining (failed, not yet reported).
enum class room_phase : uint8_t {
  bootstrapping,
  waiting_for_input,
  transferring,
  draining,
  success,
  failed,
};
const char* to_string(room_phase p);

/// What the lifecycle asks of its actor, applied in this order: cancel, arm, report, quit.
struct lifecycle_effects {
  struct arm_deadline {
    deadline_kind kind;
    uint64_t generation;  ///< carried by the deadline's message, handed back to `expired`
    uint32_t ms;
  };
  std::vector<deadline_kind> cancel;
  std::vector<arm_deadline> arm;
  std::optional<room_status> report;  ///< with `reason` and `code` when Failed
  std::string reason;
  errc code = errc::ok;
  bool quit = false;

  bool empty() const { return cancel.empty() && arm.empty() && !report && !quit; }
};

inline void inspect(auto& f, lifecycle_effects::arm_deadline& x) {
  f("kind", x.kind)("generation", x.generation)("ms", x.ms);
}
inline void inspect(auto& f, lifecycle_effects& x) {
  f("cancel", x.cancel)("arm", x.arm)("report", x.report)("reason", x.reason)("code", x.code)(
      "quit", x.quit);
}

/// The bounds of a room (from timeouts).
struct lifecycle_limits {
  uint32_t bootstrapping_ms = 0, waiting_for_input_ms = 0, transferring_ms = 0;
  uint32_t transfer_ms = 0;  ///< the whole room
  uint32_t drain_ms = 0;
};

/// A deadline that still applies: how the room times out, or that its drain is over.
struct expiry {
  enum class kind : uint8_t { timed_out, drain_over } what;
  room_status in;     ///< the status the room was in
  uint32_t ms;        ///< the bound that passed
  std::string waits;  ///< what the room waited for ("waiting for the first write")
};

class room_lifecycle {
 public:
  /// `waits`: what each non-terminal status waits for, by status (Bootstrapping,
  /// WaitingForInput, Transferring), in the side's words, for the timeout reason (string
  /// literals: every room of a side shares them).
  room_lifecycle(lifecycle_limits limits, std::array<const char*, 3> waits);
  room_lifecycle() = default;

  /// Arm the deadlines of Bootstrapping and of the whole room.
  lifecycle_effects start();
  /// Move forward to `s` (not Failed): reported, the old status's deadline replaced by the new
  /// one's (Success: every deadline cancelled, the actor ends). Nothing while draining, once
  /// terminal, or when `s` is not ahead.
  lifecycle_effects advance(room_status s);
  /// The room cannot succeed: keep the first reason and code, stop moving forward, and drain.
  /// `in_flight`: writes of the room may still be on their way, so the drain is bounded
  /// (timeouts.drain_ms); the side calls `drained` once they are not. False (no effect) when
  /// already draining or terminal.
  bool fail(errc code, std::string reason, bool in_flight, lifecycle_effects& out);
  /// The drain is over: report Failed with the reason (and `note`, e.g. what the drain deadline
  /// found), cancel every deadline, end the actor. Nothing unless draining.
  lifecycle_effects drained(const std::string& note = {});
  /// A deadline's message arrived. nullopt: it no longer applies (stale generation, cancelled,
  /// fired once already, or the room is terminal). `fail` cancels the state and room deadlines:
  /// a draining room has only its drain's bound.
  std::optional<expiry> expired(deadline_kind k, uint64_t generation);

  room_phase phase() const { return phase_; }
  room_status status() const;
  bool draining() const { return phase_ == room_phase::draining; }
  bool terminal() const { return phase_ == room_phase::success || phase_ == room_phase::failed; }
  const std::string& fail_reason() const { return reason_; }
  errc fail_code() const { return code_; }
  /// Whether deadline `k` is armed now (for tests and reports).
  bool armed(deadline_kind k) const { return armed_[static_cast<int>(k)]; }

 private:
  void arm(deadline_kind k, uint32_t ms, lifecycle_effects& out);
  void cancel(deadline_kind k, lifecycle_effects& out);
  void cancel_all(lifecycle_effects& out);
  uint32_t state_ms(room_status s) const;

  lifecycle_limits limits_;
  std::array<const char*, 3> waits_{};
  room_phase phase_ = room_phase::bootstrapping;
  room_status before_drain_ = room_status::bootstrapping;  ///< the status a drain began in
  std::string reason_;
  errc code_ = errc::ok;
  std::array<bool, deadline_kind_count> armed_{};
  std::array<uint64_t, deadline_kind_count> generation_{};
  uint64_t next_generation_ = 0;
};

}  // namespace ferry
