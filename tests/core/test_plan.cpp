#include <algorithm>
#include <catch2/catch.hpp>
#include <tuple>

#include "core/geometry.hpp"
#include "core/plan.hpp"
#include "core/status.hpp"

using namespace ferry;

namespace {
pools_config qwen_like(uint64_t pages = 64, uint32_t page_tokens = 1) {
  pools_config c;
  c.kv = kv_pool_config{{3, 7}, page_tokens, 2, 256, 2, false, pages};
  mamba_pool_config m;
  m.slots = 4;
  m.layer_ids = {0, 1, 2};
  m.tensors = {{"conv", {8192, 3}, 2, 0u, {2048, 2048, 4096}},
               {"temporal", {32, 128, 128}, 4, 0u, {}}};
  c.mamba = m;
  c.aux = aux_pool_config{8, 5632};
  return c;
}

/// The equal-geometry link of a config with itself.
link_plan same_link(const pools_config& c) {
  rank_schema s{c};
  return make_link_plan(s, s).value;
}

/// Qwen3-Next at TP `tp`, rank `rank`: 2 KV heads, GDN conv and temporal state.
rank_schema qwen_rank(uint32_t tp, uint32_t rank) {
  auto c = qwen_like();
  c.kv->kv_heads = tp <= 2 ? 2 / tp : 1;
  c.kv->total_heads = 2;
  c.mamba->tensors[0].shape[0] = 8192 / tp;
  c.mamba->tensors[1].shape[0] = 32 / tp;
  return {c, tp, rank};
}
}  // namespace

TEST_CASE("coalescing splits where either side breaks contiguity", "[unit][plan]") {
  const std::vector<uint32_t> src{10, 11, 12, 40, 41};
  const std::vector<uint32_t> dst{7, 8, 9, 10, 11};
  auto runs = coalesce_runs(src, dst);
  REQUIRE(runs == std::vector<page_run>{{10, 7, 3, 0}, {40, 10, 2, 3}});

  SECTION("a break on the destination side alone also splits") {
    const std::vector<uint32_t> s{1, 2, 3};
    const std::vector<uint32_t> d{5, 6, 9};
    REQUIRE(coalesce_runs(s, d, 4) == std::vector<page_run>{{1, 5, 2, 4}, {3, 9, 1, 6}});
  }
  SECTION("empty lists give no runs") { REQUIRE(coalesce_runs({}, {}).empty()); }
  SECTION("fully contiguous lists give one run") {
    std::vector<uint32_t> s(4096), d(4096);
    for (uint32_t i = 0; i < 4096; ++i) s[i] = 100 + i, d[i] = 7 + i;
    REQUIRE(coalesce_runs(s, d) == std::vector<page_run>{{100, 7, 4096, 0}});
  }
}

TEST_CASE("fragmented pages give two writes per layer buffer", "[unit][plan]") {
  auto cfg = qwen_like();
  auto layout = make_layout(cfg);
  const std::vector<uint32_t> src{10, 11, 12, 40, 41};
  const std::vector<uint32_t> dst{7, 8, 9, 10, 11};
  std::vector<planned_write> w;
  std::vector<planned_copy> pack;
  const auto link = same_link(cfg);
  CHECK(link.kv == kv_mode::whole_pages);
  plan_kv_chunk(link, layout, layout, coalesce_runs(src, dst), {}, pack, w);
  CHECK(pack.empty());
  const auto& bufs = layout[pool_kind::kv].buffers;
  REQUIRE(bufs.size() == 4);  // K and V for 2 layers
  REQUIRE(w.size() == 2 * 4);
  // First run, first buffer (K of layer 3): pages 10..12 -> 7..9, 1 KiB per page.
  CHECK(w[0] == planned_write{space::kv, space::kv, bufs[0].offset + 10 * 1024,
                              bufs[0].offset + 7 * 1024, 3 * 1024});
  // Second run, last buffer (V of layer 7).
  CHECK(w[7] == planned_write{space::kv, space::kv, bufs[3].offset + 40 * 1024,
                              bufs[3].offset + 10 * 1024, 2 * 1024});
}

TEST_CASE("a layer range plans the KV and state of its layers only", "[unit][plan]") {
  auto cfg = qwen_like();  // KV layers 3 and 7, GDN state layers 0, 1, 2
  auto layout = make_layout(cfg);
  const auto link = same_link(cfg);
  const auto runs = coalesce_runs(std::vector<uint32_t>{10, 11}, std::vector<uint32_t>{7, 8});
  std::vector<planned_write> whole, by_layer;
  std::vector<planned_copy> pack;
  plan_kv_chunk(link, layout, layout, runs, {}, pack, whole);
  plan_state_link(link, layout, layout, 1, 2, whole);
  const auto& kv = layout[pool_kind::kv].buffers;
  // Layer 7 alone: its K and V (buffers 1 and 3), no state.
  std::vector<planned_write> w;
  plan_kv_chunk(link, layout, layout, runs, {}, pack, w, {7, 1});
  plan_state_link(link, layout, layout, 1, 2, w, {7, 1});
  CHECK(w == std::vector<planned_write>{
                 {space::kv, space::kv, kv[1].offset + 10 * 1024, kv[1].offset + 7 * 1024, 2048},
                 {space::kv, space::kv, kv[3].offset + 10 * 1024, kv[3].offset + 7 * 1024, 2048}});
  // Layer 1 alone: no KV, the conv and temporal state of layer 1 (buffers 1 and 4).
  w.clear();
  plan_kv_chunk(link, layout, layout, runs, {}, pack, w, {1, 1});
  plan_state_link(link, layout, layout, 1, 2, w, {1, 1});
  const auto& st = layout[pool_kind::state].buffers;
  REQUIRE(w.size() == 2);
  CHECK(w[0].src_offset == st[1].offset + st[1].item_bytes);
  CHECK(w[1].dst_offset == st[4].offset + 2 * st[4].item_bytes);
  // Every layer one at a time gives the whole room's writes, each once.
  for (uint32_t l = 0; l < 8; ++l) {
    plan_kv_chunk(link, layout, layout, runs, {}, pack, by_layer, {l, 1});
    plan_state_link(link, layout, layout, 1, 2, by_layer, {l, 1});
  }
  auto key = [](const planned_write& a, const planned_write& b) {
    return std::tie(a.dst, a.dst_offset) < std::tie(b.dst, b.dst_offset);
  };
  std::sort(whole.begin(), whole.end(), key);
  std::sort(by_layer.begin(), by_layer.end(), key);
  CHECK(by_layer == whole);
}

TEST_CASE("a layer range keeps each KV buffer's place in the decode's staging", "[unit][plan]") {
  // TP2 -> TP1: the prefill row is a slice of the decode row; whole runs land in the decode's
  // staging at [buffer pair][position][token][slice], so layer 7's place does not move when
  // layer 3 is left out.
  const auto link = make_link_plan(qwen_rank(2, 1), qwen_rank(1, 0)).value;
  REQUIRE(link.kv == kv_mode::unpack);
  const auto src = make_layout(qwen_rank(2, 1).pools), dst = make_layout(qwen_rank(1, 0).pools);
  const auto runs = coalesce_runs(std::vector<uint32_t>{4, 5}, std::vector<uint32_t>{0, 1});
  staging_use su;
  su.dst = 4096;
  su.room_pages = 2;
  std::vector<planned_write> whole, one;
  std::vector<planned_copy> pack;
  plan_kv_chunk(link, src, dst, runs, su, pack, whole);
  plan_kv_chunk(link, src, dst, runs, su, pack, one, {7, 1});
  REQUIRE(whole.size() == 4);  // K3, K7, V3, V7
  CHECK(one == std::vector<planned_write>{whole[1], whole[3]});
}

TEST_CASE("layouts put K then V buffers, tensor-major state, aligned", "[unit][plan]") {
  auto cfg = qwen_like(64, 16);
  auto l = make_layout(cfg);
  const auto& kv = l[pool_kind::kv];
  REQUIRE(kv.buffers.size() == 4);
  CHECK(kv.buffers[0].kind == buffer_kind::k);
  CHECK(kv.buffers[0].layer_id == 3);
  CHECK(kv.buffers[2].kind == buffer_kind::v);
  CHECK(kv.buffers[2].layer_id == 3);
  CHECK(kv.buffers[0].item_bytes == 16 * 1024);
  for (const auto& b : kv.buffers) CHECK(b.offset % 4096 == 0);
  const auto& st = l[pool_kind::state];
  REQUIRE(st.buffers.size() == 6);
  CHECK(st.buffers[0].item_bytes == 49152);
  CHECK(st.buffers[3].item_bytes == 2097152);
  CHECK(st.buffers[3].tensor == 1);
  CHECK(st.buffers[3].layer_id == 0);
  CHECK(l[pool_kind::aux].total_bytes == 8 * 5632);

  SECTION("MLA has one buffer per layer") {
    cfg.kv->mla = true;
    CHECK(make_layout(cfg)[pool_kind::kv].buffers.size() == 2);
  }
}

TEST_CASE("state goes as one slot pair, split into pieces", "[unit][plan]") {
  auto cfg = qwen_like();
  auto l = make_layout(cfg);
  std::vector<planned_write> w;
  plan_state_link(same_link(cfg), l, l, 1, 3, w);
  REQUIRE(w.size() == 6);
  const auto& b = l[pool_kind::state].buffers;
  CHECK(w[4] == planned_write{space::state, space::state, b[4].offset + 2097152,
                              b[4].offset + 3 * 2097152, 2097152});
  split_pieces(w, 1 << 20);
  // 3 conv writes stay whole, 3 temporal writes become 2 pieces each.
  REQUIRE(w.size() == 9);
  uint64_t total = 0;
  for (const auto& x : w) {
    total += x.length;
    CHECK(x.length <= (1u << 20));
  }
  CHECK(total == 3 * 49152 + 3 * 2097152);
  CHECK(w[4].src_offset == w[3].src_offset + (1 << 20));
}

TEST_CASE("index checks name the index, its position and the pool size", "[unit][plan]") {
  const std::vector<uint32_t> pages{1, 2, 9000};
  auto e = check_indices(pages, 8192, "dst page", "pages");
  REQUIRE_FALSE(e);
  CHECK(e.code == errc::invalid_request);
  CHECK(e.message == "dst page 9000 (position 2) is outside the pool of 8192 pages");
  CHECK(check_indices(pages, 9001, "dst page", "pages"));
  const std::vector<uint32_t> twice{7, 400, 3, 400};
  e = check_indices(twice, 8192, "dst page", "pages");
  REQUIRE_FALSE(e);
  CHECK(e.message == "dst page 400 is named twice (positions 1 and 3)");
}

TEST_CASE("chunks map onto the decode page list by position", "[unit][plan]") {
  chunk_cursor c(10);
  auto first = c.take(4, false);
  REQUIRE(first);
  CHECK(first.value == 0);
  first = c.take(3, false);
  REQUIRE(first);
  CHECK(first.value == 4);
  SECTION("overrun is rejected") {
    auto e = c.take(4, false);
    REQUIRE_FALSE(e);
    CHECK(e.code == errc::invalid_request);
    CHECK(e.message ==
          "chunk of 4 pages at position 7 goes beyond the decode's page list of 10 pages");
  }
  SECTION("a short last chunk is rejected") {
    auto e = c.take(2, true);
    REQUIRE_FALSE(e);
    CHECK(e.message == "last chunk ends at page position 9 but the decode prepared 10 pages");
  }
  SECTION("after the last chunk nothing more is accepted") {
    REQUIRE(c.take(3, true));
    CHECK(c.finished());
    auto e = c.take(0, true);
    REQUIRE_FALSE(e);
    CHECK(e.message.find("the last chunk was already sent") == 0);
  }
  SECTION("a zero-page last chunk is fine when all pages were sent") {
    REQUIRE(c.take(3, false));
    auto last = c.take(0, true);
    REQUIRE(last);
    CHECK(last.value == 10);
  }
}

TEST_CASE("commit needs the announced total, in either order", "[unit][plan]") {
  using st = commit_counter::state;
  commit_counter a;
  CHECK(a.add_landed(5) == st::pending);
  CHECK(a.announce(7) == st::pending);
  CHECK(a.add_landed(2) == st::complete);
  commit_counter b;
  CHECK(b.announce(3) == st::pending);
  CHECK(b.add_landed(3) == st::complete);
  commit_counter c;
  CHECK(c.add_landed(4) == st::pending);
  CHECK(c.announce(3) == st::overflow);
}

TEST_CASE("compatibility names the first difference", "[unit][plan]") {
  auto a = qwen_like();
  auto b = qwen_like(999);  // pool sizes may differ
  auto error = [](const pools_config& x, const pools_config& y) {
    auto r = make_link_plan(rank_schema{x}, rank_schema{y});
    return r.message;
  };
  CHECK(error(a, b).empty());
  CHECK(compatibility_hash(a) == compatibility_hash(b));
  b.kv->page_tokens = 16;
  CHECK(error(a, b) == "kv.page_tokens differs: prefill has 1, decode has 16");
  CHECK(compatibility_hash(a) != compatibility_hash(b));
  auto c = qwen_like();
  c.mamba->tensors[1].dtype_bytes = 2;
  CHECK(error(a, c) ==
        "mamba.tensors[1] (temporal) dtype_bytes differs: prefill has 4, decode has 2");
  auto d = qwen_like();
  d.aux.reset();
  CHECK(error(a, d) == "pool aux is present on the prefill but absent on the decode");
  // A TP 4 decode with kv_heads 1 and no total_heads assumes 4 heads; the message says where
  // each side's count comes from (docs/geometry.md).
  auto tp4 = qwen_like();
  tp4.kv->kv_heads = 1;
  tp4.mamba->tensors[0].shape[0] = 8192 / 4;
  tp4.mamba->tensors[1].shape[0] = 32 / 4;
  auto heads = make_link_plan(rank_schema{a, 1, 0}, rank_schema{tp4, 4, 0});
  REQUIRE(!heads);
  CHECK(heads.message ==
        "kv total heads differ: prefill has 2 (kv_heads 2 x TP 1), decode has 4 (kv_heads 1 x "
        "TP 4); set pools.kv.total_heads on the side whose heads are replicated");
  tp4.kv->total_heads = 4;
  heads = make_link_plan(rank_schema{a, 1, 0}, rank_schema{tp4, 4, 0});
  REQUIRE(!heads);
  CHECK(heads.message ==
        "kv total heads differ: prefill has 2 (kv_heads 2 x TP 1), decode has 4 "
        "(pools.kv.total_heads 4); set pools.kv.total_heads on the side whose heads are "
        "replicated");
  auto e = qwen_like();
  e.kv->layer_ids = {3, 11};
  CHECK(error(a, e) ==
        "prefill kv layer 7 has no counterpart on the decode (decode layers [3, 11])");
}

TEST_CASE("rank mapping follows the scatter and gather table", "[unit][geometry]") {
  CHECK(prefill_ranks_for(2, 2, 1) == std::vector<uint32_t>{1});
  CHECK(prefill_ranks_for(1, 4, 3) == std::vector<uint32_t>{0});
  CHECK(prefill_ranks_for(2, 8, 5) == std::vector<uint32_t>{1});
  CHECK(prefill_ranks_for(4, 2, 1) == std::vector<uint32_t>{2, 3});
  CHECK(decode_ranks_per_prefill(1, 4) == 4);
  CHECK(decode_ranks_per_prefill(4, 2) == 1);
  // Qwen3-Next: 2 KV heads. TP4 replicates each head twice; TP1 -> TP4 gives decode ranks 0,1
  // head 0 and ranks 2,3 head 1 (the GQA rule MoRI gets wrong).
  CHECK(kv_heads_of(2, 4, 1) == unit_range{0, 1});
  CHECK(kv_heads_of(2, 4, 2) == unit_range{1, 1});
  CHECK(kv_heads_of(16, 4, 1) == unit_range{4, 4});
}

TEST_CASE("Qwen3-Next TP1 -> TP4: head slices and GDN conv sub-blocks", "[unit][geometry]") {
  for (uint32_t d = 0; d < 4; ++d) {
    CAPTURE(d);
    auto r = make_link_plan(qwen_rank(1, 0), qwen_rank(4, d));
    REQUIRE(static_cast<bool>(r));
    const auto& l = r.value;
    CHECK(l.in_group);
    CHECK(l.kv == kv_mode::pack);  // the decode row (one head) is a slice of the prefill row
    CHECK(l.row == segment{d / 2 * 512, 0, 512});
    CHECK(l.aux);  // the only prefill rank sends the aux row to every decode rank
  }
  // Decode rank 1, conv [8192, 3] bf16 split [2048, 2048, 4096]: q [512,1024) -> [0,512),
  // k [2560,3072) -> [512,1024), v [5120,6144) -> [1024,2048); 6 bytes per channel.
  const auto l = make_link_plan(qwen_rank(1, 0), qwen_rank(4, 1)).value;
  CHECK(l.state_segments[0] == std::vector<segment>{{512 * 6, 0, 512 * 6},
                                                    {2560 * 6, 512 * 6, 512 * 6},
                                                    {5120 * 6, 1024 * 6, 1024 * 6}});
  // Temporal [32, 128, 128] fp32 on heads: rank 1 gets heads [8, 16), 64 KiB each.
  CHECK(l.state_segments[1] == std::vector<segment>{{8 * 65536, 0, 8 * 65536}});
}

TEST_CASE("Qwen3-Next TP4 -> TP2: one replica sends KV, every rank its state", "[unit][geometry]") {
  for (uint32_t p = 0; p < 4; ++p) {
    CAPTURE(p);
    const auto l = make_link_plan(qwen_rank(4, p), qwen_rank(2, p / 2)).value;
    CHECK(l.in_group);
    // Ranks 0 and 1 both hold head 0; only rank 0 sends it. Heads are whole on both sides.
    CHECK(l.kv == (p % 2 == 0 ? kv_mode::whole_pages : kv_mode::none));
    CHECK(l.aux == (p % 2 == 0));
    // conv [2048, 3] per prefill rank -> [4096, 3] per decode rank, three sub-blocks.
    REQUIRE(l.state_segments[0].size() == 3);
    CHECK(l.state_segments[0][0] == segment{0, (p % 2) * 512 * 6, 512 * 6});
    CHECK(l.state_segments[1] == std::vector<segment>{{0, (p % 2) * 8 * 65536, 8 * 65536}});
    const auto other = make_link_plan(qwen_rank(4, p), qwen_rank(2, 1 - p / 2)).value;
    CHECK_FALSE(other.in_group);
  }
}

TEST_CASE("geometry errors name the tensor and the numbers", "[unit][geometry]") {
  auto text = [](const rank_schema& s, const rank_schema& d) {
    auto r = make_link_plan(s, d);
    return r.message;
  };
  auto d = qwen_rank(4, 0);
  auto s = qwen_rank(1, 0);
  s.pools.mamba->tensors[0].slice_axis.reset();
  s.pools.mamba->tensors[0].shard_groups.clear();
  d.pools.mamba->tensors[0].slice_axis.reset();
  d.pools.mamba->tensors[0].shard_groups.clear();
  CHECK(text(s, d) ==
        "mamba.tensors[0] (conv) has no slice_axis: it cannot be re-sliced from prefill TP 1 to "
        "decode TP 4 (refusing a whole-slot copy)");
  CHECK(text(s, qwen_rank(1, 0)).find("slicing differs") != std::string::npos);
  auto equal = s;
  CHECK(text(s, equal).empty());  // equal TP needs no slicing metadata

  auto odd_s = qwen_rank(1, 0), odd_d = qwen_rank(8, 0);
  odd_s.pools.mamba->tensors[0].shard_groups = {2044, 2052, 4096};
  odd_d.pools.mamba->tensors[0].shard_groups = {2044, 2052, 4096};
  CHECK(text(odd_s, odd_d) ==
        "mamba.tensors[0] (conv) does not divide evenly: shard group of 2044 over prefill TP 1 "
        "and decode TP 8");
  CHECK(text(qwen_rank(2, 0), qwen_rank(3, 0)) ==
        "TP sizes do not divide: prefill TP 2 and decode TP 3");
}
