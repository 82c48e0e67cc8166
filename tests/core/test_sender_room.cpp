// core/sender_room.hpp: every (phase, event) pair of a prefill room, table-driven; a test
// enumerates the pairs so one without its row fails. The room feeds two decode ranks (a TP1
// prefill, TP2 decode) of two pages, and its rank holds layers 0, 3, 4 and 7; the tests after
// the table cover the announcement, layer-wise sends, the drain and the reasons.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "core/sender_room.hpp"
#include "machine_table.hpp"

// Named, so that the unity build may put this file beside the other machines' tables.
namespace test_sender_room {
using namespace ferry;
using namespace ferry::sender;

namespace {

constexpr lifecycle_limits limits{100, 200, 300, 1000, 50};

/// A room of this prefill rank (TP1, layers 0, 3, 4 and 7) with its actor's deadlines.
struct harness : test::room_harness<sender::room, sender::event, sender::effects> {
  harness() { m = room{7, limits, 0, 1, 0, {0, 3, 4, 7}}; }

  static ev::prepare rank(uint64_t link) {
    ev::prepare p;
    p.link = link;
    p.address = "decode" + std::to_string(link) + ":7401";
    p.in_group = true;
    p.tp_size = 2;
    p.tp_rank = static_cast<uint32_t>(link % 2);
    p.expected_links = 2;
    p.pages = 2;
    p.token = 100 + link;
    return p;
  }
  static proto::send chunk(std::vector<uint32_t> pages, bool last = false) {
    proto::send c;
    c.room = 7;
    c.src_pages = std::move(pages);
    c.last = last;
    return c;
  }
  /// The layers [first, first + count) of a chunk.
  static proto::send layers(std::vector<uint32_t> pages, uint32_t first, uint32_t count,
                            bool last = false) {
    auto c = chunk(std::move(pages), last);
    c.first_layer = first;
    c.layer_count = count;
    return c;
  }
};

constexpr room_phase all_phases[] = {room_phase::bootstrapping, room_phase::waiting_for_input,
                                     room_phase::transferring,  room_phase::draining,
                                     room_phase::success,       room_phase::failed};

/// A room brought into `p` the way rooms get there:
/// - bootstrapping: chunk {10} queued, rank 1 of 2 prepared;
/// - waiting_for_input: rank 2 prepared, the queued chunk posted without a batch yet;
/// - transferring: batch 1 (1 write) posted to rank 1;
/// - draining: cancelled with batch 1 in flight;
/// - success: batch 1 done, the last chunk {101} posted, announced, both ranks committed;
/// - failed: cancelled while bootstrapping.
void bring_to(harness& h, room_phase p) {
  h.feed(ev::start{});
  h.feed(ev::chunk{harness::chunk({10})});
  h.feed(h.rank(1));
  if (p == room_phase::failed) {
    h.feed(ev::cancel{"cancelled by test"});
  } else if (p != room_phase::bootstrapping) {
    h.feed(h.rank(2));
    h.feed(ev::chunk_posted{false});
    if (p != room_phase::waiting_for_input) {
      h.feed(ev::posted{0, 1, 1, 100});
      if (p == room_phase::draining) h.feed(ev::cancel{"cancelled by test"});
      if (p == room_phase::success) {
        h.feed(ev::batch_done{1, 1, 0, {}});
        h.feed(ev::pumped{false});
        h.feed(ev::chunk{harness::chunk({101}, true)});
        REQUIRE(h.feed(ev::chunk_posted{false}) == "announce");
        h.feed(ev::outcome{1, "decode1:7401", true, 101, true, errc::ok, ""});
        h.feed(ev::outcome{2, "decode2:7401", true, 102, true, errc::ok, ""});
      }
    }
  }
  REQUIRE(std::string(to_string(h.m.phase())) == to_string(p));
}

using case_ = test::table_case<harness>;

// The cases of the table: what each feeds the room, the effects of its last event.
const case_ cases[] = {
    {"prepare_new", [](harness& h) { return h.feed(h.rank(9)); }},
    {"prepare_mismatch",
     [](harness& h) {
       auto p = h.rank(9);
       p.pages = 3;
       return h.feed(p);
     }},
    {"prepare_bad_indices",
     [](harness& h) {
       auto p = h.rank(9);
       p.indices = error{errc::invalid_request, "room 7: decode dst page 99 is outside"};
       return h.feed(p);
     }},
    {"prepare_out_of_group",
     [](harness& h) {
       auto p = h.rank(9);
       p.in_group = false;
       return h.feed(p);
     }},
    {"prepare_again", [](harness& h) { return h.feed(h.rank(1)); }},
    {"chunk", [](harness& h) { return h.feed(ev::chunk{harness::chunk({200})}); }},
    // exactly the pages left
    {"chunk_last",
     [](harness& h) {
       return h.feed(
           ev::chunk{h.m.ready() ? harness::chunk({101}, true) : harness::chunk({100, 101}, true)});
     }},
    {"chunk_overrun",
     [](harness& h) {
       return h.feed(ev::chunk{harness::chunk({300, 301, 302})});
     }},
    {"chunk_repeat", [](harness& h) { return h.feed(ev::chunk{harness::chunk({10})}); }},
    // layers 0 and 3 of a new chunk: it opens, not complete
    {"chunk_layer", [](harness& h) { return h.feed(ev::chunk{harness::layers({200}, 0, 4)}); }},
    // layer 0 of a new chunk, then layer 0 again: the second
    {"chunk_layer_again",
     [](harness& h) {
       h.feed(ev::chunk{harness::layers({200}, 0, 1)});
       return h.feed(ev::chunk{harness::layers({200}, 0, 1)});
     }},
    // layer 0 of a new chunk, then another chunk: the second
    {"chunk_other_open",
     [](harness& h) {
       h.feed(ev::chunk{harness::layers({200}, 0, 1)});
       return h.feed(ev::chunk{harness::layers({201}, 3, 1)});
     }},
    {"posted",
     [](harness& h) {
       return h.feed(ev::posted{0, 7, 1, 50});
     }},
    {"chunk_posted", [](harness& h) { return h.feed(ev::chunk_posted{false}); }},
    {"pumped", [](harness& h) { return h.feed(ev::pumped{true}); }},
    {"batch_done_ok",
     [](harness& h) {
       return h.feed(ev::batch_done{1, 1, 0, {}});
     }},
    {"batch_done_failed",
     [](harness& h) {
       return h.feed(ev::batch_done{1, 0, 1, error{errc::fabric_write_failed, "EIO"}});
     }},
    {"outcome_ok",
     [](harness& h) {
       return h.feed(ev::outcome{1, "decode1:7401", true, 101, true, errc::ok, ""});
     }},
    {"outcome_failed",
     [](harness& h) {
       return h.apply(h.m.on(
           ev::outcome{1, "decode1:7401", true, 101, false, errc::peer_lost, "its client left"}));
     }},
    {"outcome_stale",
     [](harness& h) {
       return h.feed(ev::outcome{1, "decode1:7401", true, 999, false, errc::peer_lost, "old"});
     }},
    {"outcome_unprepared",
     [](harness& h) {
       return h.apply(h.m.on(
           ev::outcome{9, "decode9:7401", true, 109, false, errc::cancelled, "cancelled there"}));
     }},
    {"cancel", [](harness& h) { return h.feed(ev::cancel{"cancelled by the client"}); }},
    {"peer_down",
     [](harness& h) {
       return h.feed(ev::peer_down{errc::peer_lost, "peer decode1:7401 lost"});
     }},
    {"expire_state", [](harness& h) { return h.expire(deadline_kind::state); }},
    {"expire_drain", [](harness& h) { return h.expire(deadline_kind::drain); }},
};

using P = room_phase;
using row = test::table_row<room_phase>;

// What failing does, by whether a batch is in flight: with none the room reports Failed at
// once; with one it drains (its state and room deadlines cancelled, the drain's armed).
constexpr const char* fails_now = "tell_failed life tell_drained report:Failed";
constexpr const char* fails_draining = "tell_failed life";

// clang-format off
const row table[] = {
  // Bootstrapping: rank 1 of 2 prepared, chunk {10} queued.
  {P::bootstrapping, "prepare_new",        P::waiting_for_input, "ack_ok report:WaitingForInput post_chunk"},
  {P::bootstrapping, "prepare_mismatch",   P::failed, "ack_err tell_failed life tell_drained report:Failed"},
  {P::bootstrapping, "prepare_bad_indices",  P::bootstrapping, "ack_err"},
  {P::bootstrapping, "prepare_out_of_group", P::bootstrapping, "ack_err"},
  {P::bootstrapping, "prepare_again",      P::bootstrapping, "ack_err"},
  {P::bootstrapping, "chunk",              P::bootstrapping, "reply_ok"},  // queued
  {P::bootstrapping, "chunk_last",         P::bootstrapping, "reply_ok"},
  {P::bootstrapping, "chunk_overrun",      P::bootstrapping, "reply_ok"},  // checked once ready
  {P::bootstrapping, "chunk_repeat",       P::bootstrapping, "reply_err"},
  {P::bootstrapping, "chunk_layer",        P::bootstrapping, "reply_ok"},
  {P::bootstrapping, "chunk_layer_again",  P::bootstrapping, "reply_err"},
  {P::bootstrapping, "chunk_other_open",   P::bootstrapping, "reply_err"},
  {P::bootstrapping, "posted",             P::bootstrapping, ""},  // nothing can post yet
  {P::bootstrapping, "chunk_posted",       P::bootstrapping, ""},
  {P::bootstrapping, "pumped",             P::bootstrapping, ""},
  {P::bootstrapping, "batch_done_ok",      P::bootstrapping, "pump"},
  {P::bootstrapping, "batch_done_failed",  P::failed, fails_now},
  {P::bootstrapping, "outcome_ok",         P::bootstrapping, ""},  // before the announcement
  {P::bootstrapping, "outcome_failed",     P::failed, fails_now},
  {P::bootstrapping, "outcome_stale",      P::bootstrapping, ""},
  {P::bootstrapping, "outcome_unprepared", P::failed, fails_now},
  {P::bootstrapping, "cancel",             P::failed, fails_now},
  {P::bootstrapping, "peer_down",          P::failed, fails_now},
  {P::bootstrapping, "expire_state",       P::failed, fails_now},
  {P::bootstrapping, "expire_drain",       P::bootstrapping, ""},
  // WaitingForInput: both ranks prepared, chunk {10} taken, no batch yet.
  {P::waiting_for_input, "prepare_new",        P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, "prepare_mismatch",   P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, "prepare_bad_indices",  P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, "prepare_out_of_group", P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, "prepare_again",      P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, "chunk",              P::waiting_for_input, "reply_ok post_chunk"},
  {P::waiting_for_input, "chunk_last",         P::waiting_for_input, "reply_ok post_chunk"},
  {P::waiting_for_input, "chunk_overrun",      P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, "chunk_repeat",       P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, "chunk_layer",        P::waiting_for_input, "reply_ok post_chunk"},
  {P::waiting_for_input, "chunk_layer_again",  P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, "chunk_other_open",   P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, "posted",             P::transferring, "report:Transferring"},
  {P::waiting_for_input, "chunk_posted",       P::waiting_for_input, ""},
  {P::waiting_for_input, "pumped",             P::waiting_for_input, ""},
  {P::waiting_for_input, "batch_done_ok",      P::waiting_for_input, "pump"},
  {P::waiting_for_input, "batch_done_failed",  P::failed, fails_now},
  {P::waiting_for_input, "outcome_ok",         P::waiting_for_input, ""},
  {P::waiting_for_input, "outcome_failed",     P::failed, fails_now},
  {P::waiting_for_input, "outcome_stale",      P::waiting_for_input, ""},
  {P::waiting_for_input, "outcome_unprepared", P::failed, fails_now},
  {P::waiting_for_input, "cancel",             P::failed, fails_now},
  {P::waiting_for_input, "peer_down",          P::failed, fails_now},
  {P::waiting_for_input, "expire_state",       P::failed, fails_now},
  {P::waiting_for_input, "expire_drain",       P::waiting_for_input, ""},
  // Transferring: batch 1 in flight.
  {P::transferring, "prepare_new",        P::transferring, "ack_err"},
  {P::transferring, "prepare_mismatch",   P::transferring, "ack_err"},
  {P::transferring, "prepare_bad_indices",  P::transferring, "ack_err"},
  {P::transferring, "prepare_out_of_group", P::transferring, "ack_err"},
  {P::transferring, "prepare_again",      P::transferring, "ack_err"},
  {P::transferring, "chunk",              P::transferring, "reply_ok post_chunk"},
  {P::transferring, "chunk_last",         P::transferring, "reply_ok post_chunk"},
  {P::transferring, "chunk_overrun",      P::transferring, "reply_err"},
  {P::transferring, "chunk_repeat",       P::transferring, "reply_err"},
  {P::transferring, "chunk_layer",        P::transferring, "reply_ok post_chunk"},
  {P::transferring, "chunk_layer_again",  P::transferring, "reply_err"},
  {P::transferring, "chunk_other_open",   P::transferring, "reply_err"},
  {P::transferring, "posted",             P::transferring, ""},
  {P::transferring, "chunk_posted",       P::transferring, ""},
  {P::transferring, "pumped",             P::transferring, ""},
  {P::transferring, "batch_done_ok",      P::transferring, "pump"},
  {P::transferring, "batch_done_failed",  P::failed, fails_now},  // the failed batch was the last
  {P::transferring, "outcome_ok",         P::transferring, ""},
  {P::transferring, "outcome_failed",     P::draining, fails_draining},
  {P::transferring, "outcome_stale",      P::transferring, ""},
  {P::transferring, "outcome_unprepared", P::draining, fails_draining},
  {P::transferring, "cancel",             P::draining, fails_draining},
  {P::transferring, "peer_down",          P::draining, fails_draining},
  {P::transferring, "expire_state",       P::draining, fails_draining},
  {P::transferring, "expire_drain",       P::transferring, ""},
  // Draining: only batch 1's completion or the drain deadline end it.
  {P::draining, "prepare_new",        P::draining, "ack_err"},
  {P::draining, "prepare_mismatch",   P::draining, "ack_err"},
  {P::draining, "prepare_bad_indices",  P::draining, "ack_err"},
  {P::draining, "prepare_out_of_group", P::draining, "ack_err"},
  {P::draining, "prepare_again",      P::draining, "ack_err"},
  {P::draining, "chunk",              P::draining, "reply_err"},
  {P::draining, "chunk_last",         P::draining, "reply_err"},
  {P::draining, "chunk_overrun",      P::draining, "reply_err"},
  {P::draining, "chunk_repeat",       P::draining, "reply_err"},
  {P::draining, "chunk_layer",        P::draining, "reply_err"},
  {P::draining, "chunk_layer_again",  P::draining, "reply_err"},
  {P::draining, "chunk_other_open",   P::draining, "reply_err"},
  {P::draining, "posted",             P::draining, ""},
  {P::draining, "chunk_posted",       P::draining, ""},
  {P::draining, "pumped",             P::draining, ""},
  {P::draining, "batch_done_ok",      P::failed, "tell_drained report:Failed"},
  {P::draining, "batch_done_failed",  P::failed, "tell_drained report:Failed"},
  {P::draining, "outcome_ok",         P::draining, ""},
  {P::draining, "outcome_failed",     P::draining, ""},
  {P::draining, "outcome_stale",      P::draining, ""},
  {P::draining, "outcome_unprepared", P::draining, ""},
  {P::draining, "cancel",             P::draining, ""},
  {P::draining, "peer_down",          P::draining, ""},
  {P::draining, "expire_state",       P::draining, ""},  // cancelled by the failure
  {P::draining, "expire_drain",       P::failed, "report:Failed"},  // no drained count
  // Terminal: the actor has ended; a prepare or chunk that still reaches the machine is refused.
  {P::success, "prepare_new",        P::success, "ack_err"},
  {P::success, "prepare_mismatch",   P::success, "ack_err"},
  {P::success, "prepare_bad_indices",  P::success, "ack_err"},
  {P::success, "prepare_out_of_group", P::success, "ack_err"},
  {P::success, "prepare_again",      P::success, "ack_err"},
  {P::success, "chunk",              P::success, "reply_err"},
  {P::success, "chunk_last",         P::success, "reply_err"},
  {P::success, "chunk_overrun",      P::success, "reply_err"},
  {P::success, "chunk_repeat",       P::success, "reply_err"},
  {P::success, "chunk_layer",        P::success, "reply_err"},
  {P::success, "chunk_layer_again",  P::success, "reply_err"},
  {P::success, "chunk_other_open",   P::success, "reply_err"},
  {P::success, "posted",             P::success, ""},
  {P::success, "chunk_posted",       P::success, ""},
  {P::success, "pumped",             P::success, ""},
  {P::success, "batch_done_ok",      P::success, ""},
  {P::success, "batch_done_failed",  P::success, ""},
  {P::success, "outcome_ok",         P::success, ""},
  {P::success, "outcome_failed",     P::success, ""},
  {P::success, "outcome_stale",      P::success, ""},
  {P::success, "outcome_unprepared", P::success, ""},
  {P::success, "cancel",             P::success, ""},
  {P::success, "peer_down",          P::success, ""},
  {P::success, "expire_state",       P::success, ""},
  {P::success, "expire_drain",       P::success, ""},
  {P::failed, "prepare_new",        P::failed, "ack_err"},
  {P::failed, "prepare_mismatch",   P::failed, "ack_err"},
  {P::failed, "prepare_bad_indices",  P::failed, "ack_err"},
  {P::failed, "prepare_out_of_group", P::failed, "ack_err"},
  {P::failed, "prepare_again",      P::failed, "ack_err"},
  {P::failed, "chunk",              P::failed, "reply_err"},
  {P::failed, "chunk_last",         P::failed, "reply_err"},
  {P::failed, "chunk_overrun",      P::failed, "reply_err"},
  {P::failed, "chunk_repeat",       P::failed, "reply_err"},
  {P::failed, "chunk_layer",        P::failed, "reply_err"},
  {P::failed, "chunk_layer_again",  P::failed, "reply_err"},
  {P::failed, "chunk_other_open",   P::failed, "reply_err"},
  {P::failed, "posted",             P::failed, ""},
  {P::failed, "chunk_posted",       P::failed, ""},
  {P::failed, "pumped",             P::failed, ""},
  {P::failed, "batch_done_ok",      P::failed, ""},
  {P::failed, "batch_done_failed",  P::failed, ""},
  {P::failed, "outcome_ok",         P::failed, ""},
  {P::failed, "outcome_failed",     P::failed, ""},
  {P::failed, "outcome_stale",      P::failed, ""},
  {P::failed, "outcome_unprepared", P::failed, ""},
  {P::failed, "cancel",             P::failed, ""},
  {P::failed, "peer_down",          P::failed, ""},
  {P::failed, "expire_state",       P::failed, ""},
  {P::failed, "expire_drain",       P::failed, ""},
};
// clang-format on

}  // namespace

TEST_CASE("sender room: the table has a row for every (phase, event) pair", "[unit][sender_room]") {
  test::check_complete(all_phases, cases, table);
}

TEST_CASE("sender room: every (phase, event) pair does what its row says", "[unit][sender_room]") {
  test::check_rows(cases, table, bring_to);
}

TEST_CASE("sender room: the announcement waits for the last chunk, every post and staging",
          "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);
  CHECK(h.feed(ev::chunk{harness::chunk({101}, true)}) == "reply_ok post_chunk");
  CHECK(h.feed(ev::pumped{true}) == "");        // the post is not carried out yet
  CHECK(h.feed(ev::chunk_posted{true}) == "");  // head-sliced KV still waits for staging
  CHECK(h.feed(ev::pumped{true}) == "");
  CHECK(h.feed(ev::pumped{false}) == "announce");
  CHECK(h.feed(ev::pumped{false}) == "");  // once
  // Commits count only after the announcement; both ranks make the room succeed.
  CHECK(h.feed(ev::outcome{1, "decode1:7401", true, 101, true, errc::ok, ""}) == "");
  CHECK(h.feed(ev::outcome{2, "decode2:7401", true, 102, true, errc::ok, ""}) == "report:Success");
  CHECK(h.live.empty());
}

TEST_CASE("sender room: a commit before the announcement counts for nothing",
          "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);
  h.feed(ev::outcome{1, "decode1:7401", true, 101, true, errc::ok, ""});
  h.feed(ev::outcome{2, "decode2:7401", true, 102, true, errc::ok, ""});
  CHECK(h.m.phase() == room_phase::transferring);
  h.feed(ev::batch_done{1, 1, 0, {}});
  h.feed(ev::chunk{harness::chunk({101}, true)});
  CHECK(h.feed(ev::chunk_posted{false}) == "announce");
  CHECK(h.m.phase() == room_phase::transferring);  // the early commits did not count
}

TEST_CASE("sender room: a queued chunk that does not fit fails the room with nothing posted",
          "[unit][sender_room]") {
  harness h;
  h.feed(ev::start{});
  CHECK(h.feed(ev::chunk{harness::chunk({10})}) == "reply_ok");
  CHECK(h.feed(ev::chunk{harness::chunk({11, 12})}) == "reply_ok");  // 3 pages of 2
  h.feed(h.rank(1));
  const auto fx = h.m.on(h.rank(2));
  for (const auto& e : fx) CHECK_FALSE(std::holds_alternative<post_chunk>(e));
  CHECK(h.apply(fx) ==
        "ack_ok report:WaitingForInput tell_failed life tell_drained "
        "report:Failed");
  CHECK(h.m.lifecycle().fail_code() == errc::invalid_request);
}

TEST_CASE("sender room: the drain reports what completed, and its deadline what did not",
          "[unit][sender_room]") {
  SECTION("completed: each rank learns its counts") {
    harness h;
    bring_to(h, room_phase::transferring);
    h.feed(ev::posted{1, 2, 3, 300});
    h.feed(ev::cancel{"cancelled by the client"});
    CHECK(h.m.in_flight() == 2);
    CHECK(h.feed(ev::batch_done{1, 1, 0, {}}) == "");
    CHECK(h.feed(ev::batch_done{2, 2, 1, error{errc::fabric_write_failed, "EIO"}}) ==
          "tell_drained report:Failed");
    CHECK(h.m.links()[0].completed == 1);
    CHECK(h.m.links()[1].completed == 2);
    CHECK(h.m.links()[1].failed == 1);
    CHECK(h.m.lifecycle().fail_reason() == "cancelled by the client");
    CHECK(h.m.lifecycle().fail_code() == errc::cancelled);
  }
  SECTION("the drain deadline: Failed, saying what was still in flight") {
    harness h;
    bring_to(h, room_phase::draining);
    std::string reason;
    const auto fx = h.m.on(ev::expired{deadline_kind::drain, h.live.at(deadline_kind::drain)});
    REQUIRE(fx.size() == 1);
    const auto& l = std::get<life>(fx[0]).effects;
    CHECK(l.reason ==
          "cancelled by test; 1 write batches were still in flight after the 50 ms "
          "drain (timeouts.drain_ms)");
  }
}

TEST_CASE("sender room: refusals and failures say what was wrong", "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::bootstrapping);
  auto p = h.rank(9);
  p.prefix_tokens = 16;
  auto fx = h.m.on(p);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "room 7: decode ranks prepared different prefixes: decode1:7401 prepared 0 tokens, "
        "decode9:7401 prepared 16");
  CHECK(h.m.phase() == room_phase::failed);

  harness g;
  bring_to(g, room_phase::bootstrapping);
  auto q = g.rank(9);
  q.in_group = false;
  fx = g.m.on(q);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "decode TP rank 1 of 2 (PP stage 0) does not receive from this prefill (TP rank 0 of 1, "
        "PP stage 0)");
  fx = g.m.on(ev::chunk{harness::chunk({10})});
  CHECK(std::get<reply>(fx[0]).outcome.message ==
        "room 7: src page 10 (position 0) was already sent in an earlier chunk of this room");

  harness t;
  bring_to(t, room_phase::transferring);
  fx = t.m.on(ev::chunk{harness::chunk({300, 301, 302})});
  CHECK(std::get<reply>(fx[0]).outcome.code == errc::invalid_request);
  CHECK_THAT(std::get<reply>(fx[0]).outcome.message, Catch::StartsWith("room 7: "));
  t.feed(ev::batch_done{1, 0, 1, error{errc::fabric_write_failed, "EIO"}});
  CHECK(t.m.lifecycle().fail_reason() == "write to decode decode1:7401 failed: EIO");
  CHECK(t.m.lifecycle().fail_code() == errc::fabric_write_failed);
  fx = t.m.on(ev::chunk{harness::chunk({400})});
  CHECK(std::get<reply>(fx[0]).outcome.message == "room 7 has already ended (Failed)");
  // A prepare that reaches an ended room is answered: its decode rank waits for nothing else.
  fx = t.m.on(t.rank(9));
  CHECK(std::get<ack>(fx[0]).outcome.code == errc::fabric_write_failed);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "room 7 failed on the prefill before it took this decode's prepare: write to decode "
        "decode1:7401 failed: EIO");

  harness ok;
  bring_to(ok, room_phase::success);
  fx = ok.m.on(ok.rank(9));
  CHECK(std::get<ack>(fx[0]).outcome.code == errc::room_finished);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "room 7 succeeded on the prefill before it took this decode's prepare (every decode rank "
        "it feeds had prepared it)");

  harness d;
  bring_to(d, room_phase::draining);
  fx = d.m.on(ev::chunk{harness::chunk({400})});
  CHECK(std::get<reply>(fx[0]).outcome.code == errc::cancelled);
  CHECK(std::get<reply>(fx[0]).outcome.message ==
        "room 7 failed: cancelled by test (its writes are draining)");
  fx = d.m.on(d.rank(9));
  CHECK(std::get<ack>(fx[0]).outcome.message == "room 7 failed on the prefill: cancelled by test");

  harness x;
  bring_to(x, room_phase::waiting_for_input);
  x.expire(deadline_kind::state);
  CHECK(x.m.lifecycle().fail_reason() ==
        "timed out in WaitingForInput after 200 ms (waiting for the client's first chunk)");
  CHECK(x.m.lifecycle().fail_code() == errc::timed_out);
}

TEST_CASE("sender room: a chunk sent in layer ranges ends the room with its last range",
          "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);  // chunk {10} at position 0
  auto post_of = [](const effects& fx) {
    REQUIRE(fx.size() == 2);
    return std::get<post_chunk>(fx[1]);
  };
  auto p = post_of(h.m.on(ev::chunk{harness::layers({101}, 7, 1, true)}));
  CHECK(p.first == 1);
  CHECK(p.chunk.first_layer == 7);
  CHECK_FALSE(p.ends_room);  // the state of layer 7 goes, not the aux row
  CHECK(h.feed(ev::chunk_posted{false}) == "");
  p = post_of(h.m.on(ev::chunk{harness::layers({101}, 0, 4, true)}));
  CHECK(p.first == 1);
  CHECK_FALSE(p.ends_room);
  CHECK(h.feed(ev::chunk_posted{false}) == "");  // layer 4 is still to come: no announcement
  p = post_of(h.m.on(ev::chunk{harness::layers({101}, 4, 1, true)}));
  CHECK(p.ends_room);  // the last range of the last chunk: the aux row goes with it
  CHECK(h.feed(ev::chunk_posted{false}) == "announce");
  CHECK(std::get<reply>(h.m.on(ev::chunk{harness::layers({300}, 4, 1, true)})[0]).outcome.message ==
        "room 7: the last chunk was already sent (2 pages); no further chunk is accepted");
}

TEST_CASE("sender room: layer ranges queued before the prepares take their positions once",
          "[unit][sender_room]") {
  harness h;
  h.feed(ev::start{});
  CHECK(h.feed(ev::chunk{harness::layers({10}, 3, 5)}) == "reply_ok");  // 3, 4, 7
  CHECK(h.feed(ev::chunk{harness::layers({10}, 0, 1)}) == "reply_ok");  // 0: chunk 0 complete
  CHECK(h.feed(ev::chunk{harness::layers({11}, 0, 3, true)}) == "reply_ok");
  CHECK(h.feed(ev::chunk{harness::layers({11}, 0, 3, true)}) == "reply_err");  // layer 0 again
  CHECK(h.feed(ev::chunk{harness::layers({11}, 3, 5, true)}) == "reply_ok");
  h.feed(h.rank(1));
  const auto fx = h.m.on(h.rank(2));
  std::vector<std::pair<uint32_t, bool>> posts;  // (first, ends_room)
  for (const auto& e : fx)
    if (const auto* p = std::get_if<post_chunk>(&e)) posts.emplace_back(p->first, p->ends_room);
  CHECK(posts ==
        std::vector<std::pair<uint32_t, bool>>{{0, false}, {0, false}, {1, false}, {1, true}});
  CHECK(h.apply(fx) == "ack_ok report:WaitingForInput post_chunk post_chunk post_chunk post_chunk");
  for (int i = 0; i < 4; ++i) h.feed(ev::chunk_posted{false});
  CHECK(h.m.phase() == room_phase::transferring);  // announced: a room of no writes commits
}

TEST_CASE("sender room: layer ranges are refused with what was wrong", "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);
  auto text = [&](proto::send c) {
    const auto fx = h.m.on(ev::chunk{std::move(c)});
    REQUIRE(fx.size() == 1);
    return std::get<reply>(fx[0]).outcome.message;
  };
  h.feed(ev::chunk{harness::layers({101}, 0, 1, true)});
  CHECK(text(harness::layers({101}, 0, 8, true)) == "room 7: layer 0 of chunk 1 was already sent");
  CHECK(text(harness::layers({102}, 3, 1, true)) ==
        "room 7: chunk 1 is still open (3 of its 4 layers to send, layer 3 first): send them, "
        "naming the same pages, before another chunk");
  CHECK(text(harness::layers({101}, 3, 1)) ==
        "room 7: chunk 1 was opened with last=1; a layer range of it cannot say last=0");
  CHECK(text(harness::layers({101}, 1, 2, true)) ==
        "room 7: layers [1, 3) name none of this rank's layers");
  // A new chunk's pages may not repeat an earlier chunk's, as for whole sends.
  harness g;
  bring_to(g, room_phase::transferring);
  const auto fx = g.m.on(ev::chunk{harness::layers({10}, 0, 1)});
  CHECK(std::get<reply>(fx[0]).outcome.message ==
        "room 7: src page 10 (position 0) was already sent in an earlier chunk of this room");
}

TEST_CASE("sender room: a cancel in the middle of a layer-wise room drains its posted layers",
          "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);  // batch 1 in flight
  h.feed(ev::chunk{harness::layers({101}, 0, 4, true)});
  h.feed(ev::posted{0, 2, 2, 200});
  h.feed(ev::chunk_posted{false});
  CHECK(h.feed(ev::cancel{"cancelled by the client"}) == "tell_failed life");
  CHECK(std::get<reply>(h.m.on(ev::chunk{harness::layers({101}, 4, 4, true)})[0]).outcome.code ==
        errc::cancelled);
  CHECK(h.feed(ev::batch_done{1, 1, 0, {}}) == "");
  CHECK(h.feed(ev::batch_done{2, 2, 0, {}}) == "tell_drained report:Failed");
  CHECK(h.m.links()[0].completed == 3);
}

}  // namespace test_sender_room
