// core/waiter_queue.hpp: who waits for staging, woken in arrival order, as many as fit.

#include <catch2/catch.hpp>

#include "core/waiter_queue.hpp"

using namespace ferry;
using ids = std::vector<int>;

TEST_CASE("a release wakes the waiters at the front that fit in the free bytes together",
          "[unit]") {
  waiter_queue<int> q;
  q.wait(1, 100);
  q.wait(2, 100);
  q.wait(3, 100);
  CHECK(q.wake(250) == ids{1, 2});
  CHECK(q.waiting() == 1);
  CHECK(q.woken() == 2);
  CHECK(q.wake(99) == ids{});  // 3 needs more than is free: nobody else is woken either
  CHECK(q.wake(100) == ids{3});
  CHECK(q.waiting() == 0);
}

TEST_CASE("a large need at the front is not overtaken by smaller ones behind it", "[unit]") {
  waiter_queue<int> q;
  q.wait(1, 300);
  q.wait(2, 10);
  CHECK(q.wake(200) == ids{});
  CHECK(q.wake(310) == ids{1, 2});
}

TEST_CASE("a woken waiter that comes back waits again at the back", "[unit]") {
  waiter_queue<int> q;
  q.wait(1, 100);
  q.wait(2, 100);
  CHECK(q.wake(100) == ids{1});
  q.wait(1, 100);  // its retry failed (fragmentation, or someone was faster)
  CHECK(q.woken() == 0);
  CHECK(q.wake(100) == ids{2});
  CHECK(q.wake(100) == ids{1});
}

TEST_CASE("waiting again before being woken keeps the place and takes the new need", "[unit]") {
  waiter_queue<int> q;
  q.wait(1, 100);
  q.wait(2, 50);
  q.wait(1, 40);
  CHECK(q.waiting() == 2);
  CHECK(q.wake(90) == ids{1, 2});
}

TEST_CASE("a waiter that leaves is forgotten, a woken one passes its turn on", "[unit]") {
  waiter_queue<int> q;
  q.wait(1, 100);
  q.wait(2, 100);
  q.wait(3, 100);
  CHECK_FALSE(q.leave(2));  // waiting, not woken: nothing to pass on
  CHECK_FALSE(q.is_waiting(2));
  CHECK(q.wake(100) == ids{1});
  CHECK(q.leave(1));  // woken and gone without coming back: the caller wakes again
  CHECK(q.wake(100) == ids{3});
  CHECK_FALSE(q.leave(42));  // never seen
  CHECK(q.waiting() == 0);
  CHECK(q.woken() == 1);
}

TEST_CASE("a waiter served is neither waiting nor woken", "[unit]") {
  waiter_queue<int> q;
  q.wait(1, 100);
  q.wait(2, 100);
  CHECK(q.wake(100) == ids{1});
  q.served(1);  // its retry got the bytes
  CHECK(q.woken() == 0);
  CHECK_FALSE(q.leave(1));
  q.served(2);  // got bytes another way (its own batch completed) while waiting
  CHECK(q.waiting() == 0);
  CHECK(q.wake(1000) == ids{});
}

TEST_CASE("many waiters: each release wakes only whom it can serve", "[unit]") {
  // 10 000 rooms wait for one block each; every release frees one block. Waking everyone at each
  // release would be 10 000 x 10 000 wake-ups; the queue gives 10 000.
  constexpr int rooms = 10000;
  waiter_queue<int> q;
  for (int i = 0; i < rooms; ++i) q.wait(i, 4096);
  size_t woken = 0;
  for (int r = 0; r < rooms; ++r) {
    auto w = q.wake(4096);
    REQUIRE(w == ids{r});  // in arrival order
    q.served(w.front());
    woken += w.size();
  }
  CHECK(woken == rooms);
  CHECK(q.waiting() == 0);
  CHECK(q.woken() == 0);
}

TEST_CASE("places left behind by waiters that leave stay bounded", "[unit]") {
  waiter_queue<int> q;
  q.wait(-1, 1 << 30);  // a waiter at the front that never fits keeps the front in place
  for (int i = 0; i < 100000; ++i) {
    q.wait(i, 1);
    q.leave(i);
    REQUIRE(q.places() <= 2 * q.waiting() + 65);
  }
  CHECK(q.waiting() == 1);
}
