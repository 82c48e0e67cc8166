// core/peer_handshake.hpp, heartbeat_tick: a Connection's tick beats once a period, wakes for
// the next beat or just past the silence bound, whichever is sooner, and declares the peer dead
// only once the silence exceeds heartbeat_ms x heartbeat_misses.

#include <catch2/catch.hpp>

#include "core/peer_handshake.hpp"

using namespace ferry::handshake;

TEST_CASE("peer handshake: a heartbeat tick beats, waits and declares the peer dead in bound",
          "[unit][peer_handshake]") {
  int64_t next = 1000;
  // Heard at 1000, period 100, 3 misses: bound 300.
  auto s = heartbeat_tick(1000, 1000, next, 100, 3);
  CHECK_FALSE(s.dead);
  CHECK(s.send);
  CHECK(next == 1100);
  CHECK(s.wake_in_ms == 100);
  s = heartbeat_tick(1050, 1000, next, 100, 3);
  CHECK_FALSE(s.send);
  CHECK(s.wake_in_ms == 50);
  // Near the bound, the wake is just past it rather than a whole period later.
  next = 1400;
  s = heartbeat_tick(1250, 1000, next, 100, 3);
  CHECK(s.wake_in_ms == 51);
  s = heartbeat_tick(1300, 1000, next, 100, 3);
  CHECK_FALSE(s.dead);  // exactly at the bound: not yet
  s = heartbeat_tick(1301, 1000, next, 100, 3);
  CHECK(s.dead);
  CHECK(s.silent_ms == 301);
  CHECK_FALSE(s.send);
  // The wake is never zero.
  next = 2000;
  s = heartbeat_tick(2000 - 0, 1999, next, 1, 1);
  CHECK(s.wake_in_ms >= 1);
}
