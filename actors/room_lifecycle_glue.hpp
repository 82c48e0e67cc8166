#pragma once
/// How a room actor (Sender, Receiver) runs core/room_lifecycle.hpp (the Sender through
/// core/sender_room.hpp, which holds its lifecycle): its deadlines live in the
/// daemon's timer service and come back as `room_deadline`; a status report goes to the
/// Scheduler through the side's own `report`. Written once for both sides.

#include <array>
#include <caf/all.hpp>
#include <chrono>

#include "core/room_lifecycle.hpp"
#include "os/timer_service.hpp"

namespace ferry {

/// Timer service -> room: deadline `kind`, armed as `generation`, has passed.
struct room_deadline {
  deadline_kind kind = deadline_kind::state;
  uint64_t generation = 0;
};

}  // namespace ferry

namespace ferry {

/// The timer tokens of a room's armed deadlines, by kind.
using deadline_tokens = std::array<timer_service::token, deadline_kind_count>;

/// A room's lifecycle and the tokens of its armed deadlines.
struct room_life {
  room_lifecycle machine;
  deadline_tokens timers{};
};

/// Send `msg` to `to` after `after`, unless cancelled first. The actor is held weakly: the
/// deadline of an actor that has ended is dropped when it fires, and keeps nothing alive.
inline timer_service::token send_after(timer_service& timers, std::chrono::milliseconds after,
                                       const caf::actor& to, caf::message msg) {
  return timers.arm(after, [to = caf::actor_cast<caf::actor_addr>(to), msg = std::move(msg)] {
    if (auto a = caf::actor_cast<caf::actor>(to)) caf::anon_send(a, msg);
  });
}

/// The bounds of a room, from the config.
template <class Timeouts>
lifecycle_limits limits_of(const Timeouts& t) {
  return {t.bootstrapping_ms, t.waiting_for_input_ms, t.transferring_ms, t.transfer_ms, t.drain_ms};
}

/// Carry out the lifecycle's effects for actor `self`: cancel and arm its deadlines, report a
/// status through `report(status, reason, code)`, end the actor.
template <class Actor, class Report>
void apply_effects(Actor* self, timer_service& timers, deadline_tokens& tokens,
                   const lifecycle_effects& e, Report&& report) {
  for (auto k : e.cancel) {
    auto& t = tokens[static_cast<int>(k)];
    timers.cancel(t);
    t = 0;
  }
  for (const auto& a : e.arm)
    tokens[static_cast<int>(a.kind)] =
        send_after(timers, std::chrono::milliseconds(a.ms), caf::actor_cast<caf::actor>(self),
                   caf::make_message(room_deadline{a.kind, a.generation}));
  if (e.report) report(*e.report, e.reason, e.code);
  if (e.quit) self->quit();
}

template <class Actor, class Report>
void apply_effects(Actor* self, timer_service& timers, room_life& life, const lifecycle_effects& e,
                   Report&& report) {
  apply_effects(self, timers, life.timers, e, std::forward<Report>(report));
}

}  // namespace ferry

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::room_deadline)
