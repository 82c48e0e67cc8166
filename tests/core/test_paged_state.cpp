// Paged state components (SGLang's swa, dsa and minimax_index_k state types): a state pool
// indexed by a page list of its own instead of one Mamba slot. The config, the request checks,
// the claims, the handshake geometry, the planner and the prefill room's rule that both sides
// name as many state pages, each with the text a user reads.

#include <catch2/catch.hpp>
#include <string>
#include <variant>
#include <vector>

#include "config_yaml.hpp"
#include "core/dst_claims.hpp"
#include "core/geometry.hpp"
#include "core/plan.hpp"
#include "core/request_checks.hpp"
#include "core/sender_room.hpp"

using namespace ferry;
using ferry::test::base_yaml;
using ferry::test::parse_ok;
using ferry::test::replace;
using ferry::test::validate_error;

namespace {

/// gpt-oss-shaped: full-attention layers 1 and 3 in the kv pool, sliding-window layers 0 and 2
/// as a swa state pool of 32 pages whose K and V (2 heads of 64 bf16 per token) are its tensors.
const std::string swa_yaml = R"(node:
  name: n0
listen:
  client: /tmp/ferry-test.sock
tp:
  size: 2
  rank: 0
pools:
  kv:
    layer_ids: [1, 3]
    page_tokens: 1
    kv_heads: 2
    head_dim: 64
    dtype_bytes: 2
    pages: 16
  mamba:
    type: swa
    slots: 32
    layer_ids: [0, 2]
    tensors:
      - name: k
        shape: [2, 64]
        dtype_bytes: 2
      - name: v
        shape: [2, 64]
        dtype_bytes: 2
  aux:
    rows: 8
    row_bytes: 64
)";

std::string refusal(const result<>& r) {
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::invalid_request);
  return r.message;
}

rank_schema schema(const std::string& yaml, uint32_t tp, uint32_t rank) {
  auto cfg = parse_ok(yaml);
  cfg.tp.size = tp;
  cfg.tp.rank = rank;
  return schema_of(cfg);
}

/// The DSA form: MLA KV (one buffer per layer) and an unsliced indexer cache on the same layers.
std::string dsa_yaml() {
  auto y = replace(swa_yaml, "    kv_heads: 2\n", "    kv_heads: 1\n    mla: true\n");
  y = replace(y, "    type: swa\n", "    type: dsa\n");
  y = replace(y, "    layer_ids: [0, 2]\n", "    layer_ids: [1, 3]\n");
  return y;
}

}  // namespace

TEST_CASE("paged state: the config names the type, and each type's rules are checked",
          "[unit][paged_state]") {
  const auto cfg = parse_ok(swa_yaml);
  REQUIRE(validate_config(cfg));
  CHECK(cfg.pools.mamba->type == state_type::swa);
  CHECK(parse_ok(base_yaml).pools.mamba->type == state_type::mamba);
  // The emitted text (what peers read) keeps the type.
  const auto again = parse_config_text(to_yaml(cfg));
  REQUIRE(again);
  CHECK(again.value.pools.mamba->type == state_type::swa);
  CHECK(ferry::test::parse_error(replace(swa_yaml, "type: swa", "type: swa_ring")) ==
        "pools.mamba.type: expected mamba, swa, dsa or minimax_index_k, got swa_ring");
  CHECK(validate_error(replace(swa_yaml, "type: swa", "type: dsa")) ==
        "pools.mamba.type: expected MLA KV (pools.kv.mla: true) for dsa state: the DSA indexer "
        "cache exists for MLA models only");
  CHECK(validate_config(parse_ok(dsa_yaml())));  // on the KV's own layers
  auto minimax = replace(swa_yaml, "type: swa", "type: minimax_index_k");
  minimax = replace(minimax, "tp:\n", "pp:\n  size: 2\n  rank: 0\ntp:\n");
  CHECK(validate_error(minimax) ==
        "pools.mamba.type: expected pp.size 1 for minimax_index_k state (SGLang refuses it with "
        "PP > 1), got pp.size 2");
  // A Mamba pool's layers stay apart from the attention layers.
  CHECK(validate_error(replace(dsa_yaml(), "type: dsa", "type: mamba")) ==
        "pools.mamba.layer_ids: expected ids disjoint from pools.kv.layer_ids, got 1 in both");
}

TEST_CASE("paged state: a request names state pages, never a slot, and a Mamba pool the reverse",
          "[unit][paged_state]") {
  const auto cfg = parse_ok(swa_yaml);
  const auto layout = make_layout(cfg.pools);
  proto::prepare p;
  p.room = 5;
  p.prefill_peers = {"10.0.0.1:7401"};
  p.dst_pages = {0, 1, 2};
  p.state_pages = {30, 4};  // the window's pages, in token order
  p.aux_row = 1;
  CHECK(check_prepare(cfg, layout, p));
  p.state_slot = 0;
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 5: dst state slot 0 given, but the swa state pool is indexed by pages "
        "(state_pages), not by a slot");
  p.state_slot = no_index;
  p.state_pages = {4, 32};
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 5: dst swa state page 32 (position 1) is outside the pool of 32 pages");
  p.state_pages = {4, 4};
  CHECK(refusal(check_prepare(cfg, layout, p)) ==
        "room 5: dst swa state page 4 is named twice (positions 0 and 1)");
  p.state_pages = {};  // a window of no pages is a list like any other
  CHECK(check_prepare(cfg, layout, p));

  proto::send s;
  s.room = 5;
  s.src_pages = {7};
  s.state_pages = {1};
  CHECK(refusal(check_send(cfg, layout, s)) ==
        "room 5: state slot, state pages and aux row go only with the last chunk");
  s.last = true;
  s.aux_row = 0;
  CHECK(check_send(cfg, layout, s));

  // The single-state rule stays: a Mamba pool takes exactly one slot, never a list.
  const auto mamba = parse_ok(base_yaml);
  const auto ml = make_layout(mamba.pools);
  s.state_slot = 1;
  CHECK(refusal(check_send(mamba, ml, s)) ==
        "mamba requires single state index: room 5 got 1 src state pages (exactly one src state "
        "slot, as state_slot)");
}

TEST_CASE("paged state: a prepare claims its state pages whole, or nothing",
          "[unit][paged_state]") {
  dst_claims c(16, 8, 4);
  const std::vector<uint32_t> kv_a{0, 1}, kv_b{2}, kv_c{3};
  REQUIRE(c.claim(10, kv_a, no_index, 0, std::vector<uint32_t>{5, 6}));
  CHECK(c.slots_held() == 2);
  auto e = c.claim(11, kv_b, no_index, 1, std::vector<uint32_t>{7, 6});
  CHECK(refusal(e) == "room 11: dst state page 6 (position 1) is held by active room 10");
  CHECK(c.held() == 5);  // room 11 took nothing
  c.release(10, kv_a, no_index, 0, std::vector<uint32_t>{5, 6});
  CHECK(c.held() == 0);
  CHECK(c.claim(11, kv_c, no_index, 1, std::vector<uint32_t>{7, 6}));
}

TEST_CASE("paged state: the handshake refuses a type mismatch and SWA under a TP mismatch",
          "[unit][paged_state]") {
  const auto tp2 = schema(swa_yaml, 2, 0);
  auto decode = schema(swa_yaml, 2, 0);
  decode.pools.mamba->type = state_type::dsa;
  auto r = make_link_plan(tp2, decode);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::peer_incompatible);
  CHECK(r.message == "state type differs: prefill has swa, decode has dsa");

  auto tp1 = schema(replace(swa_yaml, "kv_heads: 2", "kv_heads: 4"), 1, 0);
  for (auto& t : tp1.pools.mamba->tensors) t.shape = {4, 64};
  r = make_link_plan(tp2, tp1);
  REQUIRE_FALSE(r);
  CHECK(r.message ==
        "swa state cannot move from prefill TP 2 to decode TP 1: SGLang refuses SWA state under "
        "a TP mismatch for non-MLA models");
  auto mm = tp2, mm1 = tp1;
  mm.pools.mamba->type = mm1.pools.mamba->type = state_type::minimax_index_k;
  r = make_link_plan(mm, mm1);
  REQUIRE_FALSE(r);
  CHECK(r.message ==
        "minimax_index_k state cannot move from prefill TP 2 to decode TP 1: SGLang refuses "
        "minimax_index_k under a TP mismatch");

  // Equal TP: whole pages of every (tensor, layer) buffer.
  auto same = make_link_plan(tp2, schema(swa_yaml, 2, 0));
  REQUIRE(same);
  CHECK(same.value.state_buffers.size() == 4);
  CHECK(same.value.state_segments ==
        std::vector<std::vector<segment>>{{{0, 0, 256}}, {{0, 0, 256}}});
}

TEST_CASE("paged state: DSA beside MLA KV moves replicated, from one prefill rank of a group",
          "[unit][paged_state]") {
  const auto y = dsa_yaml();
  const auto d = schema(y, 1, 0);
  const auto from0 = make_link_plan(schema(y, 2, 0), d);
  const auto from1 = make_link_plan(schema(y, 2, 1), d);
  REQUIRE(from0);
  REQUIRE(from1);
  CHECK(from0.value.state_buffers.size() == 4);
  CHECK(from1.value.state_buffers.empty());  // rank 0 sends the same bytes
  // Scatter: one prefill rank feeds both decode ranks.
  CHECK(make_link_plan(schema(y, 1, 0), schema(y, 2, 1)).value.state_buffers.size() == 4);
  // A sliced indexer cannot be replicated.
  auto sliced = schema(y, 2, 0);
  sliced.pools.mamba->tensors[0].slice_axis = 0;
  const auto r = make_link_plan(sliced, d);
  REQUIRE_FALSE(r);
  CHECK(r.message ==
        "dsa state cannot move from prefill TP 2 to decode TP 1: its tensors are sliced across TP "
        "ranks, and a paged state component moves under a TP mismatch only replicated (MLA)");
}

TEST_CASE("paged state: pages pair by position, one write per run contiguous on both sides",
          "[unit][paged_state]") {
  const auto s = schema(swa_yaml, 2, 0);
  const auto link = make_link_plan(s, s);
  REQUIRE(link);
  const auto l = make_layout(s.pools);
  const auto& b = l[pool_kind::state].buffers;
  REQUIRE(b.size() == 4);
  const std::vector<uint32_t> src{3, 4, 5, 9}, dst{10, 11, 12, 2};
  std::vector<planned_write> w;
  plan_state_pages(link.value, l, l, src, dst, w);
  REQUIRE(w.size() == 8);  // 2 runs x 4 buffers
  CHECK(w[0] == planned_write{space::state, space::state, b[0].offset + 3 * 256,
                              b[0].offset + 10 * 256, 3 * 256});
  CHECK(w[1] == planned_write{space::state, space::state, b[0].offset + 9 * 256,
                              b[0].offset + 2 * 256, 256});
  // A layer range keeps the buffers of its layers (tensor k and v of layer 2).
  w.clear();
  plan_state_pages(link.value, l, l, src, dst, w, layer_range{2, 1});
  CHECK(w.size() == 4);
  for (const auto& x : w) {
    const bool layer2 =
        (x.src_offset >= b[1].offset && x.src_offset < b[2].offset) || x.src_offset >= b[3].offset;
    CHECK(layer2);
  }
}

TEST_CASE("paged state: a last chunk must name as many state pages as the decode prepared",
          "[unit][paged_state]") {
  using namespace ferry::sender;
  room m{7, lifecycle_limits{}, 0, 1, 0, {0, 1, 2, 3}};
  m.on(ev::start{});
  ev::prepare p;
  p.link = 1;
  p.address = "decode1:7401";
  p.in_group = true;
  p.pages = 1;
  p.state_pages = 2;
  p.token = 101;
  m.on(p);
  REQUIRE(m.ready());
  proto::send c;
  c.room = 7;
  c.src_pages = {4};
  c.last = true;
  c.state_pages = {1, 2, 3};
  auto fx = m.on(ev::chunk{c});
  REQUIRE(fx.size() == 1);
  const auto* r = std::get_if<reply>(&fx[0]);
  REQUIRE(r);
  CHECK(refusal(r->outcome) ==
        "room 7: the last chunk names 3 state pages but the decode prepared 2 (the lists must be "
        "the same length)");
  c.state_pages = {1, 2};
  fx = m.on(ev::chunk{c});
  REQUIRE(fx.size() == 2);
  CHECK(std::holds_alternative<post_chunk>(fx[1]));
}
