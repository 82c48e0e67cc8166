// core/rails.hpp: which of a peer's endpoints each of ours talks to, and how a batch's writes
// are spread over the bulk rails a peer shares.
#include <algorithm>
#include <catch2/catch.hpp>
#include <numeric>

#include "core/rails.hpp"

using namespace ferry::rails;

namespace {

std::vector<kind> bulk(size_t n, bool express = false) {
  std::vector<kind> out(n);
  if (express) out.push_back({true});
  return out;
}

using pairs = std::vector<std::pair<uint32_t, uint32_t>>;

}  // namespace

TEST_CASE("rails pair bulk with bulk by position and express with express", "[unit][rails]") {
  // One endpoint each: rail 0, which the hellos name, is never listed.
  CHECK(pair_rails(bulk(1), bulk(1)).empty());
  CHECK(pair_rails(bulk(2), bulk(2)) == pairs{{1, 1}});
  // Counts may differ: the extra rails of one side have no partner.
  CHECK(pair_rails(bulk(3), bulk(2)) == pairs{{1, 1}});
  CHECK(pair_rails(bulk(2), bulk(4)) == pairs{{1, 1}});
  CHECK(pair_rails(bulk(1), bulk(4)).empty());
  // Express with express, whatever the bulk counts; without a partner, none.
  CHECK(pair_rails(bulk(2, true), bulk(2, true)) == pairs{{1, 1}, {2, 2}});
  CHECK(pair_rails(bulk(1, true), bulk(3, true)) == pairs{{1, 3}});
  CHECK(pair_rails(bulk(3, true), bulk(1, true)) == pairs{{3, 1}});
  CHECK(pair_rails(bulk(2, true), bulk(2)) == pairs{{1, 1}});
  CHECK(pair_rails(bulk(1), bulk(1, true)).empty());
  // Both sides pair alike: the decode inserts exactly the rails the prefill writes on.
  for (size_t a = 1; a <= 4; ++a)
    for (size_t b = 1; b <= 4; ++b)
      for (bool ea : {false, true})
        for (bool eb : {false, true}) {
          auto ab = pair_rails(bulk(a, ea), bulk(b, eb));
          auto ba = pair_rails(bulk(b, eb), bulk(a, ea));
          for (auto& p : ba) std::swap(p.first, p.second);
          CHECK(ab == ba);
        }
}

TEST_CASE("a stripe spreads a batch's bytes evenly over the lanes, in order", "[unit][rails]") {
  // Equal writes alternate.
  CHECK(stripe({1, 1, 1, 1, 1}, 2) == std::vector<uint32_t>{0, 1, 0, 1, 0});
  // A large write is balanced by the small ones after it.
  CHECK(stripe({8, 1, 1, 1, 1, 8}, 2) == std::vector<uint32_t>{0, 1, 1, 1, 1, 1});
  // One lane (or none asked): everything on it.
  CHECK(stripe({5, 6}, 1) == std::vector<uint32_t>{0, 0});
  CHECK(stripe({5, 6}, 0) == std::vector<uint32_t>{0, 0});
  CHECK(stripe({}, 3).empty());
  // The bulk room of docs/performance.md §1: 205 writes of 1 MiB pieces and one aux row, over
  // two rails, within one write of each other.
  std::vector<uint64_t> lengths(204, 1 << 20);
  lengths.push_back(5632);
  const auto lanes = stripe(lengths, 2);
  uint64_t load[2] = {0, 0};
  for (size_t i = 0; i < lanes.size(); ++i) load[lanes[i]] += lengths[i];
  CHECK(std::max(load[0], load[1]) - std::min(load[0], load[1]) <= (1u << 20));
  CHECK(load[0] + load[1] == std::accumulate(lengths.begin(), lengths.end(), uint64_t{0}));
}
