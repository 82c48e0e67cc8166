// core/room_registry.hpp: the Scheduler's room registry as pure code: a side's rooms and their
// history, admission, poll answers, a send after its room ended, unresponsive peers.

#include <catch2/catch.hpp>
#include <string>

#include "core/room_registry.hpp"

using namespace ferry;
using namespace std::chrono_literals;

namespace {

struct entry {
  room_status status = room_status::bootstrapping;
  uint32_t prefix_tokens = 0;
  std::string note;
};

}  // namespace

TEST_CASE("room registry: a room ends once, counted, its outcome kept for poll",
          "[unit][room_registry]") {
  room_table<entry> side;
  side.active[7] = entry{room_status::transferring, 16, {}};
  CHECK(active_poll(side, 7)->status == room_status::transferring);
  CHECK(active_poll(side, 7)->prefix_tokens == 16);
  CHECK(active_poll(side, 7)->reason == "");
  // Why a room waits in its status is its poll's reason.
  side.active[7].note = "waiting for 4096 bytes of staging";
  CHECK(active_poll(side, 7)->reason == "waiting for 4096 bytes of staging");
  CHECK_FALSE(finished_poll(side, 7));
  side.finish(7, room_status::success, "", errc::ok, 16, 4096);
  CHECK_FALSE(active_poll(side, 7));
  const auto p = finished_poll(side, 7);
  REQUIRE(p);
  CHECK(p->status == room_status::success);
  CHECK(p->prefix_tokens == 16);
  CHECK(side.succeeded == 1);
  CHECK(side.bytes == 4096);
  // The id is reused; the new incarnation's outcome replaces the old one.
  side.active[7] = entry{};
  side.finish(7, room_status::failed, "cancelled by client", errc::cancelled);
  CHECK(finished_poll(side, 7)->reason == "cancelled by client");
  CHECK(finished_poll(side, 7)->code == errc::cancelled);
  CHECK(side.failed == 1);
  CHECK(side.finished.size() == 1);
  CHECK(side.finished.limit() == history_limit);
}

TEST_CASE("room registry: admission refuses beyond the limit, naming it", "[unit][room_registry]") {
  CHECK(admit(3, 4, "decode"));
  const auto r = admit(4, 4, "decode");
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::invalid_request);
  CHECK(r.message ==
        "admission refused: 4 rooms already active on the decode side (limits.max_active_rooms "
        "= 4)");
}

TEST_CASE("room registry: a send after its room finished is room_finished",
          "[unit][room_registry]") {
  room_table<entry> side;
  CHECK(send_still_open(side.finished, 9));
  side.active[9] = entry{};
  side.finish(9, room_status::success, "", errc::ok);
  const auto r = send_still_open(side.finished, 9);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::room_finished);
  CHECK(r.message == "room 9 already finished (Success); send after Success is rejected");
}

TEST_CASE("room registry: a room polled unknown is Bootstrapping for the bound, then timed out",
          "[unit][room_registry]") {
  unknown_polls u;
  const auto t0 = unknown_polls::clock::time_point{} + 1h;
  auto p = u.poll(5, t0, 100);
  CHECK(p.status == room_status::bootstrapping);
  CHECK(u.poll(5, t0 + 99ms, 100).status == room_status::bootstrapping);  // from the first poll
  p = u.poll(5, t0 + 100ms, 100);
  CHECK(p.status == room_status::failed);
  CHECK(p.code == errc::timed_out);
  CHECK(p.reason ==
        "timed out in Bootstrapping after 100 ms: no prepare from a decode and no send arrived "
        "(timeouts.bootstrapping_ms)");
  u.forget(5);  // it became known; a later unknown poll starts again
  CHECK(u.poll(5, t0 + 200ms, 100).status == room_status::bootstrapping);
}

TEST_CASE("room registry: an unresponsive peer is not retried until its mark expires",
          "[unit][room_registry]") {
  unresponsive_peers u;
  const auto t0 = unresponsive_peers::clock::time_point{} + 1h;
  CHECK_FALSE(u.known_down("p:1", t0));
  u.mark("p:1", "peer unresponsive: nothing heard for 301 ms", t0 + 300ms);
  CHECK(u.known_down("p:1", t0 + 100ms) ==
        "peer unresponsive: nothing heard for 301 ms (not retried for another 200 ms)");
  CHECK_FALSE(u.known_down("p:2", t0));
  CHECK_FALSE(u.known_down("p:1", t0 + 300ms));
  CHECK(u.size() == 0);  // forgotten once expired
}

TEST_CASE(
    "room registry: a prepare is late only for a room that failed before any decode "
    "prepared it",
    "[unit][room_registry]") {
  room_table<entry> side;
  CHECK(late_prepare(side.finished, 1));  // unknown: a new room
  side.active[1] = entry{};
  side.finish(1, room_status::failed, "cancelled by client", errc::cancelled, 0, 0, true);
  const auto r = late_prepare(side.finished, 1);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::cancelled);
  CHECK(r.message ==
        "room 1 failed on the prefill before this decode prepared it: cancelled by "
        "client");
  side.active[2] = entry{};
  side.finish(2, room_status::failed, "peer lost", errc::peer_lost, 0, 0, false);
  CHECK(late_prepare(side.finished, 2));  // its decode ranks were told: a reuse of the id
  side.active[3] = entry{};
  side.finish(3, room_status::success, "", errc::ok, 0, 0, true);
  CHECK(late_prepare(side.finished, 3));
}

TEST_CASE(
    "room registry: a room cancelled before anything of it arrived refuses a decode's prepare "
    "until it expires or is forgotten",
    "[unit][room_registry]") {
  cancelled_rooms c;
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(c.prepare_allowed(5, t0));  // never cancelled
  c.cancel(5, t0 + 100ms);
  const auto r = c.prepare_allowed(5, t0 + 99ms);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::cancelled);
  CHECK(r.message == "room 5 was cancelled on the prefill before this decode prepared it");
  CHECK_FALSE(c.prepare_allowed(5, t0 + 50ms));  // every decode rank's prepare is refused
  CHECK(c.prepare_allowed(5, t0 + 100ms));       // expired, and forgotten
  CHECK(c.size() == 0);
  c.cancel(6, t0 + 100ms);
  c.forget(6);  // the engine sent or polled the room again: a new incarnation
  CHECK(c.prepare_allowed(6, t0));
  timeouts_config t;
  t.transfer_ms = 5;
  t.waiting_for_input_ms = 70000;
  CHECK(longest_room_deadline_ms(t) == 70000);
}
