#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "core/range_allocator.hpp"

using namespace ferry;

TEST_CASE("range allocator rounds to its alignment and refuses what does not fit",
          "[unit][range_allocator]") {
  range_allocator a(1024, 64);
  CHECK(a.capacity() == 1024);
  CHECK(a.allocate(0) == std::nullopt);
  CHECK(a.allocate(1) == 0u);
  CHECK(a.allocate(65) == 64u);  // 128 bytes taken
  CHECK(a.in_use() == 192);
  CHECK(a.allocate(1024) == std::nullopt);
  CHECK(a.allocate(832) == 192u);  // exactly what is left
  CHECK(a.in_use() == 1024);
  CHECK(a.allocate(1) == std::nullopt);
  range_allocator none;
  CHECK(none.allocate(1) == std::nullopt);
}

TEST_CASE("range allocator coalesces freed neighbours on both sides", "[unit][range_allocator]") {
  range_allocator a(1024, 64);
  const auto x = a.allocate(256), y = a.allocate(256), z = a.allocate(256);
  REQUIRE((x == 0u && y == 256u && z == 512u));
  REQUIRE(a.release(*y));
  CHECK(a.allocate(512) == std::nullopt);  // 256 at 256 and 256 at 768: fragmented
  REQUIRE(a.release(*x));                  // merges with the free range after it
  CHECK(a.allocate(512) == 0u);
  REQUIRE(a.release(0));
  REQUIRE(a.release(*z));  // merges with the free ranges before and after it
  CHECK(a.in_use() == 0);
  CHECK(a.allocate(1024) == 0u);  // one range again
}

TEST_CASE("range allocator ignores unknown and repeated releases", "[unit][range_allocator]") {
  range_allocator a(4096, 64);
  const auto x = a.allocate(100);
  REQUIRE(x == 0u);
  CHECK_FALSE(a.release(64));  // inside an allocation, not its start
  CHECK(a.release(0));
  CHECK_FALSE(a.release(0));
  CHECK(a.in_use() == 0);
  CHECK(a.allocate(4096) == 0u);
}

TEST_CASE("range allocator hands disjoint ranges to concurrent threads",
          "[unit][range_allocator]") {
  constexpr uint64_t cells = 256, rounds = 4000;
  range_allocator a(cells * 64, 64);
  std::vector<std::atomic<int>> owner(cells);
  std::atomic<int> overlaps{0}, lost{0};  // counted here: Catch2 assertions are not thread-safe
  auto worker = [&](int id) {
    for (uint64_t i = 0; i < rounds; ++i) {
      const uint64_t n = 1 + (i * 7 + id) % 4;  // 1..4 cells
      auto at = a.allocate(n * 64);
      if (!at) continue;
      for (uint64_t c = *at / 64; c < *at / 64 + n; ++c) {
        int free_cell = 0;
        if (!owner[c].compare_exchange_strong(free_cell, id)) ++overlaps;
      }
      for (uint64_t c = *at / 64; c < *at / 64 + n; ++c) owner[c] = 0;
      if (!a.release(*at)) ++lost;
    }
  };
  std::thread t1(worker, 1), t2(worker, 2);
  t1.join();
  t2.join();
  CHECK(overlaps == 0);
  CHECK(lost == 0);
  CHECK(a.in_use() == 0);
  CHECK(a.allocate(cells * 64) == 0u);
}
