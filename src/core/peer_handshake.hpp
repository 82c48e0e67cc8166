#pragma once
/// A peer connection's handshake and its end, as a pure state machine: its inputs are events
/// (a dial's outcome, the peer's hello checked, an engine call answered, a refusal, a loss, the
/// deadline), its outputs are effects (dial, register memory, send our hello, become ready,
/// fence the peer, tell the rooms, end the actor). The Connection actor (actors/connection.cpp)
/// turns messages into events, carries out the effects, and holds what the effects need (the
/// hellos, nonces, registrations, queued room messages); it checks hellos and proofs with the
/// pure functions of actors/peer_hello.hpp and core/auth.hpp and hands the verdict here.
///
/// Connecting side (this daemon dials a peer for one of its rooms):
///   created -> registering -> dialing -> awaiting_hello -> inserting -> ready
///   - registering: our memory is described (registered for the peer when we receive writes);
///     its keys go into our hello.
///   - dialing: the peer gate runs Ferry's preamble, which opens the peer channel; a dial reset
///     in the middle of it (a flood may evict it) is retried, `max_dials` in all, with doubling
///     delays.
///   - awaiting_hello: our hello is sent; the peer answers with its own (or a refusal).
///   - inserting: the peer's fabric address is added; then (with a cluster secret) our proof is
///     sent, and the connection is ready.
/// Accepting side (a peer's hello arrived at our Scheduler):
///   checking -> inserting -> registering -> [awaiting_auth] -> ready
///   A hello refused at any of these steps is answered with the reason, and what was made for
///   the peer is released at once (it never saw our keys): no room knows the peer yet.
/// Ending, from any phase before `closing`: the connection closes once, with the first reason.
///   - closing: engine calls still outstanding are waited for (what they made belongs to the
///     fence: the peer may hold those keys already).
///   - fencing: the peer's registrations are closed and its fabric connection cut in one engine
///     step; only then are the rooms told (a room that fails hands its pages back, and no byte
///     of the peer may land in them afterwards). Without registrations nothing is fenced: the
///     rooms are told at once.
///   - ended: the actor quits.
///
/// The table of every (side, phase, event) triple is tests/core/test_peer_handshake.cpp.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/errors.hpp"
#include "core/inspect.hpp"

namespace ferry::handshake {

enum class side : uint8_t { connecting, accepting };

enum class phase : uint8_t {
  created,   ///< connecting, before `start`
  checking,  ///< accepting: the peer's hello is being checked
  registering,
  dialing,
  awaiting_hello,
  inserting,
  awaiting_auth,
  ready,
  closing,
  fencing,
  ended,
};
const char* to_string(phase p);

/// A peer gate dial's outcome.
enum class dial_outcome : uint8_t {
  connected,  ///< through the preamble; the socket is ours
  reset,      ///< reset in the middle of the preamble (perhaps evicted by a flood): retry
  failed,
};

/// Dials at most, and the delay before the first redial (doubling after each).
inline constexpr int max_dials = 6;
inline constexpr uint32_t first_redial_ms = 20;

// The events, fed one at a time to `machine::on` (core/inspect.hpp: each a name and its fields).
namespace ev {
/// Connecting side: register, then dial.
struct start {
  static constexpr std::string_view name = "start";
};
/// The peer's hello, checked (versions, roles, layouts, regions; with a secret, its proof).
struct hello {
  static constexpr std::string_view name = "hello";
  result<> checked;
};
/// An outstanding `register_memory` answered; `made`: registrations exist for this peer alone
/// (they are then fenced at the end).
struct registered {
  static constexpr std::string_view name = "registered";
  result<> described;
  bool made = false;
};
struct dialed {
  static constexpr std::string_view name = "dialed";
  dial_outcome outcome = dial_outcome::failed;
  std::string error;
};
struct redial {
  static constexpr std::string_view name = "redial";
};
struct inserted {
  static constexpr std::string_view name = "inserted";
  result<> outcome;
};
/// Accepting side: the peer's proof of the cluster secret, checked.
struct authenticated {
  static constexpr std::string_view name = "authenticated";
  bool proof_ok = false;
};
/// The peer refused the handshake.
struct refused {
  static constexpr std::string_view name = "refused";
  std::string reason;
};
/// The connection cannot go on: the peer went down, was declared unusable or dead, restarted, or
/// a room asked for the fence. peer_lost once ready, peer_unreachable before.
struct lost {
  static constexpr std::string_view name = "lost";
  std::string reason;
  bool unresponsive = false;
};
/// The handshake deadline (timeouts.handshake_ms) passed.
struct deadline {
  static constexpr std::string_view name = "deadline";
  uint32_t ms = 0;
};
/// The fence is complete.
struct fenced {
  static constexpr std::string_view name = "fenced";
};

inline void inspect(auto&, start&) {}
inline void inspect(auto& f, hello& x) { f("checked", x.checked); }
inline void inspect(auto& f, registered& x) { f("described", x.described)("made", x.made); }
inline void inspect(auto& f, dialed& x) { f("outcome", x.outcome)("error", x.error); }
inline void inspect(auto&, redial&) {}
inline void inspect(auto& f, inserted& x) { f("outcome", x.outcome); }
inline void inspect(auto& f, authenticated& x) { f("proof_ok", x.proof_ok); }
inline void inspect(auto& f, refused& x) { f("reason", x.reason); }
inline void inspect(auto& f, lost& x) { f("reason", x.reason)("unresponsive", x.unresponsive); }
inline void inspect(auto& f, deadline& x) { f("ms", x.ms); }
inline void inspect(auto&, fenced&) {}
}  // namespace ev

using event =
    std::variant<ev::start, ev::hello, ev::registered, ev::dialed, ev::redial, ev::inserted,
                 ev::authenticated, ev::refused, ev::lost, ev::deadline, ev::fenced>;

// The effects, carried out in the order given.
/// Register memory for the peer; answered by `registered`.
struct register_memory {
  static constexpr std::string_view name = "register_memory";
};
/// Add the peer's fabric address; answered by `inserted`.
struct insert_address {
  static constexpr std::string_view name = "insert_address";
};
/// Dial the peer; answered by `dialed`.
struct dial {
  static constexpr std::string_view name = "dial";
};
/// Wait `ms`, then `redial`.
struct redial_after {
  static constexpr std::string_view name = "redial_after";
  uint32_t ms;
  int dials;  ///< made so far
  std::string error;
};
/// Our hello. Connecting: to the peer's Scheduler; accepting: the answer.
struct send_hello {
  static constexpr std::string_view name = "send_hello";
};
/// Connecting, with a cluster secret: our proof (peer_auth).
struct send_proof {
  static constexpr std::string_view name = "send_proof";
};
struct send_refusal {
  static constexpr std::string_view name = "send_refusal";
  std::string reason;
};
/// What was made so far, for the Scheduler's fallback fence.
struct report_resources {
  static constexpr std::string_view name = "report_resources";
};
struct become_ready {
  static constexpr std::string_view name = "become_ready";
};
/// The connection is over: answer pending lookups with this, say it in the log.
struct closing_with {
  static constexpr std::string_view name = "closing_with";
  std::string reason;
  errc code;
};
/// Accepting side, hello refused: close what was made for the peer now and tell the Scheduler
/// nothing of it remains.
struct release {
  static constexpr std::string_view name = "release";
  std::string reason;
};
/// Close the peer's registrations and cut it; answered by `fenced`.
struct fence {
  static constexpr std::string_view name = "fence";
};
/// Remove the address of a peer that never became ready.
struct remove_address {
  static constexpr std::string_view name = "remove_address";
};
/// Tell the Scheduler (and so the rooms) the connection is over, with `closing_with`'s reason.
struct report_down {
  static constexpr std::string_view name = "report_down";
  bool cut;           ///< the fence cut the peer already
  bool was_ready;     ///< false: the connect or the handshake failed
  bool unresponsive;  ///< declared dead by the heartbeat
};
struct quit {
  static constexpr std::string_view name = "quit";
};

inline void inspect(auto&, register_memory&) {}
inline void inspect(auto&, insert_address&) {}
inline void inspect(auto&, dial&) {}
inline void inspect(auto& f, redial_after& x) { f("ms", x.ms)("dials", x.dials)("error", x.error); }
inline void inspect(auto&, send_hello&) {}
inline void inspect(auto&, send_proof&) {}
inline void inspect(auto& f, send_refusal& x) { f("reason", x.reason); }
inline void inspect(auto&, report_resources&) {}
inline void inspect(auto&, become_ready&) {}
inline void inspect(auto& f, closing_with& x) { f("reason", x.reason)("code", x.code); }
inline void inspect(auto& f, release& x) { f("reason", x.reason); }
inline void inspect(auto&, fence&) {}
inline void inspect(auto&, remove_address&) {}
inline void inspect(auto& f, report_down& x) {
  f("cut", x.cut)("was_ready", x.was_ready)("unresponsive", x.unresponsive);
}
inline void inspect(auto&, quit&) {}

using effect = std::variant<register_memory, insert_address, dial, redial_after, send_hello,
                            send_proof, send_refusal, report_resources, become_ready, closing_with,
                            release, fence, remove_address, report_down, quit>;
using effects = std::vector<effect>;

/// What a peer sends over the channel that the handshake decides about (`machine::unexpected`).
enum class inbound : uint8_t { hello, proof, room_message };

class machine {
 public:
  /// `address`: the peer, for reasons; `secret`: a cluster secret is configured (the accepting
  /// side then waits for the peer's proof).
  machine(side s, std::string address, bool secret);

  /// Feed the machine one event: what it asks of its actor, in order.
  effects on(event e);

  /// Whether the peer may send `what` over the channel now: nothing, or why not (the actor then
  /// ends the connection with it, as `lost`). A hello is answered once, on the connecting side
  /// (the accepting side's first hello is the one it was made for); a proof only when asked
  /// for; room messages only once ready.
  std::optional<std::string> unexpected(inbound what) const;

  side which() const { return side_; }
  phase at() const { return phase_; }
  bool ready() const { return phase_ == phase::ready; }
  /// Over: nothing but outstanding engine answers and the fence matter any more.
  bool closed() const { return phase_ >= phase::closing; }
  /// Engine calls (a registration, an insertion) not yet answered.
  int engine_calls() const { return int{registering_} + int{inserting_}; }
  int dials() const { return dials_; }
  const std::string& reason() const { return reason_; }
  /// The connection was declared dead by the heartbeat (not closed by the peer).
  bool unresponsive() const { return unresponsive_; }
  errc code() const { return code_; }

 private:
  effects handle(ev::start);
  effects handle(ev::hello e);
  effects handle(ev::registered e);
  effects handle(ev::dialed e);
  effects handle(ev::redial);
  effects handle(ev::inserted e);
  effects handle(ev::authenticated e);
  effects handle(ev::refused e);
  effects handle(ev::lost e);
  effects handle(ev::deadline e);
  effects handle(ev::fenced);
  effects close_with(std::string reason, errc code, bool unresponsive = false);
  effects refuse(std::string reason);  ///< accepting side's refusal, or the connecting side's
  void finish_if_idle(effects& out);

  side side_;
  std::string address_;
  bool secret_;
  phase phase_;
  bool registering_ = false;  ///< a `register_memory` is not answered yet
  bool inserting_ = false;    ///< an `insert_address` is not answered yet
  int dials_ = 0;
  bool redial_pending_ = false;
  bool made_ = false;      ///< registrations made for this peer (the fence closes them)
  bool inserted_ = false;  ///< its fabric address is in the address vector
  bool was_ready_ = false;
  bool unresponsive_ = false;
  std::string reason_;
  errc code_ = errc::ok;
};

/// What a Connection's heartbeat tick does (timeouts.heartbeat_ms, heartbeat_misses): declare
/// the peer dead, send a heartbeat, and when to wake next.
struct beat_step {
  bool dead = false;
  int64_t silent_ms = 0;  ///< how long nothing was heard
  bool send = false;
  int64_t wake_in_ms = 1;  ///< at least 1
  bool own_stall = false;  ///< this tick ran over a period late: it judged nothing
};
/// Times are milliseconds on one steady clock. The wake is the next heartbeat, or just after the
/// silence would exceed the bound if that is sooner, so a silent peer is declared dead within the
/// bound, not up to a period later. `next_beat` moves when a heartbeat is sent.
///
/// `due` is when this tick was meant to run (0: unknown). A tick more than a period late means
/// this process was not running (stopped, paused by a hypervisor, starved): the silence it
/// measures is its own, and the peer's messages may be waiting unread behind it. Such a tick
/// declares nothing; it beats and looks again a period later, when what had arrived meanwhile
/// has been read. A peer really gone is then declared dead one period later than otherwise; the
/// caller passes `due` 0 to the tick after a stalled one, so the deferral never repeats.
beat_step heartbeat_tick(int64_t now, int64_t due, int64_t last_heard, int64_t& next_beat,
                         uint32_t heartbeat_ms, uint32_t misses);

}  // namespace ferry::handshake
