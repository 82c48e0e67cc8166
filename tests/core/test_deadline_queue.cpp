// core/deadline_queue.hpp: deadlines come out in due order, a cancelled one never does, and
// nothing stays behind a cancel.

#include <catch2/catch.hpp>

#include "core/deadline_queue.hpp"

using namespace ferry;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

TEST_CASE("deadline queue: due order, ties in arming order, cancel removes at once",
          "[unit][deadline_queue]") {
  deadline_queue<int> q;
  const auto t0 = clock_type::time_point{} + 1h;
  CHECK(q.empty());
  CHECK_FALSE(q.next_due());
  const auto a = q.arm(t0 + 30ms, 1);
  const auto b = q.arm(t0 + 10ms, 2);
  const auto c = q.arm(t0 + 10ms, 3);
  const auto d = q.arm(t0 + 20ms, 4);
  CHECK(a != 0);
  CHECK(a != b);
  CHECK(q.size() == 4);
  CHECK(*q.next_due() == t0 + 10ms);

  CHECK(q.cancel(d));
  CHECK_FALSE(q.cancel(d));  // once
  CHECK_FALSE(q.cancel(0));
  CHECK(q.size() == 3);

  CHECK(q.take_due(t0).empty());
  CHECK(q.take_due(t0 + 10ms) == std::vector<int>{2, 3});
  CHECK_FALSE(q.cancel(b));  // fired already
  CHECK(q.take_due(t0 + 25ms).empty());
  CHECK(q.take_due(t0 + 1s) == std::vector<int>{1});
  CHECK(q.empty());
  (void)c;
}

TEST_CASE("deadline queue: a thousand rooms re-arming leave one deadline each",
          "[unit][deadline_queue]") {
  deadline_queue<int> q;
  const auto t0 = clock_type::time_point{} + 1h;
  std::vector<uint64_t> live(1000);
  for (int room = 0; room < 1000; ++room) live[room] = q.arm(t0 + 60s, room);
  // Each room moves through three more statuses: cancel the old deadline, arm the next.
  for (int step = 1; step <= 3; ++step)
    for (int room = 0; room < 1000; ++room) {
      REQUIRE(q.cancel(live[room]));
      live[room] = q.arm(t0 + 60s + std::chrono::seconds(step), room);
    }
  CHECK(q.size() == 1000);
  CHECK(*q.next_due() == t0 + 63s);
  CHECK(q.take_due(t0 + 62s).empty());
  CHECK(q.take_due(t0 + 63s).size() == 1000);
  CHECK(q.empty());
}
