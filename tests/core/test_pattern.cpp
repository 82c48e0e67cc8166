// core/pattern.hpp: the byte patterns every verification uses. A pattern is a function of its
// seed alone, seeds of different rooms, pools, buffers and positions differ, and the check names
// the first byte that differs, tail bytes included.

#include <catch2/catch.hpp>
#include <set>
#include <vector>

#include "core/pattern.hpp"

using namespace ferry;

TEST_CASE("pattern: fill and check agree, and the first wrong byte is named", "[unit][pattern]") {
  for (size_t n : {0u, 1u, 7u, 8u, 9u, 4096u, 4099u}) {
    INFO("length " << n);
    std::vector<uint8_t> b(n);
    const uint64_t seed = pattern_seed(42, 0, 3, 17);
    fill_pattern(b, seed);
    CHECK(check_pattern(b, seed) == -1);
    if (n == 0) continue;
    CHECK(check_pattern(b, seed + 1) != -1);  // another seed, other bytes
    for (size_t at : {size_t{0}, n / 2, n - 1}) {
      auto c = b;
      c[at] ^= 0x01;
      CHECK(check_pattern(c, seed) == static_cast<int64_t>(at));
    }
  }
}

TEST_CASE("pattern: seeds of different rooms, pools, buffers and positions differ",
          "[unit][pattern]") {
  std::set<uint64_t> seeds;
  size_t n = 0;
  for (uint64_t room : {1ull, 2ull, 0x1234567890abcdefull})
    for (uint32_t pool = 0; pool < 3; ++pool)
      for (uint32_t buffer = 0; buffer < 4; ++buffer)
        for (uint64_t pos = 0; pos < 16; ++pos, ++n)
          seeds.insert(pattern_seed(room, pool, buffer, pos));
  CHECK(seeds.size() == n);
  // The same inputs, the same pattern: verification needs no record of what was written.
  std::vector<uint8_t> a(100), b(100);
  fill_pattern(a, pattern_seed(5, 1, 2, 3));
  fill_pattern(b, pattern_seed(5, 1, 2, 3));
  CHECK(a == b);
}
