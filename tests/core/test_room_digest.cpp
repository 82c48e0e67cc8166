// Room checksums (core/room_digest.hpp): the prefill's digests of what it sends equal the
// decode's digests of what landed when the planner's writes are carried out, at equal TP and
// under TP mismatch (sliced KV, sliced state), and one flipped byte names its buffer, layer and
// bytes.

#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <numeric>

#include "core/geometry.hpp"
#include "core/plan.hpp"
#include "core/room_digest.hpp"

using namespace ferry;

namespace {

pools_config qwen_like(uint32_t tp) {
  pools_config c;
  c.kv = kv_pool_config{{3, 7}, 4, tp <= 2 ? 2 / tp : 1, 64, 2, false, 32};
  c.kv->total_heads = 2;
  mamba_pool_config m;
  m.slots = 4;
  m.layer_ids = {0, 1, 2};
  m.tensors = {{"conv", {512 / tp, 3}, 2, 0u, {128, 128, 256}},
               {"temporal", {8 / tp, 16, 16}, 4, 0u, {}}};
  c.mamba = m;
  c.aux = aux_pool_config{8, 96};
  return c;
}

/// The memory of one rank: its three pools.
struct rank_memory {
  node_layout layout;
  std::array<std::vector<uint8_t>, 3> pools;
  explicit rank_memory(const pools_config& c) : layout(make_layout(c)) {
    for (int k = 0; k < 3; ++k) pools[k].resize(layout.pools[k].total_bytes);
  }
  std::array<const uint8_t*, 3> bases() const {
    return {pools[0].data(), pools[1].data(), pools[2].data()};
  }
  uint8_t* at(space s) { return pools[static_cast<int>(s)].data(); }
};

/// Carry out the direct plan of one room on link `link` (no staging: a sliced row goes one
/// write per token), as the fabric would.
void move_room(const link_plan& link, rank_memory& src, rank_memory& dst, const room_items& s,
               const room_items& d) {
  std::vector<planned_copy> pack;
  std::vector<planned_write> writes;
  plan_kv_chunk(link, src.layout, dst.layout, coalesce_runs(s.pages, d.pages), staging_use{}, pack,
                writes);
  plan_state_link(link, src.layout, dst.layout, s.slot, d.slot, writes);
  plan_aux_link(link, src.layout, dst.layout, s.row, d.row, writes);
  REQUIRE(pack.empty());
  for (const auto& w : writes)
    std::memcpy(dst.at(w.dst) + w.dst_offset, src.at(w.src) + w.src_offset, w.length);
}

}  // namespace

TEST_CASE("room digests: what landed digests as what was sent, at equal TP and under TP mismatch",
          "[unit][room_digest]") {
  const auto [ps, pd] = GENERATE(std::pair{1u, 1u}, std::pair{1u, 2u}, std::pair{2u, 1u});
  CAPTURE(ps, pd);
  const std::vector<uint32_t> src_pages{5, 6, 7, 20, 3}, dst_pages{30, 31, 2, 9, 10};
  for (uint32_t drank = 0; drank < pd; ++drank) {
    rank_memory dst(qwen_like(pd));
    rank_schema ds{qwen_like(pd), pd, drank};
    for (uint32_t prank : prefill_ranks_for(ps, pd, drank)) {
      rank_memory src(qwen_like(ps));
      for (auto& pool : src.pools)
        std::iota(pool.begin(), pool.end(), static_cast<uint8_t>(prank * 31 + 1));
      auto link = make_link_plan(rank_schema{qwen_like(ps), ps, prank}, ds);
      INFO(link.message);
      REQUIRE(link);
      REQUIRE(link.value.in_group);
      const room_items s{src_pages, 1, {}, 2}, d{dst_pages, 3, {}, 7};
      move_room(link.value, src, dst, s, d);
      const auto sent =
          digest_room(link.value, src.layout, dst.layout, s, d, src.bases(), digest_side::source);
      const auto got = digest_room(link.value, src.layout, dst.layout, d, d, dst.bases(),
                                   digest_side::destination);
      REQUIRE(sent.size() == got.size());
      // K and V of 2 layers, 2 state tensors of 3 layers, and the aux row from prefill rank 0.
      CHECK(sent.size() == 4 + 6 + (link.value.aux ? 1u : 0u));
      std::vector<uint64_t> values;
      for (const auto& x : sent) values.push_back(x.value);
      CHECK(digest_difference(got, values, dst.layout, "p0") == "");
    }
  }
}

TEST_CASE("room digests: one byte changed in flight names its buffer, layer and bytes",
          "[unit][room_digest]") {
  rank_memory src(qwen_like(1)), dst(qwen_like(2));
  for (auto& pool : src.pools) std::iota(pool.begin(), pool.end(), uint8_t{1});
  auto link = make_link_plan(rank_schema{qwen_like(1), 1, 0}, rank_schema{qwen_like(2), 2, 1});
  INFO(link.message);
  REQUIRE(link);
  const std::vector<uint32_t> pages{0, 1}, dpages{4, 5};
  const room_items s{pages, 0, {}, 0}, d{dpages, 1, {}, 1};
  move_room(link.value, src, dst, s, d);
  std::vector<uint64_t> sent;
  for (const auto& x :
       digest_room(link.value, src.layout, dst.layout, s, d, src.bases(), digest_side::source))
    sent.push_back(x.value);

  SECTION("a KV byte") {
    const auto& v = dst.layout[pool_kind::kv].buffers[2];  // K 3, K 7, then V 3
    dst.at(space::kv)[v.offset + 5 * v.item_bytes + 1] ^= 0x40;
    const auto got = digest_room(link.value, src.layout, dst.layout, d, d, dst.bases(),
                                 digest_side::destination);
    const auto why = digest_difference(got, sent, dst.layout, "p0");
    CHECK_THAT(why, Catch::StartsWith(fmt::format(
                        "kv buffer 2 (V, layer 3): destination bytes [{}, {}) of the kv pool "
                        "differ from what prefill p0 sent (digest 0x",
                        v.offset + 4 * v.item_bytes, v.offset + 6 * v.item_bytes)));
  }
  SECTION("a state byte") {
    const auto& t = dst.layout[pool_kind::state].buffers[4];  // temporal, layer 1
    dst.at(space::state)[t.offset + 1 * t.item_bytes + 9] ^= 1;
    const auto got = digest_room(link.value, src.layout, dst.layout, d, d, dst.bases(),
                                 digest_side::destination);
    CHECK_THAT(
        digest_difference(got, sent, dst.layout, "p0"),
        Catch::StartsWith(fmt::format("state buffer 4 (tensor 1, layer 1): destination "
                                      "bytes [{}, {}) of the state pool differ",
                                      t.offset + t.item_bytes, t.offset + 2 * t.item_bytes)));
  }
  SECTION("a byte the link does not move changes nothing") {
    const auto& k = dst.layout[pool_kind::kv].buffers[0];
    dst.at(space::kv)[k.offset + 9 * k.item_bytes] ^= 1;  // page 9: not the room's
    const auto got = digest_room(link.value, src.layout, dst.layout, d, d, dst.bases(),
                                 digest_side::destination);
    CHECK(digest_difference(got, sent, dst.layout, "p0") == "");
  }
  SECTION("a count that differs is named") {
    sent.pop_back();
    const auto got = digest_room(link.value, src.layout, dst.layout, d, d, dst.bases(),
                                 digest_side::destination);
    CHECK(digest_difference(got, sent, dst.layout, "p0") ==
          fmt::format("prefill p0 sent {} digests but this decode computes {} for its link",
                      sent.size(), got.size()));
  }
}
