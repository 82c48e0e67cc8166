// A stop that drains (SIGTERM): the rooms a daemon accepted before it finish, byte for byte;
// new rooms on it, or naming it, fail at once with 407 draining, never "lost"; a restarted
// prefill serves the rooms refused meanwhile; a second signal or timeouts.stop_ms ends it, and
// a stop so forced, with rooms still active, exits with its own code (forced_stop).

#include <fmt/format.h>

#include <thread>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;
using namespace std::chrono_literals;

namespace {

room_spec two_chunk_room(uint64_t id, uint32_t k) {
  room_spec r;
  r.room = id;
  r.src_pages = range(64 * k, 64);
  r.dst_pages = range(2000 + 64 * k, 64);
  r.chunks = {32, 32};
  r.src_slot = r.dst_slot = k;
  r.src_row = r.dst_row = k;
  return r;
}

}  // namespace

TEST_CASE(
    "a prefill restarted under load loses no accepted room, and the rooms refused meanwhile "
    "fail at once with 407 and succeed after the restart",
    "[e2e][drain]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  pair c(s);
  // Four rooms in flight on both sides: prepared, and half their pages written.
  std::vector<room_spec> accepted;
  for (uint32_t k = 0; k < 4; ++k) {
    accepted.push_back(two_chunk_room(600 + k, k));
    stage(c, accepted.back());
    prepare(c, accepted.back());
    send_chunk(*c.p, accepted.back(), 0);
  }
  for (const auto& r : accepted) {
    wait_status(*c.d, r.room, room_status::transferring);
    REQUIRE(c.p->subscribe(r.room));  // its outcome arrives before the prefill exits
  }

  c.prefill.drain();
  REQUIRE(log_shows(c.decode, "is draining"));
  CHECK(log_shows(c.prefill, "draining: 4 prefill and 0 decode rooms accepted"));
  // The decode shows its peer draining (the Scheduler knew before the log line was written).
  const auto peers = info_of(*c.d, proto::info_topic::peers);
  REQUIRE(peers.size() == 1);
  CHECK(peers[0]["state"] == "draining");

  // New rooms naming the draining prefill fail at once, with its reason and 407.
  std::vector<room_spec> refused;
  for (uint32_t k = 4; k < 6; ++k) {
    refused.push_back(two_chunk_room(600 + k, k));
    prepare(c, refused.back());
    auto e = wait_done(*c.d, refused.back().room);
    CHECK(e.status == room_status::failed);
    CHECK(e.code == errc::draining);
    CHECK_THAT(e.reason, Catch::Contains(fmt::format("peer {} is draining", c.prefill.control())));
  }
  // The prefill's own engine: a send that would open a new room is refused with 407.
  auto send = c.p->send({700, {1}, false, no_index, no_index});
  CHECK(send.code == errc::draining);
  CHECK_THAT(send.message, Catch::Contains("ferryd is draining: it finishes the 4 rooms"));

  // The accepted rooms finish on both sides, byte for byte; then the prefill exits 0.
  for (const auto& r : accepted) send_rest(*c.p, r, 1);
  for (const auto& r : accepted) {
    auto de = wait_done(*c.d, r.room);
    INFO(de.reason);
    CHECK(de.status == room_status::success);
    auto pe = c.p->wait_terminal(r.room, 60s);
    INFO(pe.message);
    REQUIRE(pe);
    CHECK(pe.value.status == room_status::success);
    CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
  }
  CHECK(c.prefill.wait_exit() == 0);
  CHECK_THAT(c.prefill.log_text(),
             Catch::Contains("drained: every room accepted before the stop has finished"));
  // It said goodbye: its connection's end is a drained peer's, not a loss.
  CHECK(log_shows(c.decode, "peer=" + c.prefill.control() + " drained and closed its connection"));
  CHECK_THAT(c.decode.log_text(), !Catch::Contains("lost"));

  // Restarted, the prefill serves the refused rooms again.
  c.prefill.restart();
  c.p = c.prefill.connect();
  for (const auto& r : refused) run_and_verify(c, r);
  CHECK(c.prefill.stop() == 0);
  CHECK(c.decode.stop() == 0);
}

TEST_CASE("a decode that drains refuses new prepares with 407 and finishes its accepted rooms",
          "[e2e][drain]") {
  pair c;
  auto r = two_chunk_room(800, 0);
  stage(c, r);
  prepare(c, r);
  send_chunk(*c.p, r, 0);
  wait_status(*c.d, r.room, room_status::transferring);
  REQUIRE(c.d->subscribe(r.room));
  c.decode.drain();
  REQUIRE(log_shows(c.decode, "draining: 0 prefill and 1 decode rooms accepted"));
  CHECK(log_shows(c.prefill, "is draining"));
  auto refused = c.d->prepare({801, {c.prefill.control()}, range(3000, 4), 5, 5});
  CHECK(refused.code == errc::draining);
  CHECK_THAT(refused.message, Catch::Contains("room 801: ferryd is draining"));
  send_rest(*c.p, r, 1);
  auto de = c.d->wait_terminal(r.room, 60s);
  REQUIRE(de);
  CHECK(de.value.status == room_status::success);
  CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
  CHECK(wait_done(*c.p, r.room).status == room_status::success);
  CHECK(c.decode.wait_exit() == 0);
  CHECK_THAT(c.decode.log_text(),
             Catch::Contains("drained: every room accepted before the stop has finished"));
  CHECK(c.prefill.stop() == 0);
}

TEST_CASE(
    "a drain ends at a second signal or at timeouts.stop_ms, and exits forced_stop when rooms "
    "were still active, 0 when the drain finished",
    "[e2e][drain]") {
  using exit_code::forced_stop;
  shape s;
  SECTION("a second SIGTERM") {
    pair c(s);
    auto r = two_chunk_room(900, 0);
    prepare(c, r);  // never sent: it cannot finish
    c.decode.drain();
    REQUIRE(log_shows(c.decode, "draining: 0 prefill and 1 decode rooms accepted"));
    c.decode.signal(SIGTERM);
    CHECK(c.decode.wait_exit() == forced_stop);
    CHECK_THAT(c.decode.log_text(),
               Catch::Contains("signal 15 received again while draining: stopping at once"));
    CHECK_THAT(c.decode.log_text(), Catch::Contains("stopped, forced: 1 room ended unfinished"));
  }
  SECTION("the bound") {
    shape d = s;
    d.stop_ms = 300;
    pair c(s, d);
    auto r = two_chunk_room(901, 0);
    prepare(c, r);
    c.decode.drain();
    CHECK(c.decode.wait_exit() == forced_stop);
    CHECK_THAT(c.decode.log_text(),
               Catch::Contains("timeouts.stop_ms (300 ms) passed with rooms still active"));
  }
  SECTION("an idle daemon drains at once") {
    pair c(s);
    c.decode.drain();
    CHECK(c.decode.wait_exit() == 0);
    CHECK_THAT(c.decode.log_text(),
               Catch::Contains("drained: every room accepted before the stop has finished"));
  }
  SECTION("an idle daemon given both signals at once exits 0: no room was cut short") {
    pair c(s);
    c.decode.signal(SIGTERM);
    c.decode.signal(SIGINT);
    CHECK(c.decode.wait_exit() == 0);
    CHECK_THAT(c.decode.log_text(), !Catch::Contains("forced"));
  }
}
