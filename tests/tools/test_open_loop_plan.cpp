// ferry-bench's open loop, its pure parts (src/tools/bench/open_loop_plan.hpp): the size mix, the
// Poisson arrivals and the allocators that let rooms of different sizes share the pools.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>
#include <set>

#include "tools/bench/open_loop_plan.hpp"

using namespace ferry;
using namespace ferry::bench;

TEST_CASE("a mix is token counts with fractions summing to 1", "[unit][open_loop]") {
  auto m = parse_mix("16:0.90,4096:0.09,32768:0.01");
  REQUIRE(m);
  REQUIRE(m.value.size() == 3);
  CHECK(m.value[0].tokens == 16);
  CHECK(m.value[0].fraction == Approx(0.9));
  CHECK(m.value[2].tokens == 32768);
  CHECK(m.value[2].fraction == Approx(0.01));
  auto one = parse_mix("64:1");
  REQUIRE(one);
  CHECK(one.value.size() == 1);
}

TEST_CASE("a mix that is wrong names the entry and what was wrong", "[unit][open_loop]") {
  auto error_of = [](const char* text) {
    auto m = parse_mix(text);
    CHECK(m.code == errc::invalid_request);
    return m.message;
  };
  CHECK(error_of("16:0.5,4096:0.4") == "--mix '16:0.5,4096:0.4': the fractions sum to 0.9, not 1");
  CHECK(error_of("") ==
        "--mix is empty: expected TOKENS:FRACTION[,TOKENS:FRACTION...], e.g. 16:0.9,4096:0.1");
  CHECK(error_of("16") == "--mix entry '16': expected TOKENS:FRACTION, e.g. 4096:0.09");
  CHECK(error_of("16:0.5,") == "--mix entry '': expected TOKENS:FRACTION, e.g. 4096:0.09");
  CHECK(error_of("0:1") == "--mix entry '0:1': the token count must be a positive integer");
  CHECK(error_of("x:1") == "--mix entry 'x:1': the token count must be a positive integer");
  CHECK(error_of("-4:1") == "--mix entry '-4:1': the token count must be a positive integer");
  CHECK(error_of("16:abc") == "--mix entry '16:abc': the fraction must be a number");
  CHECK(error_of("16:0.5x") == "--mix entry '16:0.5x': the fraction must be a number");
  CHECK(error_of("16:0") == "--mix entry '16:0': the fraction must be in (0, 1], got 0");
  CHECK(error_of("16:1.5") == "--mix entry '16:1.5': the fraction must be in (0, 1], got 1.5");
  CHECK(error_of("16:0.5,16:0.5") == "--mix entry '16:0.5': 16 tokens appear more than once");
}

TEST_CASE("arrivals are Poisson at the rate, classes drawn by their fractions",
          "[unit][open_loop]") {
  const std::vector<mix_class> mix{{16, 0.9}, {4096, 0.1}};
  arrival_schedule a(1000.0, mix, 7), b(1000.0, mix, 7);
  std::vector<size_t> counts(2);
  double last = 0;
  const int n = 20000;
  for (int i = 0; i < n; ++i) {
    const auto x = a.next(), y = b.next();
    CHECK(x.at_s == y.at_s);  // the same seed, the same sequence
    CHECK(x.klass == y.klass);
    REQUIRE(x.at_s > last);
    last = x.at_s;
    ++counts.at(x.klass);
  }
  // 20 000 arrivals at 1000/s take about 20 s (the mean gap is 1 ms; 5 sigma is 3.5 %).
  CHECK(last == Approx(20.0).epsilon(0.05));
  CHECK(double(counts[1]) / n == Approx(0.1).margin(0.015));
  arrival_schedule other(1000.0, mix, 8);
  CHECK(other.next().at_s != arrival_schedule(1000.0, mix, 7).next().at_s);
}

TEST_CASE("the page allocator hands runs first fit and takes them back merged",
          "[unit][open_loop]") {
  page_allocator p(100, 10);  // pages 100..109
  bool fragmented = true;
  auto a = p.allocate(4, &fragmented);
  REQUIRE(a);
  CHECK(*a == std::vector<uint32_t>{100, 101, 102, 103});
  CHECK_FALSE(fragmented);
  auto b = p.allocate(3);
  REQUIRE(b);
  CHECK(*b == std::vector<uint32_t>{104, 105, 106});
  CHECK(p.free_pages() == 3);
  CHECK_FALSE(p.allocate(4));  // fewer free than asked: nothing taken
  CHECK(p.free_pages() == 3);
  REQUIRE(p.release(*a));
  CHECK(p.free_runs() == 2);  // 100..103 and 107..109
  // No run of 6: the free pages in address order, a fragmented list.
  auto c = p.allocate(6, &fragmented);
  REQUIRE(c);
  CHECK(*c == std::vector<uint32_t>{100, 101, 102, 103, 107, 108});
  CHECK(fragmented);
  CHECK(p.free_pages() == 1);
  REQUIRE(p.release(*b));
  REQUIRE(p.release(*c));
  CHECK(p.free_pages() == 10);
  CHECK(p.free_runs() == 1);  // all merged again
  auto whole = p.allocate(10, &fragmented);
  REQUIRE(whole);
  CHECK_FALSE(fragmented);
  CHECK(whole->front() == 100);
  CHECK(whole->back() == 109);
}

TEST_CASE("the page allocator refuses a page outside, free or given twice, changing nothing",
          "[unit][open_loop]") {
  page_allocator p(0, 8);
  auto a = p.allocate(4);
  REQUIRE(a);
  CHECK_FALSE(p.release({3, 8}));  // 8 is outside
  CHECK_FALSE(p.release({2, 5}));  // 5 is free
  CHECK_FALSE(p.release({1, 1}));  // twice
  CHECK(p.free_pages() == 4);
  CHECK(p.release({2, 0}));  // any order
  CHECK(p.release({1, 3}));
  CHECK(p.free_pages() == 8);
  CHECK(p.free_runs() == 1);
  page_allocator empty(0, 0);
  CHECK_FALSE(empty.allocate(1));
  CHECK(empty.allocate(0)->empty());
}

TEST_CASE("the page allocator keeps every page once through many rooms of mixed sizes",
          "[unit][open_loop]") {
  page_allocator p(0, 1000);
  std::vector<std::vector<uint32_t>> held;
  std::mt19937_64 rng(3);
  for (int step = 0; step < 5000; ++step) {
    if (!held.empty() && (rng() % 2 == 0 || p.free_pages() < 50)) {
      const size_t i = rng() % held.size();
      REQUIRE(p.release(held[i]));
      held.erase(held.begin() + static_cast<long>(i));
    } else {
      const auto n = static_cast<uint32_t>(1 + rng() % 120);
      auto pages = p.allocate(n);
      if (pages) {
        REQUIRE(pages->size() == n);
        held.push_back(std::move(*pages));
      } else {
        CHECK(p.free_pages() < n);
      }
    }
    uint64_t in_use = 0;
    for (const auto& h : held) in_use += h.size();
    REQUIRE(in_use + p.free_pages() == 1000);
  }
  std::set<uint32_t> all;
  for (const auto& h : held) all.insert(h.begin(), h.end());
  uint64_t in_use = 0;
  for (const auto& h : held) in_use += h.size();
  CHECK(all.size() == in_use);  // no page handed out twice
}

TEST_CASE("the slot allocator hands the lowest free index", "[unit][open_loop]") {
  index_allocator s(3);
  CHECK(s.take() == 0u);
  CHECK(s.take() == 1u);
  CHECK(s.take() == 2u);
  CHECK_FALSE(s.take());
  CHECK(s.give(1));
  CHECK_FALSE(s.give(1));  // already free
  CHECK_FALSE(s.give(3));  // out of range
  CHECK(s.give(0));
  CHECK(s.free_count() == 2);
  CHECK(s.take() == 0u);
  CHECK(s.take() == 1u);
}
