// core/peer_handshake.hpp, heartbeat_tick: a Connection's tick beats once a period, wakes for
// the next beat or just past the silence bound, whichever is sooner, and declares the peer dead
// only once the silence exceeds heartbeat_ms x heartbeat_misses; a tick that runs over a period
// late (this process was stopped) judges nothing, and the one after it judges however late.

#include <catch2/catch.hpp>

#include "core/peer_handshake.hpp"

using namespace ferry::handshake;

TEST_CASE("peer handshake: a heartbeat tick beats, waits and declares the peer dead in bound",
          "[unit][peer_handshake]") {
  int64_t next = 1000;
  // Heard at 1000, period 100, 3 misses: bound 300.
  auto s = heartbeat_tick(1000, 0, 1000, next, 100, 3);
  CHECK_FALSE(s.dead);
  CHECK(s.send);
  CHECK(next == 1100);
  CHECK(s.wake_in_ms == 100);
  s = heartbeat_tick(1050, 0, 1000, next, 100, 3);
  CHECK_FALSE(s.send);
  CHECK(s.wake_in_ms == 50);
  // Near the bound, the wake is just past it rather than a whole period later.
  next = 1400;
  s = heartbeat_tick(1250, 0, 1000, next, 100, 3);
  CHECK(s.wake_in_ms == 51);
  s = heartbeat_tick(1300, 0, 1000, next, 100, 3);
  CHECK_FALSE(s.dead);  // exactly at the bound: not yet
  s = heartbeat_tick(1301, 0, 1000, next, 100, 3);
  CHECK(s.dead);
  CHECK(s.silent_ms == 301);
  CHECK_FALSE(s.send);
  // The wake is never zero.
  next = 2000;
  s = heartbeat_tick(2000 - 0, 0, 1999, next, 1, 1);
  CHECK(s.wake_in_ms >= 1);
}

TEST_CASE("peer handshake: a tick a period late judges nothing and the next one judges",
          "[unit][peer_handshake]") {
  // Period 100, 3 misses: bound 300. Heard at 1000; the tick due at 1100 runs at 5000 (the
  // daemon was stopped): 4000 ms of silence, but its own.
  int64_t next = 1100;
  auto s = heartbeat_tick(5000, 1100, 1000, next, 100, 3);
  CHECK(s.own_stall);
  CHECK_FALSE(s.dead);
  CHECK(s.send);  // it was silent too: beat at once
  CHECK(next == 5100);
  CHECK(s.wake_in_ms == 100);
  // Late by exactly a period: on time enough to judge.
  next = 1100;
  s = heartbeat_tick(1400, 1300, 1200, next, 100, 3);  // heard at 1200: alive
  CHECK_FALSE(s.own_stall);
  CHECK_FALSE(s.dead);
  next = 1100;
  s = heartbeat_tick(1401, 1301, 1000, next, 100, 3);
  CHECK_FALSE(s.own_stall);
  CHECK(s.dead);
  // Nothing was read meanwhile: the next tick (due unknown: 0) declares the peer dead, however
  // late it runs.
  s = heartbeat_tick(9000, 0, 1000, next, 100, 3);
  CHECK_FALSE(s.own_stall);
  CHECK(s.dead);
  CHECK(s.silent_ms == 8000);
  // Something was read meanwhile (heard at 5050): the peer lives.
  next = 5100;
  s = heartbeat_tick(5100, 0, 5050, next, 100, 3);
  CHECK_FALSE(s.dead);
}
