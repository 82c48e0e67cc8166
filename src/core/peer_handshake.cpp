#include "core/peer_handshake.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ferry::handshake {

const char* to_string(phase p) {
  switch (p) {
    case phase::created:
      return "created";
    case phase::checking:
      return "checking";
    case phase::registering:
      return "registering";
    case phase::dialing:
      return "dialing";
    case phase::awaiting_hello:
      return "awaiting_hello";
    case phase::inserting:
      return "inserting";
    case phase::awaiting_auth:
      return "awaiting_auth";
    case phase::ready:
      return "ready";
    case phase::closing:
      return "closing";
    case phase::fencing:
      return "fencing";
    case phase::ended:
      return "ended";
  }
  return "?";
}

machine::machine(side s, std::string address, bool secret)
    : side_(s),
      address_(std::move(address)),
      secret_(secret),
      phase_(s == side::connecting ? phase::created : phase::checking) {}

effects machine::on(event e) {
  return std::visit([this](auto& x) { return handle(std::move(x)); }, e);
}

effects machine::handle(ev::start) {
  if (side_ != side::connecting || phase_ != phase::created) return {};
  phase_ = phase::registering;
  registering_ = true;
  return {register_memory{}};
}

effects machine::handle(ev::hello e) {
  const auto& checked = e.checked;
  const bool expected =
      side_ == side::connecting ? phase_ == phase::awaiting_hello : phase_ == phase::checking;
  if (!expected) return {};
  if (!checked) return refuse(checked.message);
  phase_ = phase::inserting;
  inserting_ = true;
  return {insert_address{}};
}

effects machine::handle(ev::registered e) {
  const auto& [described, made] = e;
  if (!registering_) return {};  // none asked: not ours
  registering_ = false;
  made_ = made_ || made;
  effects out;
  if (closed()) {
    finish_if_idle(out);
    return out;
  }
  out.push_back(report_resources{});
  if (!described) {
    effects end = side_ == side::accepting
                      ? refuse(described.message)
                      : close_with("peer refused the handshake: " + described.message,
                                   errc::peer_incompatible);
    out.insert(out.end(), end.begin(), end.end());
    return out;
  }
  if (side_ == side::connecting) {
    phase_ = phase::dialing;
    ++dials_;
    out.push_back(dial{});
    return out;
  }
  out.push_back(send_hello{});
  if (secret_) {
    phase_ = phase::awaiting_auth;
  } else {
    phase_ = phase::ready;
    was_ready_ = true;
    out.push_back(become_ready{});
  }
  return out;
}

effects machine::handle(ev::dialed e) {
  const auto& [o, error] = e;
  if (side_ != side::connecting || phase_ != phase::dialing || redial_pending_) return {};
  if (o == dial_outcome::connected) {  // the preamble ran: the channel is open
    phase_ = phase::awaiting_hello;
    return {send_hello{}};
  }
  if (o == dial_outcome::reset && dials_ < max_dials) {
    redial_pending_ = true;
    return {redial_after{first_redial_ms << (dials_ - 1), dials_, error}};
  }
  return close_with(fmt::format("cannot connect to {}: {}", address_, error),
                    errc::peer_unreachable);
}

effects machine::handle(ev::redial) {
  if (phase_ != phase::dialing || !redial_pending_) return {};
  redial_pending_ = false;
  ++dials_;
  return {dial{}};
}

effects machine::handle(ev::inserted e) {
  const auto& outcome = e.outcome;
  if (!inserting_) return {};
  inserting_ = false;
  inserted_ = inserted_ || static_cast<bool>(outcome);
  effects out;
  if (closed()) {
    finish_if_idle(out);
    return out;
  }
  if (!outcome) return refuse("cannot add the peer's fabric address: " + outcome.message);
  if (side_ == side::accepting) {
    // The peer is now ours to remove; describe our memory to it next.
    phase_ = phase::registering;
    registering_ = true;
    return {report_resources{}, register_memory{}};
  }
  if (secret_) out.push_back(send_proof{});
  phase_ = phase::ready;
  was_ready_ = true;
  out.push_back(become_ready{});
  return out;
}

effects machine::handle(ev::authenticated e) {
  const bool proof_ok = e.proof_ok;
  if (side_ != side::accepting || phase_ != phase::awaiting_auth) return {};
  if (!proof_ok) {
    const std::string e = "peer failed the cluster-secret challenge (different secrets?)";
    effects out{send_refusal{e}};
    auto end = close_with("handshake failed: " + e, errc::peer_incompatible);
    out.insert(out.end(), end.begin(), end.end());
    return out;
  }
  phase_ = phase::ready;
  was_ready_ = true;
  return {become_ready{}};
}

effects machine::handle(ev::refused e) {
  if (closed()) return {};
  return close_with("peer refused the handshake: " + e.reason, errc::peer_incompatible);
}

effects machine::handle(ev::lost e) {
  if (closed()) return {};
  return close_with(std::move(e.reason), ready() ? errc::peer_lost : errc::peer_unreachable,
                    e.unresponsive);
}

effects machine::handle(ev::deadline e) {
  if (closed() || ready()) return {};
  return close_with(fmt::format("handshake did not complete within {} ms", e.ms),
                    errc::peer_unreachable);
}

effects machine::handle(ev::fenced) {
  if (phase_ != phase::fencing) return {};
  phase_ = phase::ended;
  return {report_down{true, was_ready_, unresponsive_}, quit{}};
}

std::optional<std::string> machine::unexpected(inbound what) const {
  switch (what) {
    case inbound::hello:
      if (side_ == side::connecting && phase_ == phase::awaiting_hello) return std::nullopt;
      return "peer sent a second hello";
    case inbound::proof:
      if (phase_ == phase::awaiting_auth) return std::nullopt;
      return "peer sent a proof it was not asked for";
    case inbound::room_message:
      if (ready()) return std::nullopt;
      return "peer sent a room message before it authenticated";
  }
  return "peer sent a message of no known kind";
}

effects machine::close_with(std::string reason, errc code, bool unresponsive) {
  reason_ = std::move(reason);
  code_ = code;
  unresponsive_ = unresponsive;
  phase_ = phase::closing;
  effects out{closing_with{reason_, code_}};
  finish_if_idle(out);
  return out;
}

effects machine::refuse(std::string reason) {
  if (side_ == side::connecting) {
    // Tell the peer why, then end like any failed handshake (the rooms learn of it).
    effects out{send_refusal{reason}};
    auto end = close_with("handshake failed: " + reason, errc::peer_incompatible);
    out.insert(out.end(), end.begin(), end.end());
    return out;
  }
  // Accepting: nothing was described to the peer yet, and no room knows it.
  reason_ = std::move(reason);
  code_ = errc::peer_incompatible;
  phase_ = phase::ended;
  return {send_refusal{reason_}, release{reason_}, quit{}};
}

void machine::finish_if_idle(effects& out) {
  if (phase_ != phase::closing || registering_ || inserting_) return;
  if (made_) {
    phase_ = phase::fencing;
    out.push_back(fence{});
    return;
  }
  // The peer was given nothing to write into (this daemon only sends to it): tell the rooms
  // now. The Scheduler removes a peer that was ready, after them; one still in its handshake is
  // removed here.
  if (inserted_ && !was_ready_) out.push_back(remove_address{});
  out.push_back(report_down{false, was_ready_, unresponsive_});
  out.push_back(quit{});
  phase_ = phase::ended;
}

beat_step heartbeat_tick(int64_t now, int64_t due, int64_t last_heard, int64_t& next_beat,
                         uint32_t heartbeat_ms, uint32_t misses) {
  beat_step s;
  s.silent_ms = now - last_heard;
  if (due > 0 && now - due > int64_t{heartbeat_ms}) {
    s.own_stall = true;
    s.send = true;
    next_beat = now + heartbeat_ms;
    s.wake_in_ms = std::max<int64_t>(1, heartbeat_ms);
    return s;
  }
  const int64_t bound = int64_t{heartbeat_ms} * misses;
  if (s.silent_ms > bound) {
    s.dead = true;
    return s;
  }
  if (now >= next_beat) {
    s.send = true;
    next_beat = now + heartbeat_ms;
  }
  const int64_t deadline = last_heard + bound + 1;
  s.wake_in_ms = std::max<int64_t>(1, std::min(next_beat, deadline) - now);
  return s;
}

}  // namespace ferry::handshake
