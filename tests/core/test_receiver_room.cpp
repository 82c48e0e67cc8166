// core/receiver_room.hpp: every (phase, event) pair of a decode room, table-driven; a test
// enumerates the pairs so one without its row fails. The room is a TP1 decode rank receiving
// from two named prefill ranks (TP2), both needed; the tests after the table cover selection,
// staging, the commit rule and the drain.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "core/receiver_room.hpp"
#include "machine_table.hpp"

// Named, so that the unity build may put this file beside the other machines' tables.
namespace test_receiver_room {
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

/// A TP1 decode room of two named prefill ranks, with its actor's deadlines.
struct harness : test::room_harness<receiver::room, receiver::event, receiver::effects> {
  explicit harness(uint64_t staging = 0, bool checks = false) {
    m = room{7, limits, schema(1, 0), {"p0:7401", "p1:7401"}, 100, 2, staging, checks};
  }
  /// Both named peers resolved: the prepares go out.
  std::string resolve_both(uint64_t unpack_bytes = 0) {
    feed(ev::resolved{0, schema(2, 0), unpack_bytes});
    return feed(ev::resolved{1, schema(2, 1), unpack_bytes});
  }
  /// Whether the last event's reservation waits for staging.
  bool last_wait() const {
    const auto* r = last_of<reserve_staging>();
    REQUIRE(r);
    return r->wait;
  }
};

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
  h.feed(ev::start{});
  if (p == room_phase::failed) {
    h.feed(ev::cancel{"cancelled by test"});
  } else {
    REQUIRE(h.resolve_both() == "send_prepares");
    h.feed(ev::prepare_ack{0, 100, true, errc::ok, ""});
    if (p != room_phase::bootstrapping) {
      h.feed(ev::prepare_ack{1, 101, true, errc::ok, ""});
      if (p != room_phase::waiting_for_input) {
        h.feed(ev::landed{100, 1});
        if (p == room_phase::draining) h.feed(ev::cancel{"cancelled by test"});
        if (p == room_phase::success) {
          h.feed(ev::announce{0, 100, 1, 10});
          h.feed(ev::announce{1, 101, 0, 0});
        }
      }
    }
  }
  REQUIRE(std::string(to_string(h.m.phase())) == to_string(p));
}

using case_ = test::table_case<harness>;

// The cases of the table: what each feeds the room, the effects of its last event.
const case_ cases[] = {
    {"resolved",
     [](harness& h) {
       return h.feed(ev::resolved{0, schema(2, 0), 0});
     }},
    {"unusable",
     [](harness& h) {
       return h.feed(ev::unusable{0, errc::peer_unreachable, "could not use peer p0:7401"});
     }},
    {"staging_reserved", [](harness& h) { return h.feed(ev::staging_reserved{5}); }},
    {"staging_freed", [](harness& h) { return h.feed(ev::staging_freed{}); }},
    {"staging_declined", [](harness& h) { return h.feed(ev::staging_declined{}); }},
    {"ack_ok",
     [](harness& h) {
       return h.feed(ev::prepare_ack{1, 101, true, errc::ok, ""});
     }},
    {"ack_refused",
     [](harness& h) {
       return h.feed(ev::prepare_ack{1, 101, false, errc::invalid_request, "no such pages"});
     }},
    {"ack_stale",
     [](harness& h) {
       return h.feed(ev::prepare_ack{1, 999, false, errc::invalid_request, "old"});
     }},
    {"announce",
     [](harness& h) {
       return h.feed(ev::announce{0, 100, 1, 10});
     }},
    {"outcome_failed",
     [](harness& h) {
       return h.feed(ev::outcome{0, 100, false, errc::peer_lost, "its client left"});
     }},
    {"outcome_ok",
     [](harness& h) {
       return h.feed(ev::outcome{0, 100, true, errc::ok, ""});
     }},
    {"drained",
     [](harness& h) {
       return h.feed(ev::drained{0, 100, 1});
     }},
    {"landed",
     [](harness& h) {
       return h.feed(ev::landed{100, 1});
     }},
    {"unpacked", [](harness& h) { return h.feed(ev::unpacked{}); }},
    {"cancel", [](harness& h) { return h.feed(ev::cancel{"cancelled by the client"}); }},
    {"peer_down_fenced",
     [](harness& h) {
       return h.feed(ev::peer_down{0, true, errc::peer_lost, "peer p0:7401 lost"});
     }},
    {"peer_down_unfenced",
     [](harness& h) {
       return h.feed(ev::peer_down{1, false, errc::peer_lost, "peer p1:7401 lost"});
     }},
    {"expire_state", [](harness& h) { return h.expire(deadline_kind::state); }},
    {"expire_drain", [](harness& h) { return h.expire(deadline_kind::drain); }},
    // its prepare did not say so: ignored
    {"staging_requested",
     [](harness& h) {
       return h.feed(ev::staging_requested{0, 100});
     }},
    // a room that does not check never asked: ignored
    {"verified",
     [](harness& h) {
       return h.feed(ev::verified{errc::checksum_mismatch, "kv buffer 0 (K, layer 3): ..."});
     }},
};

using P = room_phase;
using row = test::table_row<room_phase>;

// Failing once the prepares went out: the ranks are told, the state and room deadlines are
// cancelled, the drain's armed, and Failed waits for the drain.
constexpr const char* drains = "failed tell_err life";

// clang-format off
const row table[] = {
  // Bootstrapping: prepares sent, rank 0 accepted.
  {P::bootstrapping, "resolved",         P::bootstrapping, ""},
  {P::bootstrapping, "unusable",         P::bootstrapping, ""},  // resolved already
  {P::bootstrapping, "staging_reserved", P::bootstrapping, "release_staging"},  // not asked
  {P::bootstrapping, "staging_freed",    P::bootstrapping, ""},
  {P::bootstrapping, "staging_declined", P::bootstrapping, ""},  // not asked
  {P::bootstrapping, "ack_ok",           P::waiting_for_input, "report:WaitingForInput"},
  {P::bootstrapping, "ack_refused",      P::draining, drains},
  {P::bootstrapping, "ack_stale",        P::bootstrapping, ""},
  {P::bootstrapping, "announce",         P::transferring, "report:Transferring"},
  {P::bootstrapping, "outcome_failed",   P::draining, drains},
  {P::bootstrapping, "outcome_ok",       P::bootstrapping, ""},
  {P::bootstrapping, "drained",          P::draining, drains},
  {P::bootstrapping, "landed",           P::transferring, "report:Transferring"},
  {P::bootstrapping, "unpacked",         P::bootstrapping, ""},
  {P::bootstrapping, "cancel",           P::draining, drains},
  {P::bootstrapping, "peer_down_fenced", P::draining, drains},
  {P::bootstrapping, "peer_down_unfenced", P::draining, drains},
  {P::bootstrapping, "expire_state",     P::draining, drains},
  {P::bootstrapping, "expire_drain",     P::bootstrapping, ""},
  {P::bootstrapping, "staging_requested",  P::bootstrapping, ""},
  {P::bootstrapping, "verified",         P::bootstrapping, ""},
  // WaitingForInput: both accepted.
  {P::waiting_for_input, "resolved",         P::waiting_for_input, ""},
  {P::waiting_for_input, "unusable",         P::waiting_for_input, ""},
  {P::waiting_for_input, "staging_reserved", P::waiting_for_input, "release_staging"},
  {P::waiting_for_input, "staging_freed",    P::waiting_for_input, ""},
  {P::waiting_for_input, "staging_declined", P::waiting_for_input, ""},  // not asked
  {P::waiting_for_input, "ack_ok",           P::waiting_for_input, ""},
  {P::waiting_for_input, "ack_refused",      P::draining, drains},
  {P::waiting_for_input, "ack_stale",        P::waiting_for_input, ""},
  {P::waiting_for_input, "announce",         P::transferring, "report:Transferring"},
  {P::waiting_for_input, "outcome_failed",   P::draining, drains},
  {P::waiting_for_input, "outcome_ok",       P::waiting_for_input, ""},
  {P::waiting_for_input, "drained",          P::draining, drains},
  {P::waiting_for_input, "landed",           P::transferring, "report:Transferring"},
  {P::waiting_for_input, "unpacked",         P::waiting_for_input, ""},
  {P::waiting_for_input, "cancel",           P::draining, drains},
  {P::waiting_for_input, "peer_down_fenced", P::draining, drains},
  {P::waiting_for_input, "peer_down_unfenced", P::draining, drains},
  {P::waiting_for_input, "expire_state",     P::draining, drains},
  {P::waiting_for_input, "expire_drain",     P::waiting_for_input, ""},
  {P::waiting_for_input, "staging_requested",  P::waiting_for_input, ""},
  {P::waiting_for_input, "verified",         P::waiting_for_input, ""},
  // Transferring: one write of rank 0 landed, nothing announced.
  {P::transferring, "resolved",         P::transferring, ""},
  {P::transferring, "unusable",         P::transferring, ""},
  {P::transferring, "staging_reserved", P::transferring, "release_staging"},
  {P::transferring, "staging_freed",    P::transferring, ""},
  {P::transferring, "staging_declined", P::transferring, ""},  // not asked
  {P::transferring, "ack_ok",           P::transferring, ""},
  {P::transferring, "ack_refused",      P::draining, drains},
  {P::transferring, "ack_stale",        P::transferring, ""},
  {P::transferring, "announce",         P::transferring, ""},  // rank 1 has not announced
  {P::transferring, "outcome_failed",   P::draining, drains},
  {P::transferring, "outcome_ok",       P::transferring, ""},
  {P::transferring, "drained",          P::draining, drains},
  {P::transferring, "landed",           P::transferring, ""},
  {P::transferring, "unpacked",         P::transferring, ""},
  {P::transferring, "cancel",           P::draining, drains},
  {P::transferring, "peer_down_fenced", P::draining, drains},
  {P::transferring, "peer_down_unfenced", P::draining, drains},
  {P::transferring, "expire_state",     P::draining, drains},
  {P::transferring, "expire_drain",     P::transferring, ""},
  {P::transferring, "staging_requested",  P::transferring, ""},
  {P::transferring, "verified",         P::transferring, ""},
  // Draining: neither rank drained, refused or was fenced; one of the two settling is not enough.
  {P::draining, "resolved",         P::draining, ""},
  {P::draining, "unusable",         P::draining, ""},
  {P::draining, "staging_reserved", P::draining, "release_staging"},
  {P::draining, "staging_freed",    P::draining, ""},
  {P::draining, "staging_declined", P::draining, ""},  // not asked
  {P::draining, "ack_ok",           P::draining, ""},
  {P::draining, "ack_refused",      P::draining, ""},
  {P::draining, "ack_stale",        P::draining, ""},
  {P::draining, "announce",         P::draining, ""},
  {P::draining, "outcome_failed",   P::draining, ""},
  {P::draining, "outcome_ok",       P::draining, ""},
  {P::draining, "drained",          P::draining, ""},
  {P::draining, "landed",           P::draining, ""},
  {P::draining, "unpacked",         P::draining, ""},
  {P::draining, "cancel",           P::draining, ""},
  {P::draining, "peer_down_fenced", P::draining, ""},
  {P::draining, "peer_down_unfenced", P::draining, ""},
  {P::draining, "expire_state",     P::draining, ""},  // cancelled by the failure
  {P::draining, "expire_drain",     P::draining, "fence fence"},  // the fences complete it
  {P::draining, "staging_requested",  P::draining, ""},
  {P::draining, "verified",         P::draining, ""},
  // Terminal.
  {P::success, "resolved",         P::success, ""},
  {P::success, "unusable",         P::success, ""},
  {P::success, "staging_reserved", P::success, "release_staging"},
  {P::success, "staging_freed",    P::success, ""},
  {P::success, "staging_declined", P::success, ""},  // not asked
  {P::success, "ack_ok",           P::success, ""},
  {P::success, "ack_refused",      P::success, ""},
  {P::success, "ack_stale",        P::success, ""},
  {P::success, "announce",         P::success, ""},
  {P::success, "outcome_failed",   P::success, ""},
  {P::success, "outcome_ok",       P::success, ""},
  {P::success, "drained",          P::success, ""},
  {P::success, "landed",           P::success, ""},
  {P::success, "unpacked",         P::success, ""},
  {P::success, "cancel",           P::success, ""},
  {P::success, "peer_down_fenced", P::success, ""},
  {P::success, "peer_down_unfenced", P::success, ""},
  {P::success, "expire_state",     P::success, ""},
  {P::success, "expire_drain",     P::success, ""},
  {P::success, "staging_requested",  P::success, ""},
  {P::success, "verified",         P::success, ""},
  {P::failed, "resolved",         P::failed, ""},
  {P::failed, "unusable",         P::failed, ""},
  {P::failed, "staging_reserved", P::failed, "release_staging"},
  {P::failed, "staging_freed",    P::failed, ""},
  {P::failed, "staging_declined", P::failed, ""},  // not asked
  {P::failed, "ack_ok",           P::failed, ""},
  {P::failed, "ack_refused",      P::failed, ""},
  {P::failed, "ack_stale",        P::failed, ""},
  {P::failed, "announce",         P::failed, ""},
  {P::failed, "outcome_failed",   P::failed, ""},
  {P::failed, "outcome_ok",       P::failed, ""},
  {P::failed, "drained",          P::failed, ""},
  {P::failed, "landed",           P::failed, ""},
  {P::failed, "unpacked",         P::failed, ""},
  {P::failed, "cancel",           P::failed, ""},
  {P::failed, "peer_down_fenced", P::failed, ""},
  {P::failed, "peer_down_unfenced", P::failed, ""},
  {P::failed, "expire_state",     P::failed, ""},
  {P::failed, "expire_drain",     P::failed, ""},
  {P::failed, "staging_requested",  P::failed, ""},
  {P::failed, "verified",         P::failed, ""},
};
// clang-format on

}  // namespace

TEST_CASE("receiver room: the table has a row for every (phase, event) pair",
          "[unit][receiver_room]") {
  test::check_complete(all_phases, cases, table);
}

TEST_CASE("receiver room: every (phase, event) pair does what its row says",
          "[unit][receiver_room]") {
  test::check_rows(cases, table, bring_to);
}

TEST_CASE(
    "receiver room: the prepares wait for every named peer, and a needed one that cannot "
    "be used fails the room naming it",
    "[unit][receiver_room]") {
  harness h;
  h.feed(ev::start{});
  CHECK(h.feed(ev::resolved{0, schema(2, 0), 0}) == "");  // one of two
  CHECK(h.feed(ev::unusable{1, errc::peer_unreachable,
                            "could not use peer p1:7401: cannot connect to p1:7401: refused"}) ==
        "failed life report:Failed");  // nothing was prepared: Failed at once
  CHECK(h.m.lifecycle().fail_code() == errc::peer_unreachable);
  CHECK_THAT(h.last_reason, Catch::EndsWith("(could not use peer p1:7401: cannot connect to "
                                            "p1:7401: refused)"));

  harness d;
  d.feed(ev::start{});
  d.feed(ev::resolved{0, schema(2, 0), 0});
  // Before selection, a peer that goes down is out, even if it had resolved.
  CHECK(d.feed(ev::peer_down{0, false, errc::peer_lost, "peer p0:7401 lost"}) == "");
  CHECK(d.feed(ev::resolved{1, schema(2, 1), 0}) == "failed life report:Failed");
  CHECK_THAT(d.last_reason, Catch::EndsWith("(peer p0:7401 lost)"));
}

TEST_CASE(
    "receiver room: head-sliced KV reserves staging before the prepares, and is unpacked "
    "before Success",
    "[unit][receiver_room]") {
  SECTION("staging granted at once") {
    harness h(100);
    h.feed(ev::start{});
    CHECK(h.resolve_both(30) == "reserve_staging");
    CHECK_FALSE(h.m.prepared());
    CHECK(h.feed(ev::staging_reserved{1000}) == "send_prepares");
    REQUIRE(h.m.links().size() == 2);
    CHECK(h.m.links()[0].staging == 1000u);
    CHECK(h.m.links()[1].staging == 1030u);
    h.feed(ev::prepare_ack{0, 100, true, errc::ok, ""});
    h.feed(ev::prepare_ack{1, 101, true, errc::ok, ""});
    h.feed(ev::announce{0, 100, 1, 10});
    h.feed(ev::announce{1, 101, 1, 10});
    CHECK(h.feed(ev::landed{100, 1}) == "");
    CHECK(h.feed(ev::landed{101, 1}) == "unpack");
    CHECK(h.feed(ev::unpacked{}) == "release_staging tell_ok report:Success");
    CHECK(h.m.bytes() == 20);
  }
  SECTION("staging full: the room waits, then asks again") {
    harness h(100);
    h.feed(ev::start{});
    CHECK(h.resolve_both(30) == "reserve_staging");
    CHECK(h.feed(ev::staging_freed{}) == "reserve_staging");
    CHECK(h.feed(ev::staging_reserved{0}) == "send_prepares");
  }
  SECTION("a block only to scatter into is not waited for: staging full, one write per run") {
    harness h(100);
    h.feed(ev::start{});
    h.feed(ev::resolved{0, schema(2, 0), 30, true});
    CHECK(h.feed(ev::resolved{1, schema(2, 1), 30, true}) == "reserve_staging");
    CHECK(!h.last_wait());
    CHECK(h.feed(ev::staging_declined{}) == "no_staging send_prepares");
    REQUIRE(h.m.links().size() == 2);
    CHECK_FALSE(h.m.links()[0].staging);
    CHECK_FALSE(h.m.links()[1].staging);
    CHECK(h.feed(ev::staging_reserved{7}) == "release_staging");  // late: not ours
  }
  SECTION("a block to scatter into, granted: scattered on commit like an unpack") {
    harness h(100);
    h.feed(ev::start{});
    h.feed(ev::resolved{0, schema(2, 0), 30, true});
    CHECK(h.feed(ev::resolved{1, schema(2, 1), 0, true}) == "reserve_staging");
    CHECK(h.feed(ev::staging_reserved{64}) == "send_prepares");
    CHECK(h.m.links()[0].staging == 64u);
    CHECK_FALSE(h.m.links()[1].staging);
  }
  SECTION("a room that must unpack waits even beside an optional block") {
    harness h(100);
    h.feed(ev::start{});
    h.feed(ev::resolved{0, schema(2, 0), 30, false});
    CHECK(h.feed(ev::resolved{1, schema(2, 1), 30, true}) == "reserve_staging");
    CHECK(h.last_wait());
    CHECK(h.feed(ev::staging_declined{}) == "reserve_staging");  // asked again, waiting
    CHECK(h.feed(ev::staging_reserved{0}) == "send_prepares");
  }
  SECTION("too large for the whole area: one write per token, no staging") {
    harness h(50);
    h.feed(ev::start{});
    CHECK(h.resolve_both(30) == "no_staging send_prepares");
  }
  SECTION("a failure while waiting for staging: nothing was prepared, Failed at once") {
    harness h(100);
    h.feed(ev::start{});
    h.resolve_both(30);
    CHECK(h.feed(ev::cancel{"cancelled"}) == "failed life report:Failed");
    CHECK(h.feed(ev::staging_freed{}) == "");
  }
}

TEST_CASE(
    "receiver room: with peers that ask, staging is reserved when the first rank's writes are "
    "about to start, and each rank that asked is granted its offset",
    "[unit][receiver_room]") {
  auto ask_both = [](harness& h, uint64_t bytes, bool optional = false) {
    h.feed(ev::start{});
    h.feed(ev::resolved{0, schema(2, 0), bytes, optional, true});
    return h.feed(ev::resolved{1, schema(2, 1), bytes, optional, true});
  };
  SECTION("granted at once, then unpacked before Success") {
    harness h(100);
    CHECK(ask_both(h, 30) == "send_prepares");  // nothing reserved yet
    CHECK(h.m.staging_on_request());
    REQUIRE(h.m.links().size() == 2);
    CHECK(h.m.links()[0].on_request);
    CHECK_FALSE(h.m.links()[0].staging);
    h.feed(ev::prepare_ack{0, 100, true, errc::ok, ""});
    CHECK(h.feed(ev::prepare_ack{1, 101, true, errc::ok, ""}) == "report:WaitingForInput");
    CHECK(h.feed(ev::staging_requested{0, 100}) == "reserve_staging");
    CHECK(h.last_wait());
    CHECK(h.feed(ev::staging_reserved{1000}) == "grant");  // rank 0 only: rank 1 has not asked
    CHECK(h.m.links()[0].staging == 1000u);
    CHECK(h.m.links()[1].staging == 1030u);
    CHECK(h.feed(ev::staging_requested{1, 101}) == "grant");
    CHECK(h.feed(ev::staging_requested{1, 101}) == "");  // once
    CHECK(h.feed(ev::staging_requested{1, 999}) == "");  // not this incarnation
    h.feed(ev::announce{0, 100, 1, 10});
    h.feed(ev::announce{1, 101, 1, 10});
    h.feed(ev::landed{100, 1});
    CHECK(h.feed(ev::landed{101, 1}) == "unpack");
    CHECK(h.feed(ev::unpacked{}) == "release_staging tell_ok report:Success");
  }
  SECTION("staging full: the room waits in WaitingForInput, bounded by its deadline") {
    harness h(100);
    ask_both(h, 30);
    h.feed(ev::prepare_ack{0, 100, true, errc::ok, ""});
    h.feed(ev::prepare_ack{1, 101, true, errc::ok, ""});
    h.feed(ev::staging_requested{0, 100});
    CHECK(h.m.waiting_for_staging());
    CHECK(h.feed(ev::staging_requested{1, 101}) == "");  // the one reservation covers it
    CHECK(h.feed(ev::staging_freed{}) == "reserve_staging");
    CHECK(h.expire(deadline_kind::state) == "failed tell_err life");
    CHECK_THAT(h.m.lifecycle().fail_reason(),
               Catch::StartsWith("timed out in WaitingForInput after 200 ms") &&
                   Catch::EndsWith("; waiting for 60 bytes of staging)"));
    CHECK(h.feed(ev::staging_reserved{0}) == "release_staging");  // too late: given back
  }
  SECTION("a block only to scatter into, staging full: every rank that asks writes directly") {
    harness h(100);
    ask_both(h, 30, true);
    CHECK(h.feed(ev::staging_requested{0, 100}) == "reserve_staging");
    CHECK_FALSE(h.last_wait());
    CHECK(h.feed(ev::staging_declined{}) == "no_staging grant");
    CHECK_FALSE(h.m.links()[0].staging);
    CHECK(h.feed(ev::staging_requested{1, 101}) == "grant");  // none for it either
    h.feed(ev::announce{0, 100, 0, 0});
    CHECK(h.feed(ev::announce{1, 101, 0, 0}) == "tell_ok report:Success");  // nothing to unpack
  }
  SECTION("a peer that cannot ask (version 9): reserved before the prepares, as before") {
    harness h(100);
    h.feed(ev::start{});
    h.feed(ev::resolved{0, schema(2, 0), 30, false, true});
    CHECK(h.feed(ev::resolved{1, schema(2, 1), 30, false, false}) == "reserve_staging");
    CHECK_FALSE(h.m.staging_on_request());
    CHECK(h.feed(ev::staging_reserved{0}) == "send_prepares");
    CHECK(h.feed(ev::staging_requested{0, 100}) == "");  // its prepare carried the offset
  }
  SECTION("a rank that announces without asking fails the room: its block holds no KV of it") {
    harness h(100);
    ask_both(h, 30);
    h.feed(ev::prepare_ack{0, 100, true, errc::ok, ""});
    h.feed(ev::prepare_ack{1, 101, true, errc::ok, ""});
    h.feed(ev::staging_requested{0, 100});
    h.feed(ev::staging_reserved{0});
    CHECK(h.feed(ev::announce{1, 101, 1, 10}) == "failed tell_err life");
    CHECK(h.m.lifecycle().fail_reason() ==
          "prefill p1:7401 announced its writes without asking where its KV lands in staging");
  }
  SECTION("a room that fails while it waits gives the late block back") {
    harness h(100);
    ask_both(h, 30);
    h.feed(ev::staging_requested{0, 100});
    CHECK(h.feed(ev::cancel{"cancelled"}) == "failed tell_err life");
    CHECK(h.feed(ev::staging_freed{}) == "");
    CHECK(h.feed(ev::staging_requested{1, 101}) == "");
    CHECK(h.feed(ev::staging_reserved{64}) == "release_staging");
  }
}

TEST_CASE("receiver room: Success only when the landed writes equal the announced total",
          "[unit][receiver_room]") {
  harness h;
  bring_to(h, room_phase::transferring);  // 1 landed
  h.feed(ev::announce{0, 100, 1, 10});
  CHECK(h.feed(ev::announce{0, 100, 1, 10}) == "failed tell_err life");
  CHECK(h.m.lifecycle().fail_reason() == "prefill p0:7401 announced twice");

  harness o;
  bring_to(o, room_phase::transferring);
  o.feed(ev::landed{101, 1});
  o.feed(ev::announce{0, 100, 1, 10});
  CHECK(o.feed(ev::announce{1, 101, 0, 0}) == "failed tell_err life");
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
    CHECK(h.feed(ev::drained{0, 100, 2}) == "");  // 1 of 2 landed
    CHECK(h.feed(ev::drained{1, 101, 0}) == "");
    CHECK(h.feed(ev::landed{100, 1}) == "report:Failed");
    CHECK(h.last_reason == "cancelled by test");
  }
  SECTION("the drain deadline fences, and the fences complete the drain") {
    harness h;
    bring_to(h, room_phase::draining);
    h.feed(ev::drained{0, 100, 3});
    CHECK(h.expire(deadline_kind::drain) == "fence fence");
    CHECK(h.feed(ev::peer_down{0, true, errc::peer_lost, "fenced"}) == "");
    CHECK(h.feed(ev::peer_down{1, true, errc::peer_lost, "fenced"}) == "report:Failed");
    CHECK(h.last_reason ==
          "cancelled by test; drain incomplete after 50 ms (timeouts.drain_ms), fenced: p0:7401 "
          "(1 of 3 drained writes landed), p1:7401 (no drain report)");
  }
  SECTION("a rank that reports failed writes is fenced: its landed writes do not settle it") {
    harness h;
    bring_to(h, room_phase::draining);
    CHECK(h.feed(ev::drained{0, 100, 1, 2}) == "fence");  // 1 landed already
    CHECK(h.feed(ev::drained{1, 101, 0}) == "");
    CHECK(h.feed(ev::landed{100, 5}) == "");  // still open: only the fence settles it
    CHECK(h.m.phase() == room_phase::draining);
    CHECK(h.expire(deadline_kind::drain) == "");  // its fence is on its way already
    CHECK(h.feed(ev::peer_down{0, true, errc::peer_lost, "fenced"}) == "report:Failed");
  }
  SECTION("a peer down that did not fence does not end the drain") {
    harness h;
    bring_to(h, room_phase::draining);
    h.feed(ev::peer_down{0, false, errc::peer_lost, "down"});
    h.feed(ev::peer_down{1, false, errc::peer_lost, "down"});
    CHECK(h.m.phase() == room_phase::draining);
  }
}

TEST_CASE("receiver room: reasons say what failed", "[unit][receiver_room]") {
  harness h;
  bring_to(h, room_phase::bootstrapping);
  h.feed(ev::prepare_ack{1, 101, false, errc::ok, "no such pages"});
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
  o.feed(ev::outcome{1, 101, false, errc::ok, "boom"});
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
  h.feed(ev::start{});
  REQUIRE(h.resolve_both() == "send_prepares");
  h.feed(ev::prepare_ack{0, 100, true, errc::ok, ""});
  CHECK(h.feed(ev::cancel{"cancelled by client"}) == "failed tell_err life");
  CHECK(h.feed(ev::prepare_ack{1, 101, false, errc::cancelled,
                               "room 7 failed on the prefill before it took this decode's "
                               "prepare: cancelled by client"}) == "");
  CHECK(h.m.lifecycle().phase() == room_phase::draining);
  CHECK(h.feed(ev::prepare_ack{0, 100, false, errc::cancelled, "late"}) == "");
  CHECK(h.m.lifecycle().phase() == room_phase::draining);
  CHECK(h.feed(ev::drained{0, 100, 0}) == "report:Failed");
  CHECK(h.last_reason == "cancelled by client");
}

TEST_CASE(
    "receiver room: a room that checks verifies what landed, after any unpack, before Success",
    "[unit][receiver_room]") {
  auto to_landed = [](harness& h, uint64_t unpack_bytes = 0) {
    h.feed(ev::start{});
    h.resolve_both(unpack_bytes);
    if (unpack_bytes) h.feed(ev::staging_reserved{0});
    h.feed(ev::prepare_ack{0, 100, true, errc::ok, ""});
    h.feed(ev::prepare_ack{1, 101, true, errc::ok, ""});
    h.feed(ev::announce{0, 100, 1, 10});
    h.feed(ev::announce{1, 101, 1, 10});
    h.feed(ev::landed{100, 1});
    return h.feed(ev::landed{101, 1});
  };
  SECTION("the digests match: Success") {
    harness h(0, true);
    CHECK(to_landed(h) == "verify");
    CHECK(h.m.phase() == room_phase::transferring);
    CHECK(h.feed(ev::verified{errc::ok, ""}) == "tell_ok report:Success");
  }
  SECTION("a digest differs: Failed with checksum_mismatch, the ranks told") {
    harness h(0, true);
    CHECK(to_landed(h) == "verify");
    CHECK(h.feed(ev::verified{errc::checksum_mismatch, "kv buffer 2 (V, layer 3): ..."}) ==
          "failed tell_err life");
    CHECK(h.m.lifecycle().fail_code() == errc::checksum_mismatch);
    CHECK(h.m.lifecycle().fail_reason() == "kv buffer 2 (V, layer 3): ...");
    // Every write it counted landed; the ranks' drain reports end it.
    h.feed(ev::drained{0, 100, 1});
    CHECK(h.feed(ev::drained{1, 101, 1}) == "report:Failed");
  }
  SECTION("KV landed in staging: unpacked first, then verified") {
    harness h(100, true);
    CHECK(to_landed(h, 30) == "unpack");
    CHECK(h.feed(ev::unpacked{}) == "verify");
    CHECK(h.feed(ev::verified{errc::ok, ""}) == "release_staging tell_ok report:Success");
  }
  SECTION("a late verify of a cancelled room does nothing") {
    harness h(0, true);
    CHECK(to_landed(h) == "verify");
    CHECK(h.feed(ev::cancel{"cancelled by client"}) == "failed tell_err life");
    CHECK(h.feed(ev::verified{errc::ok, ""}) == "");
  }
  SECTION("a room that does not check succeeds at once") {
    harness h;
    CHECK(to_landed(h) == "tell_ok report:Success");
  }
}

}  // namespace test_receiver_room
