// End-to-end transfers between two real ferryd processes over libfabric on loopback.

#include <fmt/format.h>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

TEST_CASE("one request moves KV pages, one state slot and the aux row byte for byte", "[e2e]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  pair c(s);
  room_spec r;
  r.room = 0x1234567890abcdefull;
  r.src_pages = range(100, 512);
  r.dst_pages = range(2000, 512);
  r.src_slot = 1, r.dst_slot = 5;
  r.src_row = 2, r.dst_row = 9;
  run_and_verify(c, r);
  auto poll = c.d->poll(r.room);
  REQUIRE(poll);
  CHECK(poll.value.status == room_status::success);
  auto p = c.p->poll(r.room);
  REQUIRE(p);
  CHECK(p.value.status == room_status::success);
  CHECK(c.prefill.stop() == 0);
  CHECK(c.decode.stop() == 0);
}

TEST_CASE(
    "pipelined requests: four rooms prepared, subscribed and sent in one write each move "
    "byte-exact, and a refused request in the middle fails alone",
    "[e2e][pipeline]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  pair c(s);
  std::vector<room_spec> rooms(4);
  std::vector<proto::message> prepares, sends;
  for (uint32_t i = 0; i < rooms.size(); ++i) {
    auto& r = rooms[i];
    r.room = 900 + i;
    r.src_pages = range(10 + 40 * i, 33);
    r.dst_pages = range(500 + 40 * i, 33);
    r.src_slot = r.dst_slot = i;
    r.src_row = r.dst_row = i;
    stage(c, r);
    prepares.push_back(
        proto::prepare{r.room, {c.prefill.control()}, r.dst_pages, r.dst_slot, r.dst_row});
    prepares.push_back(proto::subscribe{r.room});
    sends.push_back(proto::send{r.room, r.src_pages, true, r.src_slot, r.src_row});
    if (i == 1)  // a page outside the pool: refused, and the next requests still answered
      prepares.push_back(proto::prepare{990, {c.prefill.control()}, {1u << 30}, 7, 7});
  }
  const auto prepared = c.d->pipeline(prepares);
  REQUIRE(prepared.size() == prepares.size());
  for (size_t i = 0; i < prepared.size(); ++i) {
    INFO(i << ": " << prepared[i].message);
    if (i == 4) {
      CHECK(prepared[i].code == errc::invalid_request);
      CHECK_THAT(prepared[i].message, Catch::Contains("dst page 1073741824"));
    } else {
      CHECK(prepared[i]);
    }
  }
  const auto sent = c.p->pipeline(sends);
  REQUIRE(sent.size() == sends.size());
  for (const auto& r : sent) CHECK(r);
  for (const auto& r : rooms) {
    auto e = c.d->wait_terminal(r.room, 60s);  // subscribed in the pipeline
    INFO(e.message);
    REQUIRE(e);
    INFO(e.value.reason);
    CHECK(e.value.status == room_status::success);
    CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
    CHECK(wait_done(*c.p, r.room).status == room_status::success);
  }
  // Only requests answered with ok go in a pipeline: anything else fails before it is sent.
  const auto refused = c.d->pipeline({proto::poll{900}, proto::cancel{901}});
  REQUIRE(refused.size() == 2);
  CHECK(refused[0].code == errc::invalid_request);
  CHECK(refused[0].message == "pipeline takes prepare, send, subscribe and cancel, not poll");
  CHECK(refused[1].code == errc::invalid_request);
  CHECK(c.prefill.stop() == 0);
  CHECK(c.decode.stop() == 0);
}

TEST_CASE("fragmented pages land at their positions", "[e2e]") {
  pair c;
  room_spec r;
  r.room = 7;
  r.src_pages = {10, 11, 12, 40, 41};
  r.dst_pages = {7, 8, 9, 10, 11};
  run_and_verify(c, r);
  SECTION("and a scattered list on both sides too") {
    room_spec q;
    q.room = 8;
    q.src_pages = {900, 3, 4, 5, 77, 1000, 1001};
    q.dst_pages = {60, 61, 62, 99, 98, 97, 300};
    q.src_slot = q.dst_slot = 2;
    q.src_row = q.dst_row = 3;
    run_and_verify(c, q);
  }
}

TEST_CASE("three chunks that are not page aligned, page size 16", "[e2e]") {
  shape s;
  s.page_tokens = 16;
  s.pages = 512;
  pair c(s);
  // 100 tokens = 7 pages of 16; chunk boundaries at tokens 40 and 80 round down to pages 2 and 5,
  // so the chunks carry 2, 3 and 2 pages (the last one holds the partial page).
  room_spec r;
  r.room = 300;
  r.src_pages = {50, 51, 20, 21, 22, 90, 91};
  r.dst_pages = {1, 2, 3, 4, 5, 6, 7};
  r.chunks = {2, 3, 2};
  run_and_verify(c, r);
}

TEST_CASE("a last chunk with zero pages still carries state and aux", "[e2e]") {
  pair c;
  SECTION("after earlier chunks") {
    room_spec r;
    r.room = 41;
    r.src_pages = range(0, 64);
    r.dst_pages = range(64, 64);
    r.chunks = {32, 32, 0};
    run_and_verify(c, r);
  }
  SECTION("a full prefix hit: no pages at all") {
    room_spec r;
    r.room = 42;
    r.chunks = {0};
    r.src_slot = 3, r.dst_slot = 4;
    run_and_verify(c, r);
  }
}

TEST_CASE("a send that arrives before its prepare waits for it", "[e2e]") {
  pair c;
  room_spec r;
  r.room = 55;
  r.src_pages = range(0, 100);
  r.dst_pages = range(500, 100);
  stage(c, r);
  send_chunks(c, r);
  auto st = c.p->poll(r.room);
  REQUIRE(st);
  CHECK(st.value.status == room_status::bootstrapping);
  prepare(c, r);
  REQUIRE(wait_done(*c.d, r.room).status == room_status::success);
  CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

TEST_CASE("a send whose prepare never comes fails after the bounded wait", "[e2e]") {
  shape s;
  s.bootstrapping_ms = 300;
  pair c(s);
  room_spec r;
  r.room = 56;
  r.src_pages = range(0, 4);
  stage(c, r);
  send_chunks(c, r);
  auto e = wait_done(*c.p, r.room);
  CHECK(e.status == room_status::failed);
  CHECK(e.reason == "timed out in Bootstrapping after 300 ms (waiting for the decode's prepare)");
}

TEST_CASE(
    "a prepare that arrives after its prefill room failed is refused at once, with the "
    "prefill's reason and code",
    "[e2e]") {
  pair c;
  room_spec r;
  r.room = 57;
  r.src_pages = range(0, 4);
  r.dst_pages = range(100, 4);
  stage(c, r);
  send_chunks(c, r);
  REQUIRE(c.p->cancel(r.room));
  auto p = wait_done(*c.p, r.room);
  REQUIRE(p.status == room_status::failed);
  CHECK(p.reason == "cancelled by client");
  // No decode had prepared it, so none was told. Its late prepare must not open a new room
  // that no send will feed (the decode would wait out its whole transfer_ms).
  prepare(c, r);
  auto d = wait_done(*c.d, r.room);
  CHECK(d.status == room_status::failed);
  CHECK(d.code == errc::cancelled);
  CHECK(d.reason == "prefill " + c.prefill.control() +
                        " refused the prepare: room 57 failed on "
                        "the prefill before this decode prepared it: cancelled by client");
}

TEST_CASE(
    "a prefill's cancel of a room it has not seen yet refuses the decode's later prepare at "
    "once, and the engine's next poll or send of that room clears it",
    "[e2e]") {
  shape s;
  s.waiting_for_input_ms = 600000;  // the decode must learn of the cancel, not time out
  pair c(s);
  room_spec r;
  r.room = 0x7ff0000000000001ull;
  r.src_pages = range(0, 4);
  r.dst_pages = range(100, 4);
  stage(c, r);
  // SGLang's prefill aborts before the decode's prepare reached its ferryd: nothing of the
  // room is in flight there, so the engine may reuse its memory at once (402), and ferryd
  // remembers the cancel.
  auto cancelled = c.p->cancel(r.room);
  REQUIRE_FALSE(cancelled);
  CHECK(cancelled.code == errc::unknown_room);
  CHECK(cancelled.message ==
        fmt::format("unknown room {}: nothing of it is in flight here; a decode's prepare of it "
                    "is refused for the next 600000 ms",
                    r.room));
  prepare(c, r);
  auto d = wait_done(*c.d, r.room);
  CHECK(d.status == room_status::failed);
  CHECK(d.code == errc::cancelled);
  CHECK(d.reason == fmt::format("prefill {} refused the prepare: room {} was cancelled on the "
                                "prefill before this decode prepared it",
                                c.prefill.control(), r.room));
  // SGLang bootstraps a retracted request again under the same room id: the prefill engine's
  // first poll of it clears the cancel, and the room runs.
  auto polled = c.p->poll(r.room);
  REQUIRE(polled);
  CHECK(polled.value.status == room_status::bootstrapping);
  run_and_verify(c, r);
  // A send clears it too.
  room_spec again = r;
  again.room = r.room + 1;
  stage(c, again);
  REQUIRE_FALSE(c.p->cancel(again.room));
  send_chunks(c, again);
  prepare(c, again);
  CHECK(wait_done(*c.d, again.room).status == room_status::success);
  CHECK(client::verify_room(*c.d, again.room, again.dst_pages, again.dst_slot, again.dst_row)
            .message == "");
}

TEST_CASE("64 concurrent rooms all commit with their own bytes", "[e2e]") {
  // The engine posts each peer's shortest batch first; with fabric.max_inflight_bytes it also
  // holds a peer's writes at that many bytes in flight (4096: every write goes out alone).
  auto [provider, bound] =
      GENERATE(table<std::string, uint64_t>({{"tcp", 0}, {"tcp", 4096}, {"shm", 65536}}));
  require_provider(provider);
  shape s;
  s.provider = provider;
  s.max_inflight_bytes = bound;
  s.slots = 64;
  s.temporal_heads = 2;
  pair c(s);
  constexpr uint32_t rooms = 64, pages = 48;
  std::vector<room_spec> specs;
  for (uint32_t i = 0; i < rooms; ++i) {
    room_spec r;
    r.room = 1000 + i;
    r.src_pages = range(i * pages, pages);
    r.dst_pages = range((rooms - 1 - i) * pages, pages);  // reversed placement on decode
    r.src_slot = i, r.dst_slot = rooms - 1 - i;
    r.src_row = i, r.dst_row = (i + 7) % rooms;
    r.chunks = {16, 16, 16};
    stage(c, r);
    specs.push_back(r);
  }
  for (auto& r : specs) prepare(c, r);
  for (auto& r : specs) REQUIRE(c.d->subscribe(r.room));
  // Interleave the chunks of all rooms, as a batching scheduler would.
  for (uint32_t k = 0; k < 3; ++k)
    for (auto& r : specs) {
      const bool last = k == 2;
      std::vector<uint32_t> pg(r.src_pages.begin() + 16 * k, r.src_pages.begin() + 16 * (k + 1));
      auto ok =
          c.p->send({r.room, pg, last, last ? r.src_slot : no_index, last ? r.src_row : no_index});
      INFO(ok.message);
      REQUIRE(ok);
    }
  for (auto& r : specs) {
    auto e = c.d->wait_terminal(r.room, 60s);
    REQUIRE(e);
    INFO(e.value.reason);
    REQUIRE(e.value.status == room_status::success);
  }
  for (auto& r : specs)
    CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

TEST_CASE("a room id may be reused after its terminal state", "[e2e]") {
  pair c;
  room_spec r;
  r.room = 500;
  r.src_pages = range(0, 16);
  r.dst_pages = range(100, 16);
  run_and_verify(c, r);
  // Same id, other pages and slots: a new incarnation with its own bytes and outcome.
  room_spec again = r;
  again.src_pages = range(40, 8);
  again.dst_pages = range(300, 8);
  again.src_slot = 2, again.dst_slot = 3;
  again.src_row = 4, again.dst_row = 5;
  stage(c, again);
  prepare(c, again);
  // On the prefill, a send for a reused id is told apart from a late send of the old
  // incarnation once it holds the new prepare: wait for that first.
  wait_status(*c.d, again.room, room_status::waiting_for_input);
  send_chunks(c, again);
  REQUIRE(wait_done(*c.d, again.room).status == room_status::success);
  REQUIRE(wait_done(*c.p, again.room).status == room_status::success);
  CHECK(client::verify_room(*c.d, again.room, again.dst_pages, again.dst_slot, again.dst_row)
            .message == "");
  auto p = c.d->poll(500);
  REQUIRE(p);
  CHECK(p.value.status == room_status::success);
}
