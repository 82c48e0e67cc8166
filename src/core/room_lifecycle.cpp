#include "core/room_lifecycle.hpp"

namespace ferry {

const char* to_string(deadline_kind k) {
  switch (k) {
    case deadline_kind::state:
      return "state";
    case deadline_kind::room:
      return "room";
    case deadline_kind::drain:
      return "drain";
  }
  return "?";
}

const char* to_string(room_phase p) {
  switch (p) {
    case room_phase::bootstrapping:
      return "Bootstrapping";
    case room_phase::waiting_for_input:
      return "WaitingForInput";
    case room_phase::transferring:
      return "Transferring";
    case room_phase::draining:
      return "Draining";
    case room_phase::success:
      return "Success";
    case room_phase::failed:
      return "Failed";
  }
  return "?";
}

namespace {

room_phase phase_of(room_status s) {
  switch (s) {
    case room_status::bootstrapping:
      return room_phase::bootstrapping;
    case room_status::waiting_for_input:
      return room_phase::waiting_for_input;
    case room_status::transferring:
      return room_phase::transferring;
    case room_status::success:
      return room_phase::success;
    case room_status::failed:
      return room_phase::failed;
  }
  return room_phase::failed;
}

}  // namespace

room_lifecycle::room_lifecycle(lifecycle_limits limits, std::array<const char*, 3> waits)
    : limits_(limits), waits_(waits) {}

room_status room_lifecycle::status() const {
  switch (phase_) {
    case room_phase::bootstrapping:
      return room_status::bootstrapping;
    case room_phase::waiting_for_input:
      return room_status::waiting_for_input;
    case room_phase::transferring:
      return room_status::transferring;
    case room_phase::draining:
      return before_drain_;  // a draining room has not reported Failed yet
    case room_phase::success:
      return room_status::success;
    case room_phase::failed:
      return room_status::failed;
  }
  return room_status::failed;
}

uint32_t room_lifecycle::state_ms(room_status s) const {
  switch (s) {
    case room_status::bootstrapping:
      return limits_.bootstrapping_ms;
    case room_status::waiting_for_input:
      return limits_.waiting_for_input_ms;
    case room_status::transferring:
      return limits_.transferring_ms;
    default:
      return 0;
  }
}

void room_lifecycle::arm(deadline_kind k, uint32_t ms, lifecycle_effects& out) {
  const int i = static_cast<int>(k);
  if (armed_[i]) out.cancel.push_back(k);
  armed_[i] = true;
  generation_[i] = ++next_generation_;
  out.arm.push_back({k, generation_[i], ms});
}

void room_lifecycle::cancel(deadline_kind k, lifecycle_effects& out) {
  const int i = static_cast<int>(k);
  if (!armed_[i]) return;
  armed_[i] = false;
  out.cancel.push_back(k);
}

void room_lifecycle::cancel_all(lifecycle_effects& out) {
  for (int i = 0; i < deadline_kind_count; ++i) cancel(static_cast<deadline_kind>(i), out);
}

lifecycle_effects room_lifecycle::on(lifecycle_event e) {
  return std::visit([this](auto& x) { return handle(std::move(x)); }, e);
}

lifecycle_effects room_lifecycle::handle(life_ev::start) {
  lifecycle_effects out;
  arm(deadline_kind::state, limits_.bootstrapping_ms, out);
  arm(deadline_kind::room, limits_.transfer_ms, out);
  return out;
}

lifecycle_effects room_lifecycle::handle(life_ev::advance e) {
  const room_status s = e.to;
  lifecycle_effects out;
  if (draining() || terminal() || s == room_status::failed || s <= status()) return out;
  phase_ = phase_of(s);
  out.report = s;
  if (s == room_status::success) {
    cancel_all(out);
    out.quit = true;
  } else {
    arm(deadline_kind::state, state_ms(s), out);
  }
  return out;
}

lifecycle_effects room_lifecycle::handle(life_ev::fail e) {
  lifecycle_effects out;
  if (draining() || terminal()) return out;
  before_drain_ = status();
  phase_ = room_phase::draining;
  code_ = e.code;
  reason_ = std::move(e.reason);
  cancel(deadline_kind::state, out);
  cancel(deadline_kind::room, out);
  if (e.in_flight) arm(deadline_kind::drain, limits_.drain_ms, out);
  out.began_drain = true;
  return out;
}

lifecycle_effects room_lifecycle::handle(life_ev::drained e) {
  lifecycle_effects out;
  if (!draining()) return out;
  phase_ = room_phase::failed;
  cancel_all(out);
  out.report = room_status::failed;
  out.reason = reason_ + e.note;
  out.code = code_;
  out.quit = true;
  return out;
}

lifecycle_effects room_lifecycle::handle(life_ev::expired e) {
  lifecycle_effects out;
  const int i = static_cast<int>(e.kind);
  if (!armed_[i] || generation_[i] != e.generation || terminal()) return out;
  armed_[i] = false;  // fired: a deadline applies once
  // Only the drain deadline is armed while draining (fail cancels the others), so an armed
  // deadline always applies to the phase the room is in.
  switch (e.kind) {
    case deadline_kind::state:
      out.expired = expiry{expiry::kind::timed_out, status(), state_ms(status()),
                           waits_[static_cast<int>(status()) - 1]};
      break;
    case deadline_kind::room:
      out.expired = expiry{expiry::kind::timed_out, status(), limits_.transfer_ms,
                           "the whole room (timeouts.transfer_ms)"};
      break;
    case deadline_kind::drain:
      out.expired = expiry{expiry::kind::drain_over, status(), limits_.drain_ms, "the drain"};
      break;
  }
  return out;
}

}  // namespace ferry
