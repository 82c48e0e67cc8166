// core/receiver_room.hpp: every (phase, event) pair of a decode room, table-driven; a test
// enumerates the pairs so one without its row fails. The room is a TP1 decode rank receiving
// from two named prefill ranks (TP2), both needed; the tests after the table cover selection,
// staging, the commit rule and the drain.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "core/receiver_room.hpp"

using namespace ferry;
using namespace ferry::receiver;

namespace {

constexpr lifecycle_limits limits{100, 200, 300, 1000, 50};

rank_schema schema(uint32_t tp_size, uint32_t tp_rank) {
  rank_schema s;
  s.tp_size = tp_size;
  s.tp_rank = tp_rank;
  return s;
}

/// Applies effects the way the actor does: one live deadline per kind, by generation.
struct harness {
  room m;
  std::map<deadline_kind, uint64_t> live;
  std::string last_reason;  ///< of the last report
  bool last_wait = true;    ///< of the last reserve_staging

  explicit harness(uint64_t staging = 0, bool checks = false)
      : m(7, limits, schema(1, 0), {"p0:7401", "p1:7401"}, 100, 2, staging, checks) {}

  std::string apply(const effects& fx) {
    std::string s;
    auto add = [&](const std::string& n) { s += (s.empty() ? "" : " ") + n; };
    for (const auto& e : fx)
      std::visit(
          [&](const auto& x) {
            using E = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<E, reserve_staging>) {
              last_wait = x.wait;
              add("reserve_staging");
            }
            if constexpr (std::is_same_v<E, no_staging>) add("no_staging");
            if constexpr (std::is_same_v<E, send_prepares>) add("send_prepares");
            if constexpr (std::is_same_v<E, grant>) add("grant");
            if constexpr (std::is_same_v<E, tell>) add(x.ok ? "tell_ok" : "tell");
            if constexpr (std::is_same_v<E, failed>) add("failed");
            if constexpr (std::is_same_v<E, unpack>) add("unpack");
            if constexpr (std::is_same_v<E, verify>) add("verify");
            if constexpr (std::is_same_v<E, release_staging>) add("release_staging");
            if constexpr (std::is_same_v<E, fence>) add("fence");
            if constexpr (std::is_same_v<E, life>) {
              for (auto k : x.effects.cancel) REQUIRE(live.erase(k) == 1);
              for (const auto& a : x.effects.arm) live[a.kind] = a.generation;
              if (x.effects.quit) REQUIRE(live.empty());  // an ended room leaves no deadline
              if (x.effects.report) last_reason = x.effects.reason;
              add(x.effects.report ? std::string("report:") + to_string(*x.effects.report)
                                   : "life");
            }
          },
          e);
    return s;
  }
  std::string expire(deadline_kind k) {
    const auto it = live.find(k);
    const uint64_t gen = it == live.end() ? 12345 : it->second;  // not armed: any is stale
    auto fx = m.expired(k, gen);
    if (it != live.end()) live.erase(it);  // it fired, whatever the room made of it
    return apply(fx);
  }
  /// Both named peers resolved: the prepares go out.
  std::string resolve_both(uint64_t unpack_bytes = 0) {
    apply(m.resolved(0, schema(2, 0), unpack_bytes));
    return apply(m.resolved(1, schema(2, 1), unpack_bytes));
  }
};

enum class ev {
  resolved,
  unusable,
  staging_reserved,
  staging_freed,
  staging_declined,
  ack_ok,
  ack_refused,
  ack_stale,
  announce,
  outcome_failed,
  outcome_ok,
  drained,
  landed,
  unpacked,
  cancel,
  peer_down_fenced,
  peer_down_unfenced,
  expire_state,
  expire_drain,
  staging_requested,
  verified,
};
constexpr ev all_events[] = {ev::resolved,         ev::unusable,           ev::staging_reserved,
                             ev::staging_freed,    ev::staging_declined,   ev::ack_ok,
                             ev::ack_refused,      ev::ack_stale,          ev::announce,
                             ev::outcome_failed,   ev::outcome_ok,         ev::drained,
                             ev::landed,           ev::unpacked,           ev::cancel,
                             ev::peer_down_fenced, ev::peer_down_unfenced, ev::expire_state,
                             ev::expire_drain,     ev::staging_requested,  ev::verified};
const char* name(ev e) {
  static const char* names[] = {"resolved",         "unusable",           "staging_reserved",
                                "staging_freed",    "staging_declined",   "ack_ok",
                                "ack_refused",      "ack_stale",          "announce",
                                "outcome_failed",   "outcome_ok",         "drained",
                                "landed",           "unpacked",           "cancel",
                                "peer_down_fenced", "peer_down_unfenced", "expire_state",
                                "expire_drain",     "staging_requested",  "verified"};
  return names[static_cast<int>(e)];
}
constexpr room_phase all_phases[] = {room_phase::bootstrapping, room_phase::waiting_for_input,
                                     room_phase::transferring,  room_phase::draining,
                                     room_phase::success,       room_phase::failed};

/// A room brought into `p` the way rooms get there:
/// - bootstrapping: both peers resolved, the prepares sent, rank 0 accepted;
/// - waiting_for_input: rank 1 accepted too;
/// - transferring: one write of rank 0 landed;
/// - draining: cancelled there (nothing drained yet);
/// - success: rank 0 announced 1 write, rank 1 none: complete;
/// - failed: cancelled before any peer was resolved (nothing was prepared).
void bring_to(harness& h, room_phase p) {
  h.apply(h.m.start());
  if (p == room_phase::failed) {
    h.apply(h.m.cancel("cancelled by test"));
  } else {
    REQUIRE(h.resolve_both() == "send_prepares");
    h.apply(h.m.prepare_ack(0, 100, true, errc::ok, ""));
    if (p != room_phase::bootstrapping) {
      h.apply(h.m.prepare_ack(1, 101, true, errc::ok, ""));
      if (p != room_phase::waiting_for_input) {
        h.apply(h.m.landed(100, 1));
        if (p == room_phase::draining) h.apply(h.m.cancel("cancelled by test"));
        if (p == room_phase::success) {
          h.apply(h.m.announce(0, 100, 1, 10));
          h.apply(h.m.announce(1, 101, 0, 0));
        }
      }
    }
  }
  REQUIRE(std::string(to_string(h.m.phase())) == to_string(p));
}

std::string run(harness& h, ev e) {
  switch (e) {
    case ev::resolved:
      return h.apply(h.m.resolved(0, schema(2, 0), 0));
    case ev::unusable:
      return h.apply(h.m.unusable(0, errc::peer_unreachable, "could not use peer p0:7401"));
    case ev::staging_reserved:
      return h.apply(h.m.staging_reserved(5));
    case ev::staging_freed:
      return h.apply(h.m.staging_freed());
    case ev::staging_declined:
      return h.apply(h.m.staging_declined());
    case ev::ack_ok:
      return h.apply(h.m.prepare_ack(1, 101, true, errc::ok, ""));
    case ev::ack_refused:
      return h.apply(h.m.prepare_ack(1, 101, false, errc::invalid_request, "no such pages"));
    case ev::ack_stale:
      return h.apply(h.m.prepare_ack(1, 999, false, errc::invalid_request, "old"));
    case ev::announce:
      return h.apply(h.m.announce(0, 100, 1, 10));
    case ev::outcome_failed:
      return h.apply(h.m.outcome(0, 100, false, errc::peer_lost, "its client left"));
    case ev::outcome_ok:
      return h.apply(h.m.outcome(0, 100, true, errc::ok, ""));
    case ev::drained:
      return h.apply(h.m.drained(0, 100, 1));
    case ev::landed:
      return h.apply(h.m.landed(100, 1));
    case ev::unpacked:
      return h.apply(h.m.unpacked());
    case ev::cancel:
      return h.apply(h.m.cancel("cancelled by the client"));
    case ev::peer_down_fenced:
      return h.apply(h.m.peer_down(0, true, errc::peer_lost, "peer p0:7401 lost"));
    case ev::peer_down_unfenced:
      return h.apply(h.m.peer_down(1, false, errc::peer_lost, "peer p1:7401 lost"));
    case ev::expire_state:
      return h.expire(deadline_kind::state);
    case ev::expire_drain:
      return h.expire(deadline_kind::drain);
    case ev::staging_requested:  // its prepare did not say so: ignored
      return h.apply(h.m.staging_requested(0, 100));
    case ev::verified:  // a room that does not check never asked: ignored
      return h.apply(h.m.verified(errc::checksum_mismatch, "kv buffer 0 (K, layer 3): ..."));
  }
  return "?";
}

using P = room_phase;
struct row {
  room_phase phase;
  ev e;
  room_phase next;
  const char* fx;
};

// Failing once the prepares went out: the ranks are told, the state and room deadlines are
// cancelled, the drain's armed, and Failed waits for the drain.
constexpr const char* drains = "failed tell life";

// clang-format off
const row table[] = {
  // Bootstrapping: prepares sent, rank 0 accepted.
  {P::bootstrapping, ev::resolved,           P::bootstrapping, ""},
  {P::bootstrapping, ev::unusable,           P::bootstrapping, ""},  // resolved already
  {P::bootstrapping, ev::staging_reserved,   P::bootstrapping, "release_staging"},  // not asked
  {P::bootstrapping, ev::staging_freed,      P::bootstrapping, ""},
  {P::bootstrapping, ev::staging_declined,   P::bootstrapping, ""},  // not asked
  {P::bootstrapping, ev::ack_ok,             P::waiting_for_input, "report:WaitingForInput"},
  {P::bootstrapping, ev::ack_refused,        P::draining, drains},
  {P::bootstrapping, ev::ack_stale,          P::bootstrapping, ""},
  {P::bootstrapping, ev::announce,           P::transferring, "report:Transferring"},
  {P::bootstrapping, ev::outcome_failed,     P::draining, drains},
  {P::bootstrapping, ev::outcome_ok,         P::bootstrapping, ""},
  {P::bootstrapping, ev::drained,            P::draining, drains},
  {P::bootstrapping, ev::landed,             P::transferring, "report:Transferring"},
  {P::bootstrapping, ev::unpacked,           P::bootstrapping, ""},
  {P::bootstrapping, ev::cancel,             P::draining, drains},
  {P::bootstrapping, ev::peer_down_fenced,   P::draining, drains},
  {P::bootstrapping, ev::peer_down_unfenced, P::draining, drains},
  {P::bootstrapping, ev::expire_state,       P::draining, drains},
  {P::bootstrapping, ev::expire_drain,       P::bootstrapping, ""},
  {P::bootstrapping, ev::staging_requested,  P::bootstrapping, ""},
  {P::bootstrapping, ev::verified,           P::bootstrapping, ""},
  // WaitingForInput: both accepted.
  {P::waiting_for_input, ev::resolved,           P::waiting_for_input, ""},
  {P::waiting_for_input, ev::unusable,           P::waiting_for_input, ""},
  {P::waiting_for_input, ev::staging_reserved,   P::waiting_for_input, "release_staging"},
  {P::waiting_for_input, ev::staging_freed,      P::waiting_for_input, ""},
  {P::waiting_for_input, ev::staging_declined,   P::waiting_for_input, ""},  // not asked
  {P::waiting_for_input, ev::ack_ok,             P::waiting_for_input, ""},
  {P::waiting_for_input, ev::ack_refused,        P::draining, drains},
  {P::waiting_for_input, ev::ack_stale,          P::waiting_for_input, ""},
  {P::waiting_for_input, ev::announce,           P::transferring, "report:Transferring"},
  {P::waiting_for_input, ev::outcome_failed,     P::draining, drains},
  {P::waiting_for_input, ev::outcome_ok,         P::waiting_for_input, ""},
  {P::waiting_for_input, ev::drained,            P::draining, drains},
  {P::waiting_for_input, ev::landed,             P::transferring, "report:Transferring"},
  {P::waiting_for_input, ev::unpacked,           P::waiting_for_input, ""},
  {P::waiting_for_input, ev::cancel,             P::draining, drains},
  {P::waiting_for_input, ev::peer_down_fenced,   P::draining, drains},
  {P::waiting_for_input, ev::peer_down_unfenced, P::draining, drains},
  {P::waiting_for_input, ev::expire_state,       P::draining, drains},
  {P::waiting_for_input, ev::expire_drain,       P::waiting_for_input, ""},
  {P::waiting_for_input, ev::staging_requested,  P::waiting_for_input, ""},
  {P::waiting_for_input, ev::verified,           P::waiting_for_input, ""},
  // Transferring: one write of rank 0 landed, nothing announced.
  {P::transferring, ev::resolved,           P::transferring, ""},
  {P::transferring, ev::unusable,           P::transferring, ""},
  {P::transferring, ev::staging_reserved,   P::transferring, "release_staging"},
  {P::transferring, ev::staging_freed,      P::transferring, ""},
  {P::transferring, ev::staging_declined,   P::transferring, ""},  // not asked
  {P::transferring, ev::ack_ok,             P::transferring, ""},
  {P::transferring, ev::ack_refused,        P::draining, drains},
  {P::transferring, ev::ack_stale,          P::transferring, ""},
  {P::transferring, ev::announce,           P::transferring, ""},  // rank 1 has not announced
  {P::transferring, ev::outcome_failed,     P::draining, drains},
  {P::transferring, ev::outcome_ok,         P::transferring, ""},
  {P::transferring, ev::drained,            P::draining, drains},
  {P::transferring, ev::landed,             P::transferring, ""},
  {P::transferring, ev::unpacked,           P::transferring, ""},
  {P::transferring, ev::cancel,             P::draining, drains},
  {P::transferring, ev::peer_down_fenced,   P::draining, drains},
  {P::transferring, ev::peer_down_unfenced, P::draining, drains},
  {P::transferring, ev::expire_state,       P::draining, drains},
  {P::transferring, ev::expire_drain,       P::transferring, ""},
  {P::transferring, ev::staging_requested,  P::transferring, ""},
  {P::transferring, ev::verified,           P::transferring, ""},
  // Draining: neither rank drained, refused or was fenced; one of the two settling is not enough.
  {P::draining, ev::resolved,           P::draining, ""},
  {P::draining, ev::unusable,           P::draining, ""},
  {P::draining, ev::staging_reserved,   P::draining, "release_staging"},
  {P::draining, ev::staging_freed,      P::draining, ""},
  {P::draining, ev::staging_declined,   P::draining, ""},  // not asked
  {P::draining, ev::ack_ok,             P::draining, ""},
  {P::draining, ev::ack_refused,        P::draining, ""},
  {P::draining, ev::ack_stale,          P::draining, ""},
  {P::draining, ev::announce,           P::draining, ""},
  {P::draining, ev::outcome_failed,     P::draining, ""},
  {P::draining, ev::outcome_ok,         P::draining, ""},
  {P::draining, ev::drained,            P::draining, ""},
  {P::draining, ev::landed,             P::draining, ""},
  {P::draining, ev::unpacked,           P::draining, ""},
  {P::draining, ev::cancel,             P::draining, ""},
  {P::draining, ev::peer_down_fenced,   P::draining, ""},
  {P::draining, ev::peer_down_unfenced, P::draining, ""},
  {P::draining, ev::expire_state,       P::draining, ""},  // cancelled by the failure
  {P::draining, ev::expire_drain,       P::draining, "fence fence"},  // the fences complete it
  {P::draining, ev::staging_requested,  P::draining, ""},
  {P::draining, ev::verified,           P::draining, ""},
  // Terminal.
  {P::success, ev::resolved,           P::success, ""},
  {P::success, ev::unusable,           P::success, ""},
  {P::success, ev::staging_reserved,   P::success, "release_staging"},
  {P::success, ev::staging_freed,      P::success, ""},
  {P::success, ev::staging_declined,   P::success, ""},  // not asked
  {P::success, ev::ack_ok,             P::success, ""},
  {P::success, ev::ack_refused,        P::success, ""},
  {P::success, ev::ack_stale,          P::success, ""},
  {P::success, ev::announce,           P::success, ""},
  {P::success, ev::outcome_failed,     P::success, ""},
  {P::success, ev::outcome_ok,         P::success, ""},
  {P::success, ev::drained,            P::success, ""},
  {P::success, ev::landed,             P::success, ""},
  {P::success, ev::unpacked,           P::success, ""},
  {P::success, ev::cancel,             P::success, ""},
  {P::success, ev::peer_down_fenced,   P::success, ""},
  {P::success, ev::peer_down_unfenced, P::success, ""},
  {P::success, ev::expire_state,       P::success, ""},
  {P::success, ev::expire_drain,       P::success, ""},
  {P::success, ev::staging_requested,  P::success, ""},
  {P::success, ev::verified,           P::success, ""},
  {P::failed, ev::resolved,           P::failed, ""},
  {P::failed, ev::unusable,           P::failed, ""},
  {P::failed, ev::staging_reserved,   P::failed, "release_staging"},
  {P::failed, ev::staging_freed,      P::failed, ""},
  {P::failed, ev::staging_declined,   P::failed, ""},  // not asked
  {P::failed, ev::ack_ok,             P::failed, ""},
  {P::failed, ev::ack_refused,        P::failed, ""},
  {P::failed, ev::ack_stale,          P::failed, ""},
  {P::failed, ev::announce,           P::failed, ""},
  {P::failed, ev::outcome_failed,     P::failed, ""},
  {P::failed, ev::outcome_ok,         P::failed, ""},
  {P::failed, ev::drained,            P::failed, ""},
  {P::failed, ev::landed,             P::failed, ""},
  {P::failed, ev::unpacked,           P::failed, ""},
  {P::failed, ev::cancel,             P::failed, ""},
  {P::failed, ev::peer_down_fenced,   P::failed, ""},
  {P::failed, ev::peer_down_unfenced, P::failed, ""},
  {P::failed, ev::expire_state,       P::failed, ""},
  {P::failed, ev::expire_drain,       P::failed, ""},
  {P::failed, ev::staging_requested,  P::failed, ""},
  {P::failed, ev::verified,           P::failed, ""},
};
// clang-format on

}  // namespace

TEST_CASE("receiver room: the table has a row for every (phase, event) pair",
          "[unit][receiver_room]") {
  std::set<std::pair<room_phase, ev>> seen;
  for (const auto& r : table) REQUIRE(seen.insert({r.phase, r.e}).second);  // each once
  for (auto p : all_phases)
    for (auto e : all_events) {
      INFO(to_string(p) << " x " << name(e));
      CHECK(seen.count({p, e}) == 1);
    }
}

TEST_CASE("receiver room: every (phase, event) pair does what its row says",
          "[unit][receiver_room]") {
  for (const auto& r : table) {
    INFO(to_string(r.phase) << " x " << name(r.e));
    harness h;
    bring_to(h, r.phase);
    CHECK(run(h, r.e) == r.fx);
    CHECK(std::string(to_string(h.m.phase())) == to_string(r.next));
    if (h.m.lifecycle().terminal()) CHECK(h.live.empty());
  }
}

TEST_CASE(
    "receiver room: the prepares wait for every named peer, and a needed one that cannot "
    "be used fails the room naming it",
    "[unit][receiver_room]") {
  harness h;
  h.apply(h.m.start());
  CHECK(h.apply(h.m.resolved(0, schema(2, 0), 0)) == "");  // one of two
  CHECK(h.apply(h.m.unusable(1, errc::peer_unreachable,
                             "could not use peer p1:7401: cannot connect to p1:7401: refused")) ==
        "failed life report:Failed");  // nothing was prepared: Failed at once
  CHECK(h.m.lifecycle().fail_code() == errc::peer_unreachable);
  CHECK_THAT(h.last_reason, Catch::EndsWith("(could not use peer p1:7401: cannot connect to "
                                            "p1:7401: refused)"));

  harness d;
  d.apply(d.m.start());
  d.apply(d.m.resolved(0, schema(2, 0), 0));
  // Before selection, a peer that goes down is out, even if it had resolved.
  CHECK(d.apply(d.m.peer_down(0, false, errc::peer_lost, "peer p0:7401 lost")) == "");
  CHECK(d.apply(d.m.resolved(1, schema(2, 1), 0)) == "failed life report:Failed");
  CHECK_THAT(d.last_reason, Catch::EndsWith("(peer p0:7401 lost)"));
}

TEST_CASE(
    "receiver room: head-sliced KV reserves staging before the prepares, and is unpacked "
    "before Success",
    "[unit][receiver_room]") {
  SECTION("staging granted at once") {
    harness h(100);
    h.apply(h.m.start());
    CHECK(h.resolve_both(30) == "reserve_staging");
    CHECK_FALSE(h.m.prepared());
    CHECK(h.apply(h.m.staging_reserved(1000)) == "send_prepares");
    REQUIRE(h.m.links().size() == 2);
    CHECK(h.m.links()[0].staging == 1000u);
    CHECK(h.m.links()[1].staging == 1030u);
    h.apply(h.m.prepare_ack(0, 100, true, errc::ok, ""));
    h.apply(h.m.prepare_ack(1, 101, true, errc::ok, ""));
    h.apply(h.m.announce(0, 100, 1, 10));
    h.apply(h.m.announce(1, 101, 1, 10));
    CHECK(h.apply(h.m.landed(100, 1)) == "");
    CHECK(h.apply(h.m.landed(101, 1)) == "unpack");
    CHECK(h.apply(h.m.unpacked()) == "release_staging tell_ok report:Success");
    CHECK(h.m.bytes() == 20);
  }
  SECTION("staging full: the room waits, then asks again") {
    harness h(100);
    h.apply(h.m.start());
    CHECK(h.resolve_both(30) == "reserve_staging");
    CHECK(h.apply(h.m.staging_freed()) == "reserve_staging");
    CHECK(h.apply(h.m.staging_reserved(0)) == "send_prepares");
  }
  SECTION("a block only to scatter into is not waited for: staging full, one write per run") {
    harness h(100);
    h.apply(h.m.start());
    h.apply(h.m.resolved(0, schema(2, 0), 30, true));
    CHECK(h.apply(h.m.resolved(1, schema(2, 1), 30, true)) == "reserve_staging");
    CHECK(h.last_wait == false);
    CHECK(h.apply(h.m.staging_declined()) == "no_staging send_prepares");
    REQUIRE(h.m.links().size() == 2);
    CHECK_FALSE(h.m.links()[0].staging);
    CHECK_FALSE(h.m.links()[1].staging);
    CHECK(h.apply(h.m.staging_reserved(7)) == "release_staging");  // late: not ours
  }
  SECTION("a block to scatter into, granted: scattered on commit like an unpack") {
    harness h(100);
    h.apply(h.m.start());
    h.apply(h.m.resolved(0, schema(2, 0), 30, true));
    CHECK(h.apply(h.m.resolved(1, schema(2, 1), 0, true)) == "reserve_staging");
    CHECK(h.apply(h.m.staging_reserved(64)) == "send_prepares");
    CHECK(h.m.links()[0].staging == 64u);
    CHECK_FALSE(h.m.links()[1].staging);
  }
  SECTION("a room that must unpack waits even beside an optional block") {
    harness h(100);
    h.apply(h.m.start());
    h.apply(h.m.resolved(0, schema(2, 0), 30, false));
    CHECK(h.apply(h.m.resolved(1, schema(2, 1), 30, true)) == "reserve_staging");
    CHECK(h.last_wait == true);
    CHECK(h.apply(h.m.staging_declined()) == "reserve_staging");  // asked again, waiting
    CHECK(h.apply(h.m.staging_reserved(0)) == "send_prepares");
  }
  SECTION("too large for the whole area: one write per token, no staging") {
    harness h(50);
    h.apply(h.m.start());
    CHECK(h.resolve_both(30) == "no_staging send_prepares");
  }
  SECTION("a failure while waiting for staging: nothing was prepared, Failed at once") {
    harness h(100);
    h.apply(h.m.start());
    h.resolve_both(30);
    CHECK(h.apply(h.m.cancel("cancelled")) == "failed life report:Failed");
    CHECK(h.apply(h.m.staging_freed()) == "");
  }
}

TEST_CASE(
    "receiver room: with peers that ask, staging is reserved when the first rank's writes are "
    "about to start, and each rank that asked is granted its offset",
    "[unit][receiver_room]") {
  auto ask_both = [](harness& h, uint64_t bytes, bool optional = false) {
    h.apply(h.m.start());
    h.apply(h.m.resolved(0, schema(2, 0), bytes, optional, true));
    return h.apply(h.m.resolved(1, schema(2, 1), bytes, optional, true));
  };
  SECTION("granted at once, then unpacked before Success") {
    harness h(100);
    CHECK(ask_both(h, 30) == "send_prepares");  // nothing reserved yet
    CHECK(h.m.staging_on_request());
    REQUIRE(h.m.links().size() == 2);
    CHECK(h.m.links()[0].on_request);
    CHECK_FALSE(h.m.links()[0].staging);
    h.apply(h.m.prepare_ack(0, 100, true, errc::ok, ""));
    CHECK(h.apply(h.m.prepare_ack(1, 101, true, errc::ok, "")) == "report:WaitingForInput");
    CHECK(h.apply(h.m.staging_requested(0, 100)) == "reserve_staging");
    CHECK(h.last_wait);
    CHECK(h.apply(h.m.staging_reserved(1000)) == "grant");  // rank 0 only: rank 1 has not asked
    CHECK(h.m.links()[0].staging == 1000u);
    CHECK(h.m.links()[1].staging == 1030u);
    CHECK(h.apply(h.m.staging_requested(1, 101)) == "grant");
    CHECK(h.apply(h.m.staging_requested(1, 101)) == "");  // once
    CHECK(h.apply(h.m.staging_requested(1, 999)) == "");  // not this incarnation
    h.apply(h.m.announce(0, 100, 1, 10));
    h.apply(h.m.announce(1, 101, 1, 10));
    h.apply(h.m.landed(100, 1));
    CHECK(h.apply(h.m.landed(101, 1)) == "unpack");
    CHECK(h.apply(h.m.unpacked()) == "release_staging tell_ok report:Success");
  }
  SECTION("staging full: the room waits in WaitingForInput, bounded by its deadline") {
    harness h(100);
    ask_both(h, 30);
    h.apply(h.m.prepare_ack(0, 100, true, errc::ok, ""));
    h.apply(h.m.prepare_ack(1, 101, true, errc::ok, ""));
    h.apply(h.m.staging_requested(0, 100));
    CHECK(h.m.waiting_for_staging());
    CHECK(h.apply(h.m.staging_requested(1, 101)) == "");  // the one reservation covers it
    CHECK(h.apply(h.m.staging_freed()) == "reserve_staging");
    CHECK(h.expire(deadline_kind::state) == "failed tell life");
    CHECK_THAT(h.m.lifecycle().fail_reason(),
               Catch::StartsWith("timed out in WaitingForInput after 200 ms") &&
                   Catch::EndsWith("; waiting for 60 bytes of staging)"));
    CHECK(h.apply(h.m.staging_reserved(0)) == "release_staging");  // too late: given back
  }
  SECTION("a block only to scatter into, staging full: every rank that asks writes directly") {
    harness h(100);
    ask_both(h, 30, true);
    CHECK(h.apply(h.m.staging_requested(0, 100)) == "reserve_staging");
    CHECK_FALSE(h.last_wait);
    CHECK(h.apply(h.m.staging_declined()) == "no_staging grant");
    CHECK_FALSE(h.m.links()[0].staging);
    CHECK(h.apply(h.m.staging_requested(1, 101)) == "grant");  // none for it either
    h.apply(h.m.announce(0, 100, 0, 0));
    CHECK(h.apply(h.m.announce(1, 101, 0, 0)) == "tell_ok report:Success");  // nothing to unpack
  }
  SECTION("a peer that cannot ask (version 9): reserved before the prepares, as before") {
    harness h(100);
    h.apply(h.m.start());
    h.apply(h.m.resolved(0, schema(2, 0), 30, false, true));
    CHECK(h.apply(h.m.resolved(1, schema(2, 1), 30, false, false)) == "reserve_staging");
    CHECK_FALSE(h.m.staging_on_request());
    CHECK(h.apply(h.m.staging_reserved(0)) == "send_prepares");
    CHECK(h.apply(h.m.staging_requested(0, 100)) == "");  // its prepare carried the offset
  }
  SECTION("a rank that announces without asking fails the room: its block holds no KV of it") {
    harness h(100);
    ask_both(h, 30);
    h.apply(h.m.prepare_ack(0, 100, true, errc::ok, ""));
    h.apply(h.m.prepare_ack(1, 101, true, errc::ok, ""));
    h.apply(h.m.staging_requested(0, 100));
    h.apply(h.m.staging_reserved(0));
    CHECK(h.apply(h.m.announce(1, 101, 1, 10)) == "failed tell life");
    CHECK(h.m.lifecycle().fail_reason() ==
          "prefill p1:7401 announced its writes without asking where its KV lands in staging");
  }
  SECTION("a room that fails while it waits gives the late block back") {
    harness h(100);
    ask_both(h, 30);
    h.apply(h.m.staging_requested(0, 100));
    CHECK(h.apply(h.m.cancel("cancelled")) == "failed tell life");
    CHECK(h.apply(h.m.staging_freed()) == "");
    CHECK(h.apply(h.m.staging_requested(1, 101)) == "");
    CHECK(h.apply(h.m.staging_reserved(64)) == "release_staging");
  }
}

TEST_CASE("receiver room: Success only when the landed writes equal the announced total",
          "[unit][receiver_room]") {
  harness h;
  bring_to(h, room_phase::transferring);  // 1 landed
  h.apply(h.m.announce(0, 100, 1, 10));
  CHECK(h.apply(h.m.announce(0, 100, 1, 10)) == "failed tell life");
  CHECK(h.m.lifecycle().fail_reason() == "prefill p0:7401 announced twice");

  harness o;
  bring_to(o, room_phase::transferring);
  o.apply(o.m.landed(101, 1));
  o.apply(o.m.announce(0, 100, 1, 10));
  CHECK(o.apply(o.m.announce(1, 101, 0, 0)) == "failed tell life");
  CHECK(o.m.lifecycle().fail_reason() == "2 writes landed but the prefill ranks announced 1");
  CHECK(o.m.lifecycle().fail_code() == errc::internal);
}

TEST_CASE(
    "receiver room: Failed only once no write can land, the drain deadline fencing the "
    "ranks still open",
    "[unit][receiver_room]") {
  SECTION("both ranks drain and their completed writes land") {
    harness h;
    bring_to(h, room_phase::draining);
    CHECK(h.apply(h.m.drained(0, 100, 2)) == "");  // 1 of 2 landed
    CHECK(h.apply(h.m.drained(1, 101, 0)) == "");
    CHECK(h.apply(h.m.landed(100, 1)) == "report:Failed");
    CHECK(h.last_reason == "cancelled by test");
  }
  SECTION("the drain deadline fences, and the fences complete the drain") {
    harness h;
    bring_to(h, room_phase::draining);
    h.apply(h.m.drained(0, 100, 3));
    CHECK(h.expire(deadline_kind::drain) == "fence fence");
    CHECK(h.apply(h.m.peer_down(0, true, errc::peer_lost, "fenced")) == "");
    CHECK(h.apply(h.m.peer_down(1, true, errc::peer_lost, "fenced")) == "report:Failed");
    CHECK(h.last_reason ==
          "cancelled by test; drain incomplete after 50 ms (timeouts.drain_ms), fenced: p0:7401 "
          "(1 of 3 drained writes landed), p1:7401 (no drain report)");
  }
  SECTION("a rank that reports failed writes is fenced: its landed writes do not settle it") {
    harness h;
    bring_to(h, room_phase::draining);
    CHECK(h.apply(h.m.drained(0, 100, 1, 2)) == "fence");  // 1 landed already
    CHECK(h.apply(h.m.drained(1, 101, 0)) == "");
    CHECK(h.apply(h.m.landed(100, 5)) == "");  // still open: only the fence settles it
    CHECK(h.m.phase() == room_phase::draining);
    CHECK(h.expire(deadline_kind::drain) == "");  // its fence is on its way already
    CHECK(h.apply(h.m.peer_down(0, true, errc::peer_lost, "fenced")) == "report:Failed");
  }
  SECTION("a peer down that did not fence does not end the drain") {
    harness h;
    bring_to(h, room_phase::draining);
    h.apply(h.m.peer_down(0, false, errc::peer_lost, "down"));
    h.apply(h.m.peer_down(1, false, errc::peer_lost, "down"));
    CHECK(h.m.phase() == room_phase::draining);
  }
}

TEST_CASE("receiver room: reasons say what failed", "[unit][receiver_room]") {
  harness h;
  bring_to(h, room_phase::bootstrapping);
  h.apply(h.m.prepare_ack(1, 101, false, errc::ok, "no such pages"));
  CHECK(h.m.lifecycle().fail_reason() == "prefill p1:7401 refused the prepare: no such pages");
  CHECK(h.m.lifecycle().fail_code() == errc::peer_incompatible);  // a refusal without a code

  harness t;
  bring_to(t, room_phase::transferring);
  t.expire(deadline_kind::state);
  CHECK(t.m.lifecycle().fail_reason() ==
        "timed out in Transferring after 300 ms (waiting for the remaining writes: 1 landed, none "
        "announced)");
  CHECK(t.m.lifecycle().fail_code() == errc::timed_out);

  harness o;
  bring_to(o, room_phase::waiting_for_input);
  o.apply(o.m.outcome(1, 101, false, errc::ok, "boom"));
  CHECK(o.m.lifecycle().fail_reason() == "prefill p1:7401 reported: boom");
  CHECK(o.m.lifecycle().fail_code() == errc::internal);
}

TEST_CASE(
    "receiver room: a failing room's drain counts a rank whose prepare was refused, never one "
    "that had accepted it",
    "[unit][receiver_room]") {
  // Rank 0 accepted; the room is cancelled; rank 1's prepare is then refused (its prefill room
  // ended before it took the prepare). Rank 1 never writes: settled. Rank 0 may still have
  // writes in flight: a refusal that names it again settles nothing; its drain report does.
  harness h;
  h.apply(h.m.start());
  REQUIRE(h.resolve_both() == "send_prepares");
  h.apply(h.m.prepare_ack(0, 100, true, errc::ok, ""));
  CHECK(h.apply(h.m.cancel("cancelled by client")) == "failed tell life");
  CHECK(h.apply(h.m.prepare_ack(1, 101, false, errc::cancelled,
                                "room 7 failed on the prefill before it took this decode's "
                                "prepare: cancelled by client")) == "");
  CHECK(h.m.lifecycle().phase() == room_phase::draining);
  CHECK(h.apply(h.m.prepare_ack(0, 100, false, errc::cancelled, "late")) == "");
  CHECK(h.m.lifecycle().phase() == room_phase::draining);
  CHECK(h.apply(h.m.drained(0, 100, 0)) == "report:Failed");
  CHECK(h.last_reason == "cancelled by client");
}

TEST_CASE(
    "receiver room: a room that checks verifies what landed, after any unpack, before Success",
    "[unit][receiver_room]") {
  auto to_landed = [](harness& h, uint64_t unpack_bytes = 0) {
    h.apply(h.m.start());
    h.resolve_both(unpack_bytes);
    if (unpack_bytes) h.apply(h.m.staging_reserved(0));
    h.apply(h.m.prepare_ack(0, 100, true, errc::ok, ""));
    h.apply(h.m.prepare_ack(1, 101, true, errc::ok, ""));
    h.apply(h.m.announce(0, 100, 1, 10));
    h.apply(h.m.announce(1, 101, 1, 10));
    h.apply(h.m.landed(100, 1));
    return h.apply(h.m.landed(101, 1));
  };
  SECTION("the digests match: Success") {
    harness h(0, true);
    CHECK(to_landed(h) == "verify");
    CHECK(h.m.phase() == room_phase::transferring);
    CHECK(h.apply(h.m.verified(errc::ok, "")) == "tell_ok report:Success");
  }
  SECTION("a digest differs: Failed with checksum_mismatch, the ranks told") {
    harness h(0, true);
    CHECK(to_landed(h) == "verify");
    CHECK(h.apply(h.m.verified(errc::checksum_mismatch, "kv buffer 2 (V, layer 3): ...")) ==
          "failed tell life");
    CHECK(h.m.lifecycle().fail_code() == errc::checksum_mismatch);
    CHECK(h.m.lifecycle().fail_reason() == "kv buffer 2 (V, layer 3): ...");
    // Every write it counted landed; the ranks' drain reports end it.
    h.apply(h.m.drained(0, 100, 1));
    CHECK(h.apply(h.m.drained(1, 101, 1)) == "report:Failed");
  }
  SECTION("KV landed in staging: unpacked first, then verified") {
    harness h(100, true);
    CHECK(to_landed(h, 30) == "unpack");
    CHECK(h.apply(h.m.unpacked()) == "verify");
    CHECK(h.apply(h.m.verified(errc::ok, "")) == "release_staging tell_ok report:Success");
  }
  SECTION("a late verify of a cancelled room does nothing") {
    harness h(0, true);
    CHECK(to_landed(h) == "verify");
    CHECK(h.apply(h.m.cancel("cancelled by client")) == "failed tell life");
    CHECK(h.apply(h.m.verified(errc::ok, "")) == "");
  }
  SECTION("a room that does not check succeeds at once") {
    harness h;
    CHECK(to_landed(h) == "tell_ok report:Success");
  }
}
