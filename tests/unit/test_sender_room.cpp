// core/sender_room.hpp: every (phase, event) pair of a prefill room, table-driven; a test
// enumerates the pairs so one without its row fails. The room feeds two decode ranks (a TP1
// prefill, TP2 decode) of two pages, and its rank holds layers 0, 3, 4 and 7; the tests after
// the table cover the announcement, layer-wise sends, the drain and the reasons.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "core/sender_room.hpp"

using namespace ferry;
using namespace ferry::sender;

namespace {

constexpr lifecycle_limits limits{100, 200, 300, 1000, 50};

/// Applies effects the way the actor does: one live deadline per kind, by generation.
struct harness {
  room m{7, limits, 0, 1, 0, {0, 3, 4, 7}};
  std::map<deadline_kind, uint64_t> live;

  std::string apply(const effects& fx) {
    std::string s;
    auto add = [&](const std::string& n) { s += (s.empty() ? "" : " ") + n; };
    for (const auto& e : fx)
      std::visit(
          [&](const auto& x) {
            using E = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<E, reply>) add(x.outcome ? "reply_ok" : "reply_err");
            if constexpr (std::is_same_v<E, ack>) add(x.outcome ? "ack_ok" : "ack_err");
            if constexpr (std::is_same_v<E, post_chunk>) add("post_chunk");
            if constexpr (std::is_same_v<E, pump>) add("pump");
            if constexpr (std::is_same_v<E, announce>) add("announce");
            if constexpr (std::is_same_v<E, tell_failed>) add("tell_failed");
            if constexpr (std::is_same_v<E, tell_drained>) add("tell_drained");
            if constexpr (std::is_same_v<E, life>) {
              for (auto k : x.effects.cancel) REQUIRE(live.erase(k) == 1);
              for (const auto& a : x.effects.arm) live[a.kind] = a.generation;
              if (x.effects.quit) REQUIRE(live.empty());  // an ended room leaves no deadline
              add(x.effects.report ? std::string("report:") + to_string(*x.effects.report)
                                   : "life");
            }
          },
          e);
    return s;
  }

  prepare_in rank(uint64_t link) {
    prepare_in p;
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
  std::string expire(deadline_kind k) {
    const auto it = live.find(k);
    const uint64_t gen = it == live.end() ? 12345 : it->second;  // not armed: any is stale
    auto fx = m.expired(k, gen);
    if (!fx.empty()) live.erase(k);
    return apply(fx);
  }
};

enum class ev {
  prepare_new,
  prepare_mismatch,
  prepare_bad_indices,
  prepare_out_of_group,
  prepare_again,
  chunk,
  chunk_last,
  chunk_overrun,
  chunk_repeat,
  chunk_layer,
  chunk_layer_again,
  chunk_other_open,
  posted,
  chunk_posted,
  pumped,
  batch_done_ok,
  batch_done_failed,
  outcome_ok,
  outcome_failed,
  outcome_stale,
  outcome_unprepared,
  cancel,
  peer_down,
  expire_state,
  expire_drain,
};
constexpr ev all_events[] = {ev::prepare_new,
                             ev::prepare_mismatch,
                             ev::prepare_bad_indices,
                             ev::prepare_out_of_group,
                             ev::prepare_again,
                             ev::chunk,
                             ev::chunk_last,
                             ev::chunk_overrun,
                             ev::chunk_repeat,
                             ev::chunk_layer,
                             ev::chunk_layer_again,
                             ev::chunk_other_open,
                             ev::posted,
                             ev::chunk_posted,
                             ev::pumped,
                             ev::batch_done_ok,
                             ev::batch_done_failed,
                             ev::outcome_ok,
                             ev::outcome_failed,
                             ev::outcome_stale,
                             ev::outcome_unprepared,
                             ev::cancel,
                             ev::peer_down,
                             ev::expire_state,
                             ev::expire_drain};
const char* name(ev e) {
  static const char* names[] = {"prepare_new",
                                "prepare_mismatch",
                                "prepare_bad_indices",
                                "prepare_out_of_group",
                                "prepare_again",
                                "chunk",
                                "chunk_last",
                                "chunk_overrun",
                                "chunk_repeat",
                                "chunk_layer",
                                "chunk_layer_again",
                                "chunk_other_open",
                                "posted",
                                "chunk_posted",
                                "pumped",
                                "batch_done_ok",
                                "batch_done_failed",
                                "outcome_ok",
                                "outcome_failed",
                                "outcome_stale",
                                "outcome_unprepared",
                                "cancel",
                                "peer_down",
                                "expire_state",
                                "expire_drain"};
  return names[static_cast<int>(e)];
}
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
  h.apply(h.m.start());
  h.apply(h.m.chunk(harness::chunk({10})));
  h.apply(h.m.prepare(h.rank(1)));
  if (p == room_phase::failed) {
    h.apply(h.m.cancel("cancelled by test"));
  } else if (p != room_phase::bootstrapping) {
    h.apply(h.m.prepare(h.rank(2)));
    h.apply(h.m.chunk_posted(false));
    if (p != room_phase::waiting_for_input) {
      h.apply(h.m.posted(0, 1, 1, 100));
      if (p == room_phase::draining) h.apply(h.m.cancel("cancelled by test"));
      if (p == room_phase::success) {
        h.apply(h.m.batch_done(1, 1, 0, {}));
        h.apply(h.m.pumped(false));
        h.apply(h.m.chunk(harness::chunk({101}, true)));
        REQUIRE(h.apply(h.m.chunk_posted(false)) == "announce");
        h.apply(h.m.outcome(1, "decode1:7401", true, 101, true, errc::ok, ""));
        h.apply(h.m.outcome(2, "decode2:7401", true, 102, true, errc::ok, ""));
      }
    }
  }
  REQUIRE(std::string(to_string(h.m.phase())) == to_string(p));
}

std::string run(harness& h, ev e) {
  const bool ready = h.m.ready();
  switch (e) {
    case ev::prepare_new:
      return h.apply(h.m.prepare(h.rank(9)));
    case ev::prepare_mismatch: {
      auto p = h.rank(9);
      p.pages = 3;
      return h.apply(h.m.prepare(p));
    }
    case ev::prepare_bad_indices: {
      auto p = h.rank(9);
      p.indices = error{errc::invalid_request, "room 7: decode dst page 99 is outside"};
      return h.apply(h.m.prepare(p));
    }
    case ev::prepare_out_of_group: {
      auto p = h.rank(9);
      p.in_group = false;
      return h.apply(h.m.prepare(p));
    }
    case ev::prepare_again:
      return h.apply(h.m.prepare(h.rank(1)));
    case ev::chunk:
      return h.apply(h.m.chunk(harness::chunk({200})));
    case ev::chunk_last:  // exactly the pages left
      return h.apply(
          h.m.chunk(ready ? harness::chunk({101}, true) : harness::chunk({100, 101}, true)));
    case ev::chunk_overrun:
      return h.apply(h.m.chunk(harness::chunk({300, 301, 302})));
    case ev::chunk_repeat:
      return h.apply(h.m.chunk(harness::chunk({10})));
    case ev::chunk_layer:  // layers 0 and 3 of a new chunk: it opens, not complete
      return h.apply(h.m.chunk(harness::layers({200}, 0, 4)));
    case ev::chunk_layer_again:  // layer 0 of a new chunk, then layer 0 again: the second
      h.apply(h.m.chunk(harness::layers({200}, 0, 1)));
      return h.apply(h.m.chunk(harness::layers({200}, 0, 1)));
    case ev::chunk_other_open:  // layer 0 of a new chunk, then another chunk: the second
      h.apply(h.m.chunk(harness::layers({200}, 0, 1)));
      return h.apply(h.m.chunk(harness::layers({201}, 3, 1)));
    case ev::posted:
      return h.apply(h.m.posted(0, 7, 1, 50));
    case ev::chunk_posted:
      return h.apply(h.m.chunk_posted(false));
    case ev::pumped:
      return h.apply(h.m.pumped(true));
    case ev::batch_done_ok:
      return h.apply(h.m.batch_done(1, 1, 0, {}));
    case ev::batch_done_failed:
      return h.apply(h.m.batch_done(1, 0, 1, error{errc::fabric_write_failed, "EIO"}));
    case ev::outcome_ok:
      return h.apply(h.m.outcome(1, "decode1:7401", true, 101, true, errc::ok, ""));
    case ev::outcome_failed:
      return h.apply(
          h.m.outcome(1, "decode1:7401", true, 101, false, errc::peer_lost, "its client left"));
    case ev::outcome_stale:
      return h.apply(h.m.outcome(1, "decode1:7401", true, 999, false, errc::peer_lost, "old"));
    case ev::outcome_unprepared:
      return h.apply(
          h.m.outcome(9, "decode9:7401", true, 109, false, errc::cancelled, "cancelled there"));
    case ev::cancel:
      return h.apply(h.m.cancel("cancelled by the client"));
    case ev::peer_down:
      return h.apply(h.m.peer_down(errc::peer_lost, "peer decode1:7401 lost"));
    case ev::expire_state:
      return h.expire(deadline_kind::state);
    case ev::expire_drain:
      return h.expire(deadline_kind::drain);
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

// What failing does, by whether a batch is in flight: with none the room reports Failed at
// once; with one it drains (its state and room deadlines cancelled, the drain's armed).
constexpr const char* fails_now = "tell_failed life tell_drained report:Failed";
constexpr const char* fails_draining = "tell_failed life";

// clang-format off
const row table[] = {
  // Bootstrapping: rank 1 of 2 prepared, chunk {10} queued.
  {P::bootstrapping, ev::prepare_new,          P::waiting_for_input, "ack_ok report:WaitingForInput post_chunk"},
  {P::bootstrapping, ev::prepare_mismatch,     P::failed, "ack_err tell_failed life tell_drained report:Failed"},
  {P::bootstrapping, ev::prepare_bad_indices,  P::bootstrapping, "ack_err"},
  {P::bootstrapping, ev::prepare_out_of_group, P::bootstrapping, "ack_err"},
  {P::bootstrapping, ev::prepare_again,        P::bootstrapping, "ack_err"},
  {P::bootstrapping, ev::chunk,                P::bootstrapping, "reply_ok"},  // queued
  {P::bootstrapping, ev::chunk_last,           P::bootstrapping, "reply_ok"},
  {P::bootstrapping, ev::chunk_overrun,        P::bootstrapping, "reply_ok"},  // checked once ready
  {P::bootstrapping, ev::chunk_repeat,         P::bootstrapping, "reply_err"},
  {P::bootstrapping, ev::chunk_layer,          P::bootstrapping, "reply_ok"},
  {P::bootstrapping, ev::chunk_layer_again,    P::bootstrapping, "reply_err"},
  {P::bootstrapping, ev::chunk_other_open,     P::bootstrapping, "reply_err"},
  {P::bootstrapping, ev::posted,               P::bootstrapping, ""},  // nothing can post yet
  {P::bootstrapping, ev::chunk_posted,         P::bootstrapping, ""},
  {P::bootstrapping, ev::pumped,               P::bootstrapping, ""},
  {P::bootstrapping, ev::batch_done_ok,        P::bootstrapping, "pump"},
  {P::bootstrapping, ev::batch_done_failed,    P::failed, fails_now},
  {P::bootstrapping, ev::outcome_ok,           P::bootstrapping, ""},  // before the announcement
  {P::bootstrapping, ev::outcome_failed,       P::failed, fails_now},
  {P::bootstrapping, ev::outcome_stale,        P::bootstrapping, ""},
  {P::bootstrapping, ev::outcome_unprepared,   P::failed, fails_now},
  {P::bootstrapping, ev::cancel,               P::failed, fails_now},
  {P::bootstrapping, ev::peer_down,            P::failed, fails_now},
  {P::bootstrapping, ev::expire_state,         P::failed, fails_now},
  {P::bootstrapping, ev::expire_drain,         P::bootstrapping, ""},
  // WaitingForInput: both ranks prepared, chunk {10} taken, no batch yet.
  {P::waiting_for_input, ev::prepare_new,          P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, ev::prepare_mismatch,     P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, ev::prepare_bad_indices,  P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, ev::prepare_out_of_group, P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, ev::prepare_again,        P::waiting_for_input, "ack_err"},
  {P::waiting_for_input, ev::chunk,                P::waiting_for_input, "reply_ok post_chunk"},
  {P::waiting_for_input, ev::chunk_last,           P::waiting_for_input, "reply_ok post_chunk"},
  {P::waiting_for_input, ev::chunk_overrun,        P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, ev::chunk_repeat,         P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, ev::chunk_layer,          P::waiting_for_input, "reply_ok post_chunk"},
  {P::waiting_for_input, ev::chunk_layer_again,    P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, ev::chunk_other_open,     P::waiting_for_input, "reply_err"},
  {P::waiting_for_input, ev::posted,               P::transferring, "report:Transferring"},
  {P::waiting_for_input, ev::chunk_posted,         P::waiting_for_input, ""},
  {P::waiting_for_input, ev::pumped,               P::waiting_for_input, ""},
  {P::waiting_for_input, ev::batch_done_ok,        P::waiting_for_input, "pump"},
  {P::waiting_for_input, ev::batch_done_failed,    P::failed, fails_now},
  {P::waiting_for_input, ev::outcome_ok,           P::waiting_for_input, ""},
  {P::waiting_for_input, ev::outcome_failed,       P::failed, fails_now},
  {P::waiting_for_input, ev::outcome_stale,        P::waiting_for_input, ""},
  {P::waiting_for_input, ev::outcome_unprepared,   P::failed, fails_now},
  {P::waiting_for_input, ev::cancel,               P::failed, fails_now},
  {P::waiting_for_input, ev::peer_down,            P::failed, fails_now},
  {P::waiting_for_input, ev::expire_state,         P::failed, fails_now},
  {P::waiting_for_input, ev::expire_drain,         P::waiting_for_input, ""},
  // Transferring: batch 1 in flight.
  {P::transferring, ev::prepare_new,          P::transferring, "ack_err"},
  {P::transferring, ev::prepare_mismatch,     P::transferring, "ack_err"},
  {P::transferring, ev::prepare_bad_indices,  P::transferring, "ack_err"},
  {P::transferring, ev::prepare_out_of_group, P::transferring, "ack_err"},
  {P::transferring, ev::prepare_again,        P::transferring, "ack_err"},
  {P::transferring, ev::chunk,                P::transferring, "reply_ok post_chunk"},
  {P::transferring, ev::chunk_last,           P::transferring, "reply_ok post_chunk"},
  {P::transferring, ev::chunk_overrun,        P::transferring, "reply_err"},
  {P::transferring, ev::chunk_repeat,         P::transferring, "reply_err"},
  {P::transferring, ev::chunk_layer,          P::transferring, "reply_ok post_chunk"},
  {P::transferring, ev::chunk_layer_again,    P::transferring, "reply_err"},
  {P::transferring, ev::chunk_other_open,     P::transferring, "reply_err"},
  {P::transferring, ev::posted,               P::transferring, ""},
  {P::transferring, ev::chunk_posted,         P::transferring, ""},
  {P::transferring, ev::pumped,               P::transferring, ""},
  {P::transferring, ev::batch_done_ok,        P::transferring, "pump"},
  {P::transferring, ev::batch_done_failed,    P::failed, fails_now},  // the failed batch was the last
  {P::transferring, ev::outcome_ok,           P::transferring, ""},
  {P::transferring, ev::outcome_failed,       P::draining, fails_draining},
  {P::transferring, ev::outcome_stale,        P::transferring, ""},
  {P::transferring, ev::outcome_unprepared,   P::draining, fails_draining},
  {P::transferring, ev::cancel,               P::draining, fails_draining},
  {P::transferring, ev::peer_down,            P::draining, fails_draining},
  {P::transferring, ev::expire_state,         P::draining, fails_draining},
  {P::transferring, ev::expire_drain,         P::transferring, ""},
  // Draining: only batch 1's completion or the drain deadline end it.
  {P::draining, ev::prepare_new,          P::draining, "ack_err"},
  {P::draining, ev::prepare_mismatch,     P::draining, "ack_err"},
  {P::draining, ev::prepare_bad_indices,  P::draining, "ack_err"},
  {P::draining, ev::prepare_out_of_group, P::draining, "ack_err"},
  {P::draining, ev::prepare_again,        P::draining, "ack_err"},
  {P::draining, ev::chunk,                P::draining, "reply_err"},
  {P::draining, ev::chunk_last,           P::draining, "reply_err"},
  {P::draining, ev::chunk_overrun,        P::draining, "reply_err"},
  {P::draining, ev::chunk_repeat,         P::draining, "reply_err"},
  {P::draining, ev::chunk_layer,          P::draining, "reply_err"},
  {P::draining, ev::chunk_layer_again,    P::draining, "reply_err"},
  {P::draining, ev::chunk_other_open,     P::draining, "reply_err"},
  {P::draining, ev::posted,               P::draining, ""},
  {P::draining, ev::chunk_posted,         P::draining, ""},
  {P::draining, ev::pumped,               P::draining, ""},
  {P::draining, ev::batch_done_ok,        P::failed, "tell_drained report:Failed"},
  {P::draining, ev::batch_done_failed,    P::failed, "tell_drained report:Failed"},
  {P::draining, ev::outcome_ok,           P::draining, ""},
  {P::draining, ev::outcome_failed,       P::draining, ""},
  {P::draining, ev::outcome_stale,        P::draining, ""},
  {P::draining, ev::outcome_unprepared,   P::draining, ""},
  {P::draining, ev::cancel,               P::draining, ""},
  {P::draining, ev::peer_down,            P::draining, ""},
  {P::draining, ev::expire_state,         P::draining, ""},  // cancelled by the failure
  {P::draining, ev::expire_drain,         P::failed, "report:Failed"},  // no drained count
  // Terminal: the actor has ended; a prepare or chunk that still reaches the machine is refused.
  {P::success, ev::prepare_new,          P::success, "ack_err"},
  {P::success, ev::prepare_mismatch,     P::success, "ack_err"},
  {P::success, ev::prepare_bad_indices,  P::success, "ack_err"},
  {P::success, ev::prepare_out_of_group, P::success, "ack_err"},
  {P::success, ev::prepare_again,        P::success, "ack_err"},
  {P::success, ev::chunk,                P::success, "reply_err"},
  {P::success, ev::chunk_last,           P::success, "reply_err"},
  {P::success, ev::chunk_overrun,        P::success, "reply_err"},
  {P::success, ev::chunk_repeat,         P::success, "reply_err"},
  {P::success, ev::chunk_layer,          P::success, "reply_err"},
  {P::success, ev::chunk_layer_again,    P::success, "reply_err"},
  {P::success, ev::chunk_other_open,     P::success, "reply_err"},
  {P::success, ev::posted,               P::success, ""},
  {P::success, ev::chunk_posted,         P::success, ""},
  {P::success, ev::pumped,               P::success, ""},
  {P::success, ev::batch_done_ok,        P::success, ""},
  {P::success, ev::batch_done_failed,    P::success, ""},
  {P::success, ev::outcome_ok,           P::success, ""},
  {P::success, ev::outcome_failed,       P::success, ""},
  {P::success, ev::outcome_stale,        P::success, ""},
  {P::success, ev::outcome_unprepared,   P::success, ""},
  {P::success, ev::cancel,               P::success, ""},
  {P::success, ev::peer_down,            P::success, ""},
  {P::success, ev::expire_state,         P::success, ""},
  {P::success, ev::expire_drain,         P::success, ""},
  {P::failed, ev::prepare_new,          P::failed, "ack_err"},
  {P::failed, ev::prepare_mismatch,     P::failed, "ack_err"},
  {P::failed, ev::prepare_bad_indices,  P::failed, "ack_err"},
  {P::failed, ev::prepare_out_of_group, P::failed, "ack_err"},
  {P::failed, ev::prepare_again,        P::failed, "ack_err"},
  {P::failed, ev::chunk,                P::failed, "reply_err"},
  {P::failed, ev::chunk_last,           P::failed, "reply_err"},
  {P::failed, ev::chunk_overrun,        P::failed, "reply_err"},
  {P::failed, ev::chunk_repeat,         P::failed, "reply_err"},
  {P::failed, ev::chunk_layer,          P::failed, "reply_err"},
  {P::failed, ev::chunk_layer_again,    P::failed, "reply_err"},
  {P::failed, ev::chunk_other_open,     P::failed, "reply_err"},
  {P::failed, ev::posted,               P::failed, ""},
  {P::failed, ev::chunk_posted,         P::failed, ""},
  {P::failed, ev::pumped,               P::failed, ""},
  {P::failed, ev::batch_done_ok,        P::failed, ""},
  {P::failed, ev::batch_done_failed,    P::failed, ""},
  {P::failed, ev::outcome_ok,           P::failed, ""},
  {P::failed, ev::outcome_failed,       P::failed, ""},
  {P::failed, ev::outcome_stale,        P::failed, ""},
  {P::failed, ev::outcome_unprepared,   P::failed, ""},
  {P::failed, ev::cancel,               P::failed, ""},
  {P::failed, ev::peer_down,            P::failed, ""},
  {P::failed, ev::expire_state,         P::failed, ""},
  {P::failed, ev::expire_drain,         P::failed, ""},
};
// clang-format on

}  // namespace

TEST_CASE("sender room: the table has a row for every (phase, event) pair", "[unit][sender_room]") {
  std::set<std::pair<room_phase, ev>> seen;
  for (const auto& r : table) REQUIRE(seen.insert({r.phase, r.e}).second);  // each once
  for (auto p : all_phases)
    for (auto e : all_events) {
      INFO(to_string(p) << " x " << name(e));
      CHECK(seen.count({p, e}) == 1);
    }
}

TEST_CASE("sender room: every (phase, event) pair does what its row says", "[unit][sender_room]") {
  for (const auto& r : table) {
    INFO(to_string(r.phase) << " x " << name(r.e));
    harness h;
    bring_to(h, r.phase);
    CHECK(run(h, r.e) == r.fx);
    CHECK(std::string(to_string(h.m.phase())) == to_string(r.next));
    if (h.m.lifecycle().terminal()) CHECK(h.live.empty());
  }
}

TEST_CASE("sender room: the announcement waits for the last chunk, every post and staging",
          "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);
  CHECK(h.apply(h.m.chunk(harness::chunk({101}, true))) == "reply_ok post_chunk");
  CHECK(h.apply(h.m.pumped(true)) == "");        // the post is not carried out yet
  CHECK(h.apply(h.m.chunk_posted(true)) == "");  // head-sliced KV still waits for staging
  CHECK(h.apply(h.m.pumped(true)) == "");
  CHECK(h.apply(h.m.pumped(false)) == "announce");
  CHECK(h.apply(h.m.pumped(false)) == "");  // once
  // Commits count only after the announcement; both ranks make the room succeed.
  CHECK(h.apply(h.m.outcome(1, "decode1:7401", true, 101, true, errc::ok, "")) == "");
  CHECK(h.apply(h.m.outcome(2, "decode2:7401", true, 102, true, errc::ok, "")) == "report:Success");
  CHECK(h.live.empty());
}

TEST_CASE("sender room: a commit before the announcement counts for nothing",
          "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);
  h.apply(h.m.outcome(1, "decode1:7401", true, 101, true, errc::ok, ""));
  h.apply(h.m.outcome(2, "decode2:7401", true, 102, true, errc::ok, ""));
  CHECK(h.m.phase() == room_phase::transferring);
  h.apply(h.m.batch_done(1, 1, 0, {}));
  h.apply(h.m.chunk(harness::chunk({101}, true)));
  CHECK(h.apply(h.m.chunk_posted(false)) == "announce");
  CHECK(h.m.phase() == room_phase::transferring);  // the early commits did not count
}

TEST_CASE("sender room: a queued chunk that does not fit fails the room with nothing posted",
          "[unit][sender_room]") {
  harness h;
  h.apply(h.m.start());
  CHECK(h.apply(h.m.chunk(harness::chunk({10}))) == "reply_ok");
  CHECK(h.apply(h.m.chunk(harness::chunk({11, 12}))) == "reply_ok");  // 3 pages of 2
  h.apply(h.m.prepare(h.rank(1)));
  const auto fx = h.m.prepare(h.rank(2));
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
    h.apply(h.m.posted(1, 2, 3, 300));
    h.apply(h.m.cancel("cancelled by the client"));
    CHECK(h.m.in_flight() == 2);
    CHECK(h.apply(h.m.batch_done(1, 1, 0, {})) == "");
    CHECK(h.apply(h.m.batch_done(2, 2, 1, error{errc::fabric_write_failed, "EIO"})) ==
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
    const auto fx = h.m.expired(deadline_kind::drain, h.live.at(deadline_kind::drain));
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
  auto fx = h.m.prepare(p);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "room 7: decode ranks prepared different prefixes: decode1:7401 prepared 0 tokens, "
        "decode9:7401 prepared 16");
  CHECK(h.m.phase() == room_phase::failed);

  harness g;
  bring_to(g, room_phase::bootstrapping);
  auto q = g.rank(9);
  q.in_group = false;
  fx = g.m.prepare(q);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "decode TP rank 1 of 2 (PP stage 0) does not receive from this prefill (TP rank 0 of 1, "
        "PP stage 0)");
  fx = g.m.chunk(harness::chunk({10}));
  CHECK(std::get<reply>(fx[0]).outcome.message ==
        "room 7: src page 10 (position 0) was already sent in an earlier chunk of this room");

  harness t;
  bring_to(t, room_phase::transferring);
  fx = t.m.chunk(harness::chunk({300, 301, 302}));
  CHECK(std::get<reply>(fx[0]).outcome.code == errc::invalid_request);
  CHECK_THAT(std::get<reply>(fx[0]).outcome.message, Catch::StartsWith("room 7: "));
  t.apply(t.m.batch_done(1, 0, 1, error{errc::fabric_write_failed, "EIO"}));
  CHECK(t.m.lifecycle().fail_reason() == "write to decode decode1:7401 failed: EIO");
  CHECK(t.m.lifecycle().fail_code() == errc::fabric_write_failed);
  fx = t.m.chunk(harness::chunk({400}));
  CHECK(std::get<reply>(fx[0]).outcome.message == "room 7 has already ended (Failed)");
  // A prepare that reaches an ended room is answered: its decode rank waits for nothing else.
  fx = t.m.prepare(t.rank(9));
  CHECK(std::get<ack>(fx[0]).outcome.code == errc::fabric_write_failed);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "room 7 failed on the prefill before it took this decode's prepare: write to decode "
        "decode1:7401 failed: EIO");

  harness ok;
  bring_to(ok, room_phase::success);
  fx = ok.m.prepare(ok.rank(9));
  CHECK(std::get<ack>(fx[0]).outcome.code == errc::room_finished);
  CHECK(std::get<ack>(fx[0]).outcome.message ==
        "room 7 succeeded on the prefill before it took this decode's prepare (every decode rank "
        "it feeds had prepared it)");

  harness d;
  bring_to(d, room_phase::draining);
  fx = d.m.chunk(harness::chunk({400}));
  CHECK(std::get<reply>(fx[0]).outcome.code == errc::cancelled);
  CHECK(std::get<reply>(fx[0]).outcome.message ==
        "room 7 failed: cancelled by test (its writes are draining)");
  fx = d.m.prepare(d.rank(9));
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
  auto p = post_of(h.m.chunk(harness::layers({101}, 7, 1, true)));
  CHECK(p.first == 1);
  CHECK(p.chunk.first_layer == 7);
  CHECK_FALSE(p.ends_room);  // the state of layer 7 goes, not the aux row
  CHECK(h.apply(h.m.chunk_posted(false)) == "");
  p = post_of(h.m.chunk(harness::layers({101}, 0, 4, true)));
  CHECK(p.first == 1);
  CHECK_FALSE(p.ends_room);
  CHECK(h.apply(h.m.chunk_posted(false)) == "");  // layer 4 is still to come: no announcement
  p = post_of(h.m.chunk(harness::layers({101}, 4, 1, true)));
  CHECK(p.ends_room);  // the last range of the last chunk: the aux row goes with it
  CHECK(h.apply(h.m.chunk_posted(false)) == "announce");
  CHECK(std::get<reply>(h.m.chunk(harness::layers({300}, 4, 1, true))[0]).outcome.message ==
        "room 7: the last chunk was already sent (2 pages); no further chunk is accepted");
}

TEST_CASE("sender room: layer ranges queued before the prepares take their positions once",
          "[unit][sender_room]") {
  harness h;
  h.apply(h.m.start());
  CHECK(h.apply(h.m.chunk(harness::layers({10}, 3, 5))) == "reply_ok");  // 3, 4, 7
  CHECK(h.apply(h.m.chunk(harness::layers({10}, 0, 1))) == "reply_ok");  // 0: chunk 0 complete
  CHECK(h.apply(h.m.chunk(harness::layers({11}, 0, 3, true))) == "reply_ok");
  CHECK(h.apply(h.m.chunk(harness::layers({11}, 0, 3, true))) == "reply_err");  // layer 0 again
  CHECK(h.apply(h.m.chunk(harness::layers({11}, 3, 5, true))) == "reply_ok");
  h.apply(h.m.prepare(h.rank(1)));
  const auto fx = h.m.prepare(h.rank(2));
  std::vector<std::pair<uint32_t, bool>> posts;  // (first, ends_room)
  for (const auto& e : fx)
    if (const auto* p = std::get_if<post_chunk>(&e)) posts.emplace_back(p->first, p->ends_room);
  CHECK(posts ==
        std::vector<std::pair<uint32_t, bool>>{{0, false}, {0, false}, {1, false}, {1, true}});
  CHECK(h.apply(fx) == "ack_ok report:WaitingForInput post_chunk post_chunk post_chunk post_chunk");
  for (int i = 0; i < 4; ++i) h.apply(h.m.chunk_posted(false));
  CHECK(h.m.phase() == room_phase::transferring);  // announced: a room of no writes commits
}

TEST_CASE("sender room: layer ranges are refused with what was wrong", "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);
  auto text = [&](proto::send c) {
    const auto fx = h.m.chunk(std::move(c));
    REQUIRE(fx.size() == 1);
    return std::get<reply>(fx[0]).outcome.message;
  };
  h.apply(h.m.chunk(harness::layers({101}, 0, 1, true)));
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
  const auto fx = g.m.chunk(harness::layers({10}, 0, 1));
  CHECK(std::get<reply>(fx[0]).outcome.message ==
        "room 7: src page 10 (position 0) was already sent in an earlier chunk of this room");
}

TEST_CASE("sender room: a cancel in the middle of a layer-wise room drains its posted layers",
          "[unit][sender_room]") {
  harness h;
  bring_to(h, room_phase::transferring);  // batch 1 in flight
  h.apply(h.m.chunk(harness::layers({101}, 0, 4, true)));
  h.apply(h.m.posted(0, 2, 2, 200));
  h.apply(h.m.chunk_posted(false));
  CHECK(h.apply(h.m.cancel("cancelled by the client")) == "tell_failed life");
  CHECK(std::get<reply>(h.m.chunk(harness::layers({101}, 4, 4, true))[0]).outcome.code ==
        errc::cancelled);
  CHECK(h.apply(h.m.batch_done(1, 1, 0, {})) == "");
  CHECK(h.apply(h.m.batch_done(2, 2, 0, {})) == "tell_drained report:Failed");
  CHECK(h.m.links()[0].completed == 3);
}
