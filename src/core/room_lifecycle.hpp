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
/// The table of every (phase, event) pair is tests/core/test_room_lifecycle.cpp.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/errors.hpp"
#include "core/inspect.hpp"
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

/// A deadline that still applies: how the room times out, or that its drain is over.
struct expiry {
  enum class kind : uint8_t { timed_out, drain_over } what;
  room_status in;     ///< the status the room was in
  uint32_t ms;        ///< the bound that passed
  std::string waits;  ///< what the room waited for ("waiting for the first write")
};

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
  // What the room machine learns (answers to it, not work for the actor: neither traced nor
  // part of `empty`):
  bool began_drain = false;       ///< `fail`: the room drains from now (false: it already did)
  std::optional<expiry> expired;  ///< `expired`: the deadline still applies (else it is stale)

  bool empty() const { return cancel.empty() && arm.empty() && !report && !quit; }
};

inline void inspect(auto& f, lifecycle_effects::arm_deadline& x) {
  f("kind", x.kind)("generation", x.generation)("ms", x.ms);
}
inline void inspect(auto& f, lifecycle_effects& x) {
  f("cancel", x.cancel)("arm", x.arm)("report", x.report)("reason", x.reason)("code", x.code)(
      "quit", x.quit);
}

// The events, fed one at a time to `room_lifecycle::on` by the room machines
// (core/sender_room.hpp, core/receiver_room.hpp; core/inspect.hpp: each a name and its fields).
/// The events every room machine takes alike (core/sender_room.hpp, core/receiver_room.hpp, and
/// this lifecycle the start and the deadlines).
namespace room_ev {
/// The room's actor started (the lifecycle: arm the deadlines of Bootstrapping and the room).
struct start {
  static constexpr std::string_view name = "start";
};
/// The room's client (or the daemon for it) cancels it.
struct cancel {
  static constexpr std::string_view name = "cancel";
  std::string why;
};
/// A deadline armed by a `life` effect passed. The lifecycle answers with `expired` in its
/// effects when it still applies; none when it no longer does (stale generation, cancelled,
/// fired once already, or the room is terminal). `fail` cancels the state and room deadlines: a
/// draining room has only its drain's bound.
struct expired {
  static constexpr std::string_view name = "expired";
  deadline_kind kind = deadline_kind::state;
  uint64_t generation = 0;
};
inline void inspect(auto&, start&) {}
inline void inspect(auto& f, cancel& x) { f("why", x.why); }
inline void inspect(auto& f, expired& x) { f("kind", x.kind)("generation", x.generation); }
}  // namespace room_ev

namespace life_ev {
using room_ev::start;
/// Move forward to `to` (not Failed): reported, the old status's deadline replaced by the new
/// one's (Success: every deadline cancelled, the actor ends). Nothing while draining, once
/// terminal, or when `to` is not ahead.
struct advance {
  static constexpr std::string_view name = "advance";
  room_status to = room_status::bootstrapping;
};
/// The room cannot succeed: keep the first reason and code, stop moving forward, and drain.
/// `in_flight`: writes of the room may still be on their way, so the drain is bounded
/// (timeouts.drain_ms); the side sends `drained` once they are not. Nothing (and not
/// `began_drain`) when already draining or terminal.
struct fail {
  static constexpr std::string_view name = "fail";
  errc code = errc::ok;
  std::string reason;
  bool in_flight = false;
};
/// The drain is over: report Failed with the reason (and `note`, e.g. what the drain deadline
/// found), cancel every deadline, end the actor. Nothing unless draining.
struct drained {
  static constexpr std::string_view name = "drained";
  std::string note;
};
using room_ev::expired;

inline void inspect(auto& f, advance& x) { f("to", x.to); }
inline void inspect(auto& f, fail& x) {
  f("code", x.code)("reason", x.reason)("in_flight", x.in_flight);
}
inline void inspect(auto& f, drained& x) { f("note", x.note); }
}  // namespace life_ev

using lifecycle_event = std::variant<life_ev::start, life_ev::advance, life_ev::fail,
                                     life_ev::drained, life_ev::expired>;

/// The bounds of a room (from timeouts).
struct lifecycle_limits {
  uint32_t bootstrapping_ms = 0, waiting_for_input_ms = 0, transferring_ms = 0;
  uint32_t transfer_ms = 0;  ///< the whole room
  uint32_t drain_ms = 0;
};

class room_lifecycle {
 public:
  /// `waits`: what each non-terminal status waits for, by status (Bootstrapping,
  /// WaitingForInput, Transferring), in the side's words, for the timeout reason (string
  /// literals: every room of a side shares them).
  room_lifecycle(lifecycle_limits limits, std::array<const char*, 3> waits);
  room_lifecycle() = default;

  /// Feed the lifecycle one event: what it asks of the actor, and what the room learns.
  lifecycle_effects on(lifecycle_event e);

  room_phase phase() const { return phase_; }
  room_status status() const;
  bool draining() const { return phase_ == room_phase::draining; }
  bool terminal() const { return phase_ == room_phase::success || phase_ == room_phase::failed; }
  const std::string& fail_reason() const { return reason_; }
  errc fail_code() const { return code_; }
  /// Whether deadline `k` is armed now (for tests and reports).
  bool armed(deadline_kind k) const { return armed_[static_cast<int>(k)]; }

 private:
  lifecycle_effects handle(life_ev::start);
  lifecycle_effects handle(life_ev::advance e);
  lifecycle_effects handle(life_ev::fail e);
  lifecycle_effects handle(life_ev::drained e);
  lifecycle_effects handle(life_ev::expired e);
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
