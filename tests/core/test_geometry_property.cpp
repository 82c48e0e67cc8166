// Property tests of the geometry-aware planner (core/geometry.hpp, core/plan.hpp) against an
// independent reference.
//
// The reference builds the full, unsharded tensors of one request (KV per layer, per K/V, per
// token, all heads; state per layer and tensor, the whole slot), shards them into every prefill
// rank's pools by the ownership rules of geometry.hpp's header comment, and re-shards them for
// the decode geometry to get the bytes each decode rank must end up with. It uses nothing from
// geometry.hpp or plan.hpp except plain data types; pool offsets come from make_layout.
//
// The simulator runs the planner for every decode rank (select_prefill_peers, make_link_plan,
// then per chunk coalesce_runs / plan_kv_chunk or plan_kv + expand_pack_jobs, plan_state_link,
// plan_aux_link, plan_landing and plan_unpack),
// executes the planned copies and writes on byte vectors, and checks: the decode bytes equal the
// reference, nothing outside the room's pages, slot, aux row and staging is touched, every
// destination byte is written, and none is written twice.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "core/config.hpp"
#include "core/geometry.hpp"
#include "core/layout.hpp"
#include "core/model_catalogue.hpp"
#include "core/pack.hpp"
#include "core/plan.hpp"

using namespace ferry;
using Catch::Matchers::Contains;

namespace {

using bytes = std::vector<uint8_t>;

/// splitmix64: deterministic, and fast enough to fill every pool (mostly alignment padding).
struct rng_t {
  using result_type = uint64_t;
  uint64_t state;
  explicit rng_t(uint64_t seed) : state(seed) {}
  static constexpr uint64_t min() { return 0; }
  static constexpr uint64_t max() { return ~uint64_t{0}; }
  uint64_t operator()() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

/// A broken invariant of the test itself (not of the planner): fails the test case loudly
/// without counting an assertion per byte.
void invariant(bool ok, const char* what) {
  if (!ok) throw std::logic_error(std::string("test invariant broken: ") + what);
}

// ---------------------------------------------------------------------------------------------
// Model description (unsharded) and the per-rank schemas built from it.

struct kv_model {
  uint32_t heads = 1;  ///< total KV heads H (MLA: ignored, one replicated row)
  uint32_t head_dim = 2;
  uint32_t dtype_bytes = 2;
  uint32_t page_tokens = 1;
  bool mla = false;
  std::vector<uint32_t> layer_ids;
};

struct tensor_model {
  std::string name;
  std::vector<uint64_t> full_shape;  ///< unsharded per-slot shape (per-rank when no slice axis)
  uint32_t dtype_bytes = 2;
  std::optional<uint32_t> slice_axis;
  std::vector<uint64_t> shard_groups;
  std::vector<uint64_t> shard_units{};  ///< empty: every group sliced element by element
};

struct model {
  std::optional<kv_model> kv;
  std::vector<uint32_t> mamba_layers;
  std::vector<tensor_model> tensors;
  uint64_t aux_row_bytes = 0;
};

/// Layer sets of the PP stages of one side; empty = one stage holding every layer.
using stages = std::vector<std::vector<uint32_t>>;

struct pool_sizes {
  uint64_t pages = 8;
  uint64_t slots = 3;
  uint64_t rows = 3;
};

uint64_t product(const std::vector<uint64_t>& v, size_t from, size_t to) {
  uint64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= v[i];
  return p;
}

std::vector<uint32_t> held(const std::vector<uint32_t>& model_ids,
                           const std::vector<uint32_t>* stage_layers) {
  if (!stage_layers) return model_ids;
  std::vector<uint32_t> out;
  for (auto id : model_ids)
    if (std::find(stage_layers->begin(), stage_layers->end(), id) != stage_layers->end())
      out.push_back(id);
  return out;
}

size_t index_of(const std::vector<uint32_t>& ids, uint32_t id) {
  auto it = std::find(ids.begin(), ids.end(), id);
  invariant(it != ids.end(), "layer id of a buffer is not in the model");
  return static_cast<size_t>(it - ids.begin());
}

/// Elements of group i (of `size` elements in `units` units) held by TP rank r of P, the rule
/// written out: P divides the units: a block of units/P units; else (units divides P) the one
/// unit r / (P/units), which P/units ranks hold alike.
std::pair<uint64_t, uint64_t> ref_group_share(uint64_t size, uint64_t units, uint32_t P,
                                              uint32_t r) {
  const uint64_t len = size / units;
  if (units >= P) {
    invariant(units % P == 0, "units of a sliced group do not divide by P");
    return {r * (units / P) * len, (units / P) * len};
  }
  invariant(P % units == 0, "units of a replicated group do not divide P");
  const uint64_t holders = P / units;
  return {(r / holders) * len, len};
}

uint64_t ref_units(const tensor_model& t, size_t i) {
  return t.shard_units.empty() ? t.shard_groups[i] : t.shard_units[i];
}

std::vector<uint64_t> rank_shape(const tensor_model& t, uint32_t tp) {
  auto s = t.full_shape;
  if (!t.slice_axis) return s;
  if (t.shard_units.empty()) {
    s[*t.slice_axis] /= tp;
    return s;
  }
  uint64_t held = 0;
  for (size_t i = 0; i < t.shard_groups.size(); ++i)
    held += ref_group_share(t.shard_groups[i], ref_units(t, i), tp, 0).second;
  s[*t.slice_axis] = held;
  return s;
}

/// The schema of TP rank `rank` of `tp` in PP stage `stage` of `pp` holding `stage_layers`
/// (nullptr: all). `explicit_total`: set kv total_heads even where kv_heads x tp gives it.
/// A pool the stage holds no layer of is left out; `reversed` lists the layer ids backwards.
rank_schema make_schema(const model& m, uint32_t tp, uint32_t rank, uint32_t pp, uint32_t stage,
                        const std::vector<uint32_t>* stage_layers, const pool_sizes& sz,
                        bool explicit_total = true, bool reversed = false) {
  auto ids = [&](const std::vector<uint32_t>& model_ids) {
    auto v = held(model_ids, stage_layers);
    if (reversed) std::reverse(v.begin(), v.end());
    return v;
  };
  rank_schema s;
  s.tp_size = tp;
  s.tp_rank = rank;
  s.pp_size = pp;
  s.pp_rank = stage;
  if (m.kv && !ids(m.kv->layer_ids).empty()) {
    const auto& k = *m.kv;
    kv_pool_config c;
    c.layer_ids = ids(k.layer_ids);
    c.page_tokens = k.page_tokens;
    c.kv_heads = k.mla ? 1 : std::max<uint32_t>(1, k.heads / tp);
    c.total_heads = k.mla ? 0 : (explicit_total || tp > k.heads ? k.heads : 0);
    c.head_dim = k.head_dim;
    c.dtype_bytes = k.dtype_bytes;
    c.mla = k.mla;
    c.pages = sz.pages;
    s.pools.kv = c;
  }
  if (!m.tensors.empty() && !ids(m.mamba_layers).empty()) {
    mamba_pool_config c;
    c.slots = sz.slots;
    c.layer_ids = ids(m.mamba_layers);
    for (const auto& t : m.tensors) {
      state_tensor_config x;
      x.name = t.name;
      x.shape = rank_shape(t, tp);
      x.dtype_bytes = t.dtype_bytes;
      x.slice_axis = t.slice_axis;
      x.shard_groups = t.shard_groups;
      x.shard_units = t.shard_units;
      c.tensors.push_back(x);
    }
    s.pools.mamba = c;
  }
  if (m.aux_row_bytes) s.pools.aux = aux_pool_config{sz.rows, m.aux_row_bytes};
  return s;
}

// ---------------------------------------------------------------------------------------------
// The reference: full tensors, and the bytes of them each rank holds.

void fill_random(bytes& b, rng_t& rng) {
  size_t i = 0;
  for (; i + 8 <= b.size(); i += 8) {
    const uint64_t x = rng();
    std::memcpy(b.data() + i, &x, 8);
  }
  const uint64_t x = rng();
  for (size_t j = 0; i + j < b.size(); ++j) b[i + j] = static_cast<uint8_t>(x >> (8 * j));
}

struct full_data {
  std::vector<bytes> kv;                  ///< [layer index * parts + part]: tokens x H x head
  std::vector<std::vector<bytes>> state;  ///< [tensor][layer index]: the unsharded slot
  bytes aux;
};

uint32_t kv_parts(const kv_model& k) { return k.mla ? 1 : 2; }
uint32_t kv_total_heads(const kv_model& k) { return k.mla ? 1 : k.heads; }
uint64_t head_bytes(const kv_model& k) { return uint64_t{k.head_dim} * k.dtype_bytes; }

/// Global heads held by TP rank r of P (geometry.hpp's ownership rule, written out).
std::vector<uint32_t> ref_heads(const kv_model& k, uint32_t P, uint32_t r) {
  if (k.mla) return {0};
  const uint32_t H = k.heads;
  std::vector<uint32_t> out;
  if (P <= H) {
    for (uint32_t h = r * (H / P); h < (r + 1) * (H / P); ++h) out.push_back(h);
  } else {
    out.push_back(r / (P / H));
  }
  return out;
}

/// `ps`: prefill TP size (a tensor without a slice axis has one independent slot per rank).
full_data make_full(const model& m, uint32_t tokens, uint32_t ps, rng_t& rng) {
  full_data f;
  if (m.kv) {
    const auto& k = *m.kv;
    for (size_t l = 0; l < k.layer_ids.size() * kv_parts(k); ++l) {
      bytes b(uint64_t{tokens} * kv_total_heads(k) * head_bytes(k));
      fill_random(b, rng);
      f.kv.push_back(std::move(b));
    }
  }
  for (const auto& t : m.tensors) {
    std::vector<bytes> per_layer;
    const uint64_t n = product(t.full_shape, 0, t.full_shape.size()) * t.dtype_bytes;
    for (size_t l = 0; l < m.mamba_layers.size(); ++l) {
      bytes b(t.slice_axis ? n : n * ps);
      fill_random(b, rng);
      per_layer.push_back(std::move(b));
    }
    f.state.push_back(std::move(per_layer));
  }
  f.aux.resize(m.aux_row_bytes);
  fill_random(f.aux, rng);
  return f;
}

/// The slot of TP rank r of P: each shard group split evenly (or, with shard units fewer than
/// P, the one unit the rank holds whole), groups concatenated, outer rows repeated. Without a
/// slice axis, rank r's own independent slot.
bytes ref_slot(const tensor_model& t, const bytes& full, uint32_t P, uint32_t r) {
  if (!t.slice_axis) {
    const uint64_t n = product(t.full_shape, 0, t.full_shape.size()) * t.dtype_bytes;
    invariant(full.size() >= (r + 1) * n, "no independent slot for this rank");
    return bytes(full.begin() + r * n, full.begin() + (r + 1) * n);
  }
  const size_t a = *t.slice_axis;
  const uint64_t outer = product(t.full_shape, 0, a);
  const uint64_t D = t.full_shape[a];
  const uint64_t unit = product(t.full_shape, a + 1, t.full_shape.size()) * t.dtype_bytes;
  const std::vector<uint64_t> groups =
      t.shard_groups.empty() ? std::vector<uint64_t>{D} : t.shard_groups;
  bytes out;
  for (uint64_t o = 0; o < outer; ++o) {
    uint64_t off = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      const uint64_t G = groups[i];
      const auto [first, n] = t.shard_units.empty()
                                  ? std::pair<uint64_t, uint64_t>{r * (G / P), G / P}
                                  : ref_group_share(G, ref_units(t, i), P, r);
      for (uint64_t u = first; u < first + n; ++u) {
        const uint64_t at = (o * D + off + u) * unit;
        out.insert(out.end(), full.begin() + at, full.begin() + at + unit);
      }
      off += G;
    }
  }
  return out;
}

struct memory {
  std::array<bytes, space_count> s;
  bytes& operator[](space x) { return s[static_cast<int>(x)]; }
  const bytes& operator[](space x) const { return s[static_cast<int>(x)]; }
};

memory pool_memory(const node_layout& lay, rng_t& rng) {
  memory m;
  m[space::kv].resize(lay[pool_kind::kv].total_bytes);
  m[space::state].resize(lay[pool_kind::state].total_bytes);
  m[space::aux].resize(lay[pool_kind::aux].total_bytes);
  for (auto sp : {space::kv, space::state, space::aux}) fill_random(m[sp], rng);
  return m;
}

void put(bytes& mem, uint64_t at, const uint8_t* src, uint64_t n, bytes* mask) {
  invariant(at + n <= mem.size(), "reference placement outside the pool");
  std::copy(src, src + n, mem.begin() + at);
  if (mask) std::fill(mask->begin() + at, mask->begin() + at + n, 1);
}

/// Write the room's bytes held by TP rank r of P into pool memory `mem` (laid out by `lay`),
/// marking them in `mask` when given. `with_aux`: this rank's aux row holds the room's metadata
/// (a PP stage before the last has not sampled the output token, so its row is junk).
void place_room(const model& m, const full_data& f, const node_layout& lay, uint32_t P, uint32_t r,
                const std::vector<uint32_t>& pages, uint32_t slot, uint32_t row, memory& mem,
                memory* mask, bool with_aux = true) {
  if (m.kv) {
    const auto& k = *m.kv;
    const auto heads = ref_heads(k, P, r);
    const uint64_t hb = head_bytes(k);
    const uint64_t row_bytes = heads.size() * hb;
    const uint32_t H = kv_total_heads(k);
    for (const auto& b : lay[pool_kind::kv].buffers) {
      invariant(b.item_bytes == k.page_tokens * row_bytes, "page bytes differ from the model");
      const uint32_t part = b.kind == buffer_kind::v ? 1 : 0;
      const bytes& full = f.kv[index_of(k.layer_ids, b.layer_id) * kv_parts(k) + part];
      for (size_t pos = 0; pos < pages.size(); ++pos)
        for (uint32_t t = 0; t < k.page_tokens; ++t) {
          const uint64_t token = pos * k.page_tokens + t;
          for (size_t j = 0; j < heads.size(); ++j)
            put(mem[space::kv], b.offset + pages[pos] * b.item_bytes + t * row_bytes + j * hb,
                full.data() + (token * H + heads[j]) * hb, hb,
                mask ? &(*mask)[space::kv] : nullptr);
        }
    }
  }
  for (const auto& b : lay[pool_kind::state].buffers) {
    const bytes s = ref_slot(m.tensors[b.tensor],
                             f.state[b.tensor][index_of(m.mamba_layers, b.layer_id)], P, r);
    invariant(s.size() == b.item_bytes, "slot bytes differ from the model");
    put(mem[space::state], b.offset + slot * b.item_bytes, s.data(), s.size(),
        mask ? &(*mask)[space::state] : nullptr);
  }
  if (m.aux_row_bytes && with_aux) {
    const auto& b = lay[pool_kind::aux].buffers.at(0);
    put(mem[space::aux], b.offset + row * b.item_bytes, f.aux.data(), f.aux.size(),
        mask ? &(*mask)[space::aux] : nullptr);
  }
}

/// Distinct random pages of a pool of `pool` pages, with some contiguous runs.
std::vector<uint32_t> random_pages(uint64_t pool, uint32_t n, rng_t& rng) {
  std::vector<std::vector<uint32_t>> blocks;
  for (uint32_t p = 0; p < pool;) {
    const uint32_t len = std::min<uint32_t>(1 + rng() % 3, static_cast<uint32_t>(pool - p));
    std::vector<uint32_t> b;
    for (uint32_t i = 0; i < len; ++i) b.push_back(p + i);
    blocks.push_back(b);
    p += len;
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<uint32_t> out;
  for (const auto& b : blocks) out.insert(out.end(), b.begin(), b.end());
  invariant(out.size() >= n, "pool smaller than the room");
  out.resize(n);
  return out;
}

/// 1-3 non-empty chunks [first, end) covering [0, n).
std::vector<std::pair<uint32_t, uint32_t>> random_chunks(uint32_t n, rng_t& rng) {
  const uint32_t k = std::min<uint32_t>(1 + rng() % 3, n);
  std::vector<uint32_t> cuts;
  while (cuts.size() + 1 < k) {
    const uint32_t c = 1 + rng() % (n - 1);
    if (std::find(cuts.begin(), cuts.end(), c) == cuts.end()) cuts.push_back(c);
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.push_back(n);
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t first = 0;
  for (auto c : cuts) out.emplace_back(first, c), first = c;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Where a byte is, for failure messages.

/// "K", "V" or "KV" for a KV buffer, "" otherwise.
const char* kind_name(buffer_kind k) { return k <= buffer_kind::kv ? to_string(k) : ""; }

std::string where(const model& m, const node_layout& lay, space sp, uint64_t off) {
  if (sp == space::staging) return fmt::format("staging byte {}", off);
  const auto& pool = lay[static_cast<pool_kind>(static_cast<int>(sp))];
  for (size_t i = 0; i < pool.buffers.size(); ++i) {
    const auto& b = pool.buffers[i];
    if (off < b.offset || off >= b.offset + b.items * b.item_bytes) continue;
    const uint64_t item = (off - b.offset) / b.item_bytes, in = (off - b.offset) % b.item_bytes;
    if (sp == space::kv) {
      const uint64_t row = b.item_bytes / m.kv->page_tokens;
      return fmt::format(
          "kv buffer {} (layer {} {}) page {} token {} row byte {} (head {} byte {})", i,
          b.layer_id, kind_name(b.kind), item, in / row, in % row, in % row / head_bytes(*m.kv),
          in % row % head_bytes(*m.kv));
    }
    if (sp == space::state)
      return fmt::format("state buffer {} (tensor {} layer {}) slot {} byte {}", i,
                         m.tensors[b.tensor].name, b.layer_id, item, in);
    return fmt::format("aux row {} byte {}", item, in);
  }
  return fmt::format("{} padding byte {}", to_string(sp), off);
}

// ---------------------------------------------------------------------------------------------
// The simulator.

struct rank_state {
  uint32_t stage = 0, tp_rank = 0;
  rank_schema schema;
  node_layout lay;
  memory mem;
  std::vector<uint32_t> pages;
  uint32_t slot = 0, row = 0;
  std::string name;
};

/// Which bytes of a decode rank were written, how often, and by which prefill rank.
struct tracker {
  std::array<std::vector<int16_t>, space_count> writer;
  std::array<std::vector<uint8_t>, space_count> count;
  uint64_t cross = 0, same = 0;  ///< bytes written again by another / the same prefill rank
  std::string first_cross, first_same;

  explicit tracker(const memory& mem) {
    for (int i = 0; i < space_count; ++i) {
      writer[i].assign(mem.s[i].size(), -1);
      count[i].assign(mem.s[i].size(), 0);
    }
  }
  /// `what()` describes the write or copy, called only for the first duplicate.
  template <class Describe>
  void mark(space sp, uint64_t off, uint64_t len, int16_t who, Describe what) {
    auto& w = writer[static_cast<int>(sp)];
    auto& c = count[static_cast<int>(sp)];
    for (uint64_t i = off; i < off + len; ++i) {
      if (c[i]) {
        if (w[i] != who) {
          if (!cross++)
            first_cross = fmt::format("{} byte {} first written by prefill #{}, again by #{} ({})",
                                      to_string(sp), i, w[i], who, what());
        } else if (!same++) {
          first_same = fmt::format("{} byte {} written twice by prefill #{} ({})", to_string(sp), i,
                                   who, what());
        }
      }
      w[i] = who;
      if (c[i] < 255) ++c[i];
    }
  }
};

bool in_bounds(uint64_t off, uint64_t len, uint64_t size) {
  return off <= size && len <= size - off;
}
bool within(uint64_t off, uint64_t len, uint64_t first, uint64_t size) {
  return off >= first && in_bounds(off - first, len, size);
}

std::string text(const planned_write& w) {
  return fmt::format("write {}+{} -> {}+{} len {}", to_string(w.src), w.src_offset,
                     to_string(w.dst), w.dst_offset, w.length);
}
std::string text(const planned_copy& c) {
  return fmt::format("copy {}+{} -> {}+{} len {}", to_string(c.from), c.from_offset,
                     to_string(c.to), c.to_offset, c.length);
}

struct run_options {
  bool src_staging = true;  ///< the prefill packs (kv_mode::pack) into staging
  bool dst_staging = true;  ///< the decode offers staging (kv_mode::unpack)
  /// fabric.pack_threshold_bytes: 0 plans with plan_kv_chunk (one write per run); otherwise
  /// with plan_kv and plan_landing (core/pack.hpp), packing `slice_bytes` at a time
  uint64_t threshold = 0;
  uint64_t slice_bytes = ~uint64_t{0};
  /// Plan every chunk one layer range at a time (each of the prefill rank's layers alone, in a
  /// shuffled order), as a layer-wise send does, instead of whole.
  bool layer_wise = false;
  uint64_t piece_bytes = 0;  ///< split_pieces on every planned write batch (0: no split)
  bool reverse_decode_layers = false;
  uint32_t room_pages = 6;
  pool_sizes sizes;  ///< prefill pools; the decode's are larger (sizes may differ)
  uint64_t seed = 1;
  bool explicit_total_heads = true;  ///< decode side sets total_heads even when not needed
};

struct run_result {
  std::vector<std::string> problems;
  uint64_t writes = 0, copies = 0, links = 0;
};

constexpr uint64_t src_staging_at = 40;  // prefill staging offset used for packing
constexpr uint64_t dst_staging_at = 72;  // decode staging offset of the room's first link
constexpr uint64_t staging_gap = 24;     // untouched bytes between links' staging ranges
constexpr size_t max_problems = 12;

/// Run the planner for prefill TP `ps` over `pst` stages into decode TP `pd` over `dst_st`
/// stages, execute its plans, and compare with the reference.
run_result simulate(const model& m, uint32_t ps, uint32_t pd, const stages& pst,
                    const stages& dst_st, const run_options& o) {
  run_result res;
  auto problem = [&](std::string s) {
    if (res.problems.size() < max_problems) res.problems.push_back(std::move(s));
  };
  rng_t rng(o.seed);
  const uint32_t R = o.room_pages;
  const uint32_t T = m.kv ? m.kv->page_tokens : 1;
  const full_data full = make_full(m, R * T, ps, rng);

  auto build_side = [&](uint32_t tp, const stages& st, const pool_sizes& sz, bool explicit_total,
                        bool reversed, const char* side) {
    std::vector<rank_state> out;
    const uint32_t pp = std::max<uint32_t>(1, static_cast<uint32_t>(st.size()));
    for (uint32_t s = 0; s < pp; ++s)
      for (uint32_t r = 0; r < tp; ++r) {
        rank_state x;
        x.stage = s;
        x.tp_rank = r;
        x.schema = make_schema(m, tp, r, pp, s, st.empty() ? nullptr : &st[s], sz, explicit_total,
                               reversed);
        x.lay = make_layout(x.schema.pools);
        x.mem = pool_memory(x.lay, rng);
        x.pages = random_pages(sz.pages, R, rng);
        x.slot = static_cast<uint32_t>(rng() % sz.slots);
        x.row = static_cast<uint32_t>(rng() % sz.rows);
        x.name = fmt::format("{} pp {} tp {}", side, s, r);
        out.push_back(std::move(x));
      }
    return out;
  };
  const pool_sizes dsz{o.sizes.pages + 3, o.sizes.slots + 2, o.sizes.rows + 1};
  std::vector<rank_state> pre = build_side(ps, pst, o.sizes, true, false, "prefill");
  std::vector<rank_state> dec =
      build_side(pd, dst_st, dsz, o.explicit_total_heads, o.reverse_decode_layers, "decode");
  // At decode PP 1 the aux row must come from the last prefill stage, which sampled the token.
  const uint32_t last_stage = std::max<uint32_t>(1, static_cast<uint32_t>(pst.size())) - 1;
  for (auto& p : pre)
    place_room(m, full, p.lay, ps, p.tp_rank, p.pages, p.slot, p.row, p.mem, nullptr,
               !dst_st.empty() || p.stage == last_stage);
  const auto chunks = random_chunks(R, rng);

  // The prefill ranks as named to select_prefill_peers, in a shuffled order.
  std::vector<size_t> order(pre.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<rank_schema> named;
  for (auto i : order) named.push_back(pre[i].schema);

  for (auto& d : dec) {
    // The reference group: TP ranks by the header rule, every stage at decode PP 1, else its own.
    std::vector<size_t> group;
    for (size_t i = 0; i < pre.size(); ++i) {
      const auto& p = pre[i];
      const bool stage_ok = d.schema.pp_size == 1 || p.stage == d.stage;
      const bool tp_ok =
          ps > pd ? p.tp_rank / (ps / pd) == d.tp_rank : p.tp_rank == d.tp_rank / (pd / ps);
      if (stage_ok && tp_ok) group.push_back(i);
    }

    auto sel = select_prefill_peers(d.schema, named);
    if (!sel) {
      problem(fmt::format("{}: select_prefill_peers failed: {}", d.name, sel.message));
      continue;
    }
    std::vector<size_t> chosen;
    for (auto k : sel.value) {
      if (k >= named.size()) {
        problem(
            fmt::format("{}: select_prefill_peers gave index {} of {}", d.name, k, named.size()));
        continue;
      }
      chosen.push_back(order[k]);
    }
    std::sort(chosen.begin(), chosen.end());
    if (chosen != group) {
      std::vector<std::string> a, b;
      for (auto i : chosen) a.push_back(pre[i].name);
      for (auto i : group) b.push_back(pre[i].name);
      problem(fmt::format("{}: selected peers [{}], expected [{}]", d.name, fmt::join(a, ", "),
                          fmt::join(b, ", ")));
      continue;
    }

    // Pairs outside the group (of a stage the decode receives from) plan as in_group = false.
    for (size_t i = 0; i < pre.size(); ++i) {
      if (std::find(group.begin(), group.end(), i) != group.end()) continue;
      auto lp = make_link_plan(pre[i].schema, d.schema);
      const bool other_stage = d.schema.pp_size != 1 && pre[i].stage != d.stage;
      if (!lp) {
        // A stage the decode does not hold may well be refused for its layer ids: the header
        // does not say whether out-of-group validation covers layers.
        if (!other_stage)
          problem(fmt::format("{} -> {} (outside the group): make_link_plan failed: {}",
                              pre[i].name, d.name, lp.message));
      } else if (lp.value.in_group)
        problem(fmt::format("{} -> {}: in_group is true outside the group", pre[i].name, d.name));
    }

    std::vector<link_plan> links;
    bool ok = true;
    for (auto i : group) {
      auto lp = make_link_plan(pre[i].schema, d.schema);
      if (!lp) {
        problem(
            fmt::format("{} -> {}: make_link_plan failed: {}", pre[i].name, d.name, lp.message));
        ok = false;
        continue;
      }
      links.push_back(lp.value);
      if (!links.back().in_group)
        problem(
            fmt::format("{} -> {}: in_group is false for a selected peer", pre[i].name, d.name));
      (void)links.back().describe();
    }
    if (!ok) continue;
    res.links += links.size();
    if (m.aux_row_bytes) {
      size_t n = 0;
      for (const auto& l : links) n += l.aux;
      if (n != 1) problem(fmt::format("{}: {} links carry the aux row, expected 1", d.name, n));
    }

    // Decode memory: junk everywhere; the expected image has the room's bytes in place.
    std::vector<uint64_t> stage_at(links.size()), stage_len(links.size());
    uint64_t staging_end = dst_staging_at;
    for (size_t k = 0; k < links.size(); ++k) {
      stage_at[k] = staging_end;
      stage_len[k] = o.threshold ? plan_landing(links[k], d.pages, o.threshold, ~uint64_t{0}).bytes
                                 : links[k].unpack_staging_bytes(R);
      staging_end += stage_len[k] + staging_gap;
    }
    d.mem[space::staging].resize(staging_end + 64);
    fill_random(d.mem[space::staging], rng);
    const memory initial = d.mem;
    memory expected = d.mem, needed;
    for (int i = 0; i < space_count; ++i) needed.s[i].assign(d.mem.s[i].size(), 0);
    place_room(m, full, d.lay, pd, d.tp_rank, d.pages, d.slot, d.row, expected, &needed);
    if (o.dst_staging)
      for (size_t k = 0; k < links.size(); ++k)
        std::fill(needed[space::staging].begin() + stage_at[k],
                  needed[space::staging].begin() + stage_at[k] + stage_len[k], 1);
    tracker tr(d.mem);

    for (size_t k = 0; k < links.size(); ++k) {
      const link_plan& link = links[k];
      const rank_state& p = pre[group[k]];
      const int16_t who = static_cast<int16_t>(group[k]);
      const std::string lname = fmt::format("{} -> {} ({})", p.name, d.name, to_string(link.kv));

      auto do_write = [&](const planned_write& w, const bytes* src_staging,
                          const std::vector<uint8_t>* packed, uint64_t pack_at, uint64_t pack_len) {
        ++res.writes;
        const bytes& src = w.src == space::staging ? *src_staging : p.mem[w.src];
        bytes& dst = d.mem[w.dst];
        if (w.length == 0) problem(fmt::format("{}: zero-length {}", lname, text(w)));
        if (w.src == space::staging) {
          if (!src_staging || !within(w.src_offset, w.length, pack_at, pack_len)) {
            problem(fmt::format("{}: {} reads outside the packed range [{}, +{})", lname, text(w),
                                pack_at, pack_len));
            return;
          }
          for (uint64_t i = w.src_offset; i < w.src_offset + w.length; ++i)
            if (!(*packed)[i]) {
              problem(fmt::format("{}: {} reads staging byte {} that no pack copy filled", lname,
                                  text(w), i));
              break;
            }
        }
        if (!in_bounds(w.src_offset, w.length, src.size()) ||
            !in_bounds(w.dst_offset, w.length, dst.size())) {
          problem(fmt::format("{}: {} is out of bounds (source space {} B, destination {} B)",
                              lname, text(w), src.size(), dst.size()));
          return;
        }
        std::copy(src.begin() + w.src_offset, src.begin() + w.src_offset + w.length,
                  dst.begin() + w.dst_offset);
        tr.mark(w.dst, w.dst_offset, w.length, who, [&] { return lname + " " + text(w); });
      };

      for (const auto& [first, end] : chunks) {
        std::span<const uint32_t> sp(p.pages), dp(d.pages);
        const auto runs =
            coalesce_runs(sp.subspan(first, end - first), dp.subspan(first, end - first), first);
        uint32_t next = first;
        for (const auto& r : runs) {
          if (r.position != next)
            problem(fmt::format("{}: run at position {}, expected {}", lname, r.position, next));
          next = r.position + r.count;
        }
        if (next != end) problem(fmt::format("{}: runs end at {}, expected {}", lname, next, end));

        // Whole, or one layer range at a time: each range's copies and writes run before the
        // next range reuses the packed staging.
        std::vector<layer_range> ranges{layer_range{}};
        if (o.layer_wise) {
          ranges.clear();
          for (auto id : layer_ids(p.lay)) ranges.push_back({id, 1});
          std::shuffle(ranges.begin(), ranges.end(), rng);
        }
        for (const auto& range : ranges) {
          uint64_t pb = 0;
          std::vector<planned_copy> pack;
          std::vector<planned_write> writes;
          if (!o.threshold) {
            staging_use su;
            su.room_pages = R;
            pb = pack_bytes(link, runs);
            if (o.src_staging) su.src = src_staging_at;
            if (o.dst_staging) su.dst = stage_at[k];
            plan_kv_chunk(link, p.lay, d.lay, runs, su, pack, writes, range);
          } else {
            // As the Sender does: direct writes now, then the jobs a slice at a time, each slice
            // one batch (its writes merge only within it).
            kv_options ko;
            if (o.dst_staging && stage_len[k]) ko.dst_staging = stage_at[k];
            ko.room_pages = R;
            ko.slice_bytes = o.src_staging ? o.slice_bytes : 0;
            ko.threshold = o.threshold;
            ko.layers = range;
            auto plan = plan_kv(link, p.lay, d.lay, runs, ko);
            (void)plan.decision.describe();
            writes = plan.writes;
            for (const auto& j : plan.jobs) {
              if (j.bytes() > o.slice_bytes)
                problem(fmt::format("{}: a pack job of {} bytes exceeds the slice of {}", lname,
                                    j.bytes(), o.slice_bytes));
              pb += j.bytes();
            }
            if (pb != plan.decision.packed_bytes)
              problem(fmt::format("{}: jobs of {} bytes, but the decision says {} packed", lname,
                                  pb, plan.decision.packed_bytes));
            uint64_t at = src_staging_at;
            for (size_t a = 0; a < plan.jobs.size();) {
              size_t b = a;
              uint64_t n = 0;
              while (b < plan.jobs.size() && (b == a || n + plan.jobs[b].bytes() <= o.slice_bytes))
                n += plan.jobs[b++].bytes();
              std::vector<planned_write> slice;
              expand_pack_jobs(std::span(plan.jobs).subspan(a, b - a), at, pack, slice);
              writes.insert(writes.end(), slice.begin(), slice.end());
              at += n;
              a = b;
            }
          }
          bytes src_staging(src_staging_at + pb + 32);
          fill_random(src_staging, rng);
          std::vector<uint8_t> packed(src_staging.size(), 0);
          split_pieces(writes, o.piece_bytes);
          for (const auto& c : pack) {
            ++res.copies;
            if (!o.src_staging)
              problem(fmt::format("{}: pack {} planned without staging", lname, text(c)));
            if (c.from != space::kv || c.to != space::staging) {
              problem(fmt::format("{}: pack {} is not kv -> staging", lname, text(c)));
              continue;
            }
            if (!in_bounds(c.from_offset, c.length, p.mem[space::kv].size()) ||
                !within(c.to_offset, c.length, src_staging_at, pb)) {
              problem(fmt::format("{}: pack {} is outside kv or the packed range [{}, +{})", lname,
                                  text(c), src_staging_at, pb));
              continue;
            }
            std::copy(p.mem[space::kv].begin() + c.from_offset,
                      p.mem[space::kv].begin() + c.from_offset + c.length,
                      src_staging.begin() + c.to_offset);
            std::fill(packed.begin() + c.to_offset, packed.begin() + c.to_offset + c.length, 1);
          }
          for (const auto& w : writes) {
            if (w.src == space::staging && !o.src_staging)
              problem(fmt::format("{}: {} reads staging without staging", lname, text(w)));
            do_write(w, &src_staging, &packed, src_staging_at, pb);
          }
        }
      }
      std::vector<planned_write> writes;
      if (o.layer_wise) {
        auto ids = layer_ids(p.lay);
        std::shuffle(ids.begin(), ids.end(), rng);
        for (auto id : ids) plan_state_link(link, p.lay, d.lay, p.slot, d.slot, writes, {id, 1});
      } else {
        plan_state_link(link, p.lay, d.lay, p.slot, d.slot, writes);
      }
      plan_aux_link(link, p.lay, d.lay, p.row, d.row, writes);
      split_pieces(writes, o.piece_bytes);
      for (const auto& w : writes) {
        if (w.src == space::staging || w.dst == space::staging)
          problem(fmt::format("{}: state/aux {} uses staging", lname, text(w)));
        else
          do_write(w, nullptr, nullptr, 0, 0);
      }
    }

    // Decode side: copy each link's landing block into the pages once all writes have landed.
    if (o.dst_staging)
      for (size_t k = 0; k < links.size(); ++k) {
        if (!stage_len[k]) continue;
        const std::string lname = fmt::format("{} -> {} (unpack)", pre[group[k]].name, d.name);
        std::vector<planned_copy> copies;
        plan_unpack(links[k], d.lay, d.pages, stage_at[k], copies);
        auto& st = d.mem[space::staging];
        auto& kv = d.mem[space::kv];
        for (const auto& c : copies) {
          ++res.copies;
          if (c.from != space::staging || c.to != space::kv) {
            problem(fmt::format("{}: {} is not staging -> kv", lname, text(c)));
            continue;
          }
          if (!within(c.from_offset, c.length, stage_at[k], stage_len[k]) ||
              !in_bounds(c.to_offset, c.length, kv.size())) {
            problem(fmt::format("{}: {} is outside the link's staging [{}, +{}) or kv", lname,
                                text(c), stage_at[k], stage_len[k]));
            continue;
          }
          for (uint64_t i = c.from_offset; i < c.from_offset + c.length; ++i)
            if (!tr.count[static_cast<int>(space::staging)][i]) {
              problem(fmt::format("{}: {} reads staging byte {} that no write filled", lname,
                                  text(c), i));
              break;
            }
          std::copy(st.begin() + c.from_offset, st.begin() + c.from_offset + c.length,
                    kv.begin() + c.to_offset);
          tr.mark(space::kv, c.to_offset, c.length, static_cast<int16_t>(group[k]),
                  [&] { return lname + " " + text(c); });
        }
      }

    // The checks.
    if (tr.cross)
      problem(fmt::format("{}: {} bytes written by two prefill ranks; first: {}", d.name, tr.cross,
                          tr.first_cross));
    if (tr.same)
      problem(fmt::format("{}: {} bytes written twice by one prefill rank; first: {}", d.name,
                          tr.same, tr.first_same));
    for (auto sp : {space::kv, space::state, space::aux, space::staging}) {
      const auto& act = d.mem[sp];
      const auto& need = needed[sp];
      const auto& cnt = tr.count[static_cast<int>(sp)];
      uint64_t missing = 0, wrong = 0, stray = 0, changed = 0;
      std::string first_missing, first_wrong, first_stray;
      for (uint64_t i = 0; i < act.size(); ++i) {
        if (need[i]) {
          if (sp == space::staging) continue;  // staging content is checked through the pages
          if (!cnt[i] && !missing++) first_missing = where(m, d.lay, sp, i);
          if (act[i] != expected[sp][i] && !wrong++)
            first_wrong = fmt::format("{}: expected {:#04x}, got {:#04x} (written by prefill #{})",
                                      where(m, d.lay, sp, i), expected[sp][i], act[i],
                                      tr.writer[static_cast<int>(sp)][i]);
        } else {
          if (cnt[i] && !stray++)
            first_stray = fmt::format("{} (by prefill #{})", where(m, d.lay, sp, i),
                                      tr.writer[static_cast<int>(sp)][i]);
          if (act[i] != initial[sp][i]) ++changed;
        }
      }
      if (missing)
        problem(fmt::format("{}: {} destination bytes never written; first: {}", d.name, missing,
                            first_missing));
      if (wrong)
        problem(fmt::format("{}: {} destination bytes differ from the reference; first: {}", d.name,
                            wrong, first_wrong));
      if (stray || changed)
        problem(fmt::format("{}: {} bytes written ({} changed) outside the room in {}; first: {}",
                            d.name, stray, changed, to_string(sp), first_stray));
    }
  }
  return res;
}

std::string join_problems(const run_result& r) {
  return r.problems.empty() ? std::string() : fmt::format("{}", fmt::join(r.problems, "\n"));
}

/// Run with staging on both sides (writes split into small pieces), without staging, and (when
/// `one_sided`) with staging on one side only; every run must match the reference exactly.
void check_geometry(const std::string& label, const model& m, uint32_t ps, uint32_t pd,
                    const stages& pst, const stages& dst_st, run_options o, bool one_sided = true) {
  struct variant {
    bool src, dst;
    uint64_t pieces;
    uint64_t threshold = 0, slice = ~uint64_t{0};
  };
  // The last four pack small runs through staging on either side (every run counts as small),
  // in slices of 96 bytes, 1 KiB or unbounded.
  constexpr uint64_t all = uint64_t{1} << 30;
  for (auto v :
       {variant{true, true, 7}, variant{false, false, 0}, variant{true, false, 0},
        variant{false, true, 0}, variant{true, true, 7, all, 96}, variant{true, true, 0, all},
        variant{true, false, 0, all, 1024}, variant{false, true, 0, all}}) {
    if (!one_sided && v.src != v.dst) continue;
    o.src_staging = v.src;
    o.dst_staging = v.dst;
    o.piece_bytes = v.pieces;
    o.threshold = v.threshold;
    o.slice_bytes = v.slice;
    const auto r = simulate(m, ps, pd, pst, dst_st, o);
    INFO(label << " staging src=" << (v.src ? "yes" : "no") << " dst=" << (v.dst ? "yes" : "no")
               << " pieces=" << v.pieces << " threshold=" << v.threshold << " slice=" << v.slice
               << " seed=" << o.seed);
    INFO(join_problems(r));
    CHECK(r.problems.empty());
    CHECK(r.writes > 0);  // a run that planned nothing proves nothing
  }
}

uint64_t seed_of(std::initializer_list<uint64_t> parts) {
  uint64_t h = 1469598103934665603ull;
  for (auto p : parts) h = (h ^ p) * 1099511628211ull;
  return h;
}

constexpr uint32_t tp_sizes[] = {1, 2, 4, 8};

/// Room and pool sizes for a page size: fewer, larger pages keep the byte count small.
run_options sized_for(uint32_t page_tokens, uint64_t seed) {
  run_options o;
  o.seed = seed;
  if (page_tokens >= 64) {
    o.room_pages = 3, o.sizes.pages = 7;
  } else if (page_tokens >= 16) {
    o.room_pages = 5, o.sizes.pages = 11;
  } else {
    o.room_pages = 9, o.sizes.pages = 23;
  }
  return o;
}

// Qwen3-Next-style (scaled down): GDN conv [q|k|v] with shard groups, fp32 temporal heads, 2 KV
// heads at full-attention layer 3.
model qwen_like(uint32_t page_tokens = 1) {
  model m;
  m.kv = kv_model{2, 4, 2, page_tokens, false, {3}};
  m.mamba_layers = {0, 1, 2};
  m.tensors = {{"conv", {64, 3}, 2, 0u, {16, 16, 32}}, {"temporal", {32, 2, 3}, 4, 0u, {}}};
  m.aux_row_bytes = 40;
  return m;
}

}  // namespace

// ---------------------------------------------------------------------------------------------

TEST_CASE("geometry property: MHA/GQA KV heads re-shard byte-exactly over every TP pair",
          "[unit][geometry][geometry-property]") {
  for (uint32_t H : {1u, 2u, 4u, 8u, 16u})
    for (uint32_t T : {1u, 16u, 64u})
      for (uint32_t ps : tp_sizes)
        for (uint32_t pd : tp_sizes) {
          model m;
          m.kv = kv_model{H, 2, 2, T, false, {1, 3}};
          m.aux_row_bytes = 24;
          auto o = sized_for(T, seed_of({1, H, T, ps, pd}));
          o.explicit_total_heads = (H + ps + pd) % 2 == 0;  // also exercise total_heads = 0
          // One-sided staging takes the same branches at every page size: run it at T=1 only.
          check_geometry(fmt::format("KV H={} head_dim=2 bf16 T={} Ps={} Pd={}", H, T, ps, pd), m,
                         ps, pd, {}, {}, o, T == 1);
        }
}

TEST_CASE("geometry property: MLA KV is replicated and sent once",
          "[unit][geometry][geometry-property]") {
  for (uint32_t T : {1u, 16u, 64u})
    for (uint32_t ps : tp_sizes)
      for (uint32_t pd : tp_sizes) {
        model m;
        m.kv = kv_model{1, 6, 2, T, true, {0, 1}};
        m.aux_row_bytes = 16;
        check_geometry(fmt::format("MLA head_dim=6 T={} Ps={} Pd={}", T, ps, pd), m, ps, pd, {}, {},
                       sized_for(T, seed_of({2, T, ps, pd})));
      }
}

TEST_CASE("geometry property: Qwen3-Next-style GDN conv with shard groups and temporal state",
          "[unit][geometry][geometry-property]") {
  for (uint32_t ps : tp_sizes)
    for (uint32_t pd : tp_sizes)
      check_geometry(fmt::format("Qwen3-Next-like conv [64,3] groups [16,16,32] bf16, temporal "
                                 "[32,2,3] fp32, KV H=2 T=1, Ps={} Pd={}",
                                 ps, pd),
                     qwen_like(), ps, pd, {}, {}, sized_for(1, seed_of({3, ps, pd})));
}

TEST_CASE("geometry property: Nemotron-H-style state without shard groups",
          "[unit][geometry][geometry-property]") {
  model m;
  m.kv = kv_model{8, 4, 2, 16, false, {1}};
  m.mamba_layers = {0, 2};
  // conv [x | B | C] = [64 | 8 | 8] as one block; ssm heads [16, 2, 3] fp32.
  m.tensors = {{"conv", {80, 3}, 2, 0u, {}}, {"ssm", {16, 2, 3}, 4, 0u, {}}};
  m.aux_row_bytes = 32;
  for (uint32_t ps : tp_sizes)
    for (uint32_t pd : tp_sizes)
      check_geometry(fmt::format("Nemotron-H-like conv [80,3] bf16, ssm [16,2,3] fp32, KV H=8 "
                                 "T=16, Ps={} Pd={}",
                                 ps, pd),
                     m, ps, pd, {}, {}, sized_for(16, seed_of({4, ps, pd})));
}

TEST_CASE("geometry property: Mamba2 with n_groups below TP holds B and C whole on every rank",
          "[unit][geometry][geometry-property]") {
  // Granite-4.0-H / Falcon-H1-style (scaled down): conv [x | B | C] with x = 8 heads x 8 and B,
  // C = n_groups x d_state 8. SGLang's and vLLM's MambaMixer2 give every rank the whole B and C
  // group when n_groups < TP (n_groups 1), and a share of groups otherwise (n_groups 2 at TP 1
  // and 2). Temporal ssm [8 heads, 2, 3] fp32 sliced by head. Every TP pair of {1, 2, 4, 8}.
  for (uint64_t n_groups : {1u, 2u}) {
    model m;
    m.kv = kv_model{8, 4, 2, 1, false, {1}};
    m.mamba_layers = {0, 2};
    const uint64_t bc = n_groups * 8;
    m.tensors = {{"conv", {64 + 2 * bc, 3}, 2, 0u, {64, bc, bc}, {8, n_groups, n_groups}},
                 {"ssm", {8, 2, 3}, 4, 0u, {}}};
    m.aux_row_bytes = 24;
    for (uint32_t ps : tp_sizes)
      for (uint32_t pd : tp_sizes)
        check_geometry(fmt::format("Mamba2 n_groups={} conv [{},3] groups [64,{},{}] units "
                                   "[8,{},{}], ssm [8,2,3], Ps={} Pd={}",
                                   n_groups, 64 + 2 * bc, bc, bc, n_groups, n_groups, ps, pd),
                       m, ps, pd, {}, {}, sized_for(1, seed_of({11, n_groups, ps, pd})));
  }
}

TEST_CASE("geometry property: Kimi-style conv with outer rows, MLA KV",
          "[unit][geometry][geometry-property]") {
  for (uint32_t T : {1u, 64u}) {
    model m;
    m.kv = kv_model{1, 6, 2, T, true, {3}};
    m.mamba_layers = {0, 1, 2};
    m.tensors = {{"conv_qkv", {3, 64}, 2, 1u, {16, 16, 32}},  // [K-1, dim], groups on dim
                 {"conv_g", {3, 16}, 2, 1u, {}},
                 {"temporal", {8, 2, 2}, 4, 0u, {}}};
    m.aux_row_bytes = 24;
    for (uint32_t ps : tp_sizes)
      for (uint32_t pd : tp_sizes)
        check_geometry(fmt::format("Kimi-like conv [3,64] axis 1 groups [16,16,32], conv [3,16] "
                                   "axis 1, temporal [8,2,2], MLA T={}, Ps={} Pd={}",
                                   T, ps, pd),
                       m, ps, pd, {}, {}, sized_for(T, seed_of({5, T, ps, pd})));
  }
}

TEST_CASE("geometry property: PP prefill stages into a PP 1 decode, and PP 2 into PP 2",
          "[unit][geometry][geometry-property]") {
  // Layers 0..5: attention at 1 and 4, GDN at 0, 2, 3, 5.
  model m = qwen_like(16);
  m.kv->layer_ids = {1, 4};
  m.mamba_layers = {0, 2, 3, 5};
  const stages contiguous{{0, 1, 2}, {3, 4, 5}};
  const stages interleaved{{0, 4, 5}, {1, 2, 3}};
  const stages gdn_only_first{{0, 2}, {1, 3, 4, 5}};        // stage 0 has no KV pool
  const stages attention_only_first{{1, 4}, {0, 2, 3, 5}};  // stage 0 has no mamba pool
  for (uint32_t ps : tp_sizes)
    for (uint32_t pd : tp_sizes) {
      check_geometry(fmt::format("PP 2 contiguous -> PP 1, Ps={} Pd={}", ps, pd), m, ps, pd,
                     contiguous, {}, sized_for(16, seed_of({6, ps, pd})));
      auto o = sized_for(16, seed_of({7, ps, pd}));
      o.reverse_decode_layers = true;
      check_geometry(fmt::format("PP 2 interleaved -> PP 1 listing its layers backwards, Ps={} "
                                 "Pd={}",
                                 ps, pd),
                     m, ps, pd, interleaved, {}, o);
      check_geometry(fmt::format("PP 2 -> PP 2, Ps={} Pd={}", ps, pd), m, ps, pd, contiguous,
                     contiguous, sized_for(16, seed_of({8, ps, pd})));
      check_geometry(fmt::format("PP 2 with a GDN-only stage -> PP 1, Ps={} Pd={}", ps, pd), m, ps,
                     pd, gdn_only_first, {}, sized_for(16, seed_of({10, ps, pd})));
      check_geometry(fmt::format("PP 2 with an attention-only stage -> PP 2, Ps={} Pd={}", ps, pd),
                     m, ps, pd, attention_only_first, attention_only_first,
                     sized_for(16, seed_of({11, ps, pd})));
    }
}

TEST_CASE("geometry property: a tensor without slice_axis moves whole between equal TP sizes",
          "[unit][geometry][geometry-property]") {
  model m = qwen_like(16);
  m.tensors.push_back({"opaque", {5, 3}, 2, std::nullopt, {}});
  for (uint32_t p : tp_sizes)
    check_geometry(fmt::format("opaque [5,3] without slice_axis, Ps=Pd={}", p), m, p, p, {}, {},
                   sized_for(16, seed_of({9, p})));
}

TEST_CASE("geometry property: TP sizes that are not powers of two",
          "[unit][geometry][geometry-property]") {
  for (uint32_t H : {3u, 6u}) {
    model m;
    m.kv = kv_model{H, 2, 2, 16, false, {3}};
    m.mamba_layers = {0, 1, 2};
    m.tensors = {{"conv", {48, 3}, 2, 0u, {12, 12, 24}}, {"temporal", {6, 2, 3}, 4, 0u, {}}};
    m.aux_row_bytes = 24;
    for (uint32_t ps : {1u, 2u, 3u, 6u})
      for (uint32_t pd : {1u, 2u, 3u, 6u}) {
        auto fits = [](uint32_t a, uint32_t b) { return a % b == 0 || b % a == 0; };
        if (!fits(ps, pd) || !fits(ps, H) || !fits(pd, H)) continue;
        check_geometry(fmt::format("KV H={} T=16, conv [48,3] groups [12,12,24], temporal [6,2,3], "
                                   "Ps={} Pd={}",
                                   H, ps, pd),
                       m, ps, pd, {}, {}, sized_for(16, seed_of({12, H, ps, pd})));
      }
  }
}

TEST_CASE("geometry property: head ownership and rank groups follow the header's rules",
          "[unit][geometry][geometry-property]") {
  for (uint32_t H : {1u, 2u, 4u, 8u, 16u})
    for (uint32_t p : tp_sizes)
      for (uint32_t r = 0; r < p; ++r) {
        const auto ref = ref_heads(kv_model{H, 2, 2, 1, false, {0}}, p, r);
        INFO("H=" << H << " P=" << p << " r=" << r);
        CHECK(kv_heads_of(H, p, r) == unit_range{ref.front(), ref.size()});
      }
  for (uint32_t ps : tp_sizes)
    for (uint32_t pd : tp_sizes) {
      std::vector<uint32_t> feeds(ps, 0);  // decode ranks each prefill rank feeds
      for (uint32_t d = 0; d < pd; ++d) {
        std::vector<uint32_t> ref;
        for (uint32_t p = 0; p < ps; ++p)
          if (ps > pd ? p / (ps / pd) == d : p == d / (pd / ps)) ref.push_back(p), ++feeds[p];
        INFO("Ps=" << ps << " Pd=" << pd << " d=" << d);
        CHECK(prefill_ranks_for(ps, pd, d) == ref);
      }
      for (uint32_t p = 0; p < ps; ++p) {
        INFO("Ps=" << ps << " Pd=" << pd << " p=" << p);
        CHECK(decode_ranks_per_prefill(ps, pd) == feeds[p]);
      }
    }
}

// ---------------------------------------------------------------------------------------------
// Refusals.

namespace {

std::string link_error(const rank_schema& s, const rank_schema& d) {
  auto r = make_link_plan(s, d);
  if (!r) return r.message;
  return {};
}

std::string select_error(const rank_schema& d, const std::vector<rank_schema>& named) {
  auto r = select_prefill_peers(d, named);
  if (!r) return r.message;
  return {};
}

}  // namespace

TEST_CASE("geometry property: make_link_plan refuses what does not divide or match",
          "[unit][geometry][geometry-property]") {
  const pool_sizes sz;

  SECTION("KV heads that do not divide the decode TP size") {
    model m;
    m.kv = kv_model{6, 2, 2, 1, false, {0}};
    auto s = make_schema(m, 2, 0, 1, 0, nullptr, sz);  // 3 heads per rank
    auto d = make_schema(m, 4, 0, 1, 0, nullptr, sz);  // 6 heads over 4 ranks: impossible
    d.pools.kv->kv_heads = 1;
    const auto e = link_error(s, d);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("heads") && Contains("6") && Contains("4"));
  }
  SECTION("KV heads that do not divide the prefill TP size") {
    model m;
    m.kv = kv_model{12, 2, 2, 1, false, {0}};
    auto s = make_schema(m, 8, 0, 1, 0, nullptr, sz);
    s.pools.kv->kv_heads = 1;
    auto d = make_schema(m, 4, 0, 1, 0, nullptr, sz);
    const auto e = link_error(s, d);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("heads") && Contains("12") && Contains("8"));
  }
  SECTION("the two sides disagree on the model's KV heads") {
    model m;
    m.kv = kv_model{8, 2, 2, 1, false, {0}};
    auto s = make_schema(m, 2, 0, 1, 0, nullptr, sz);
    m.kv->heads = 4;
    auto d = make_schema(m, 2, 0, 1, 0, nullptr, sz);
    const auto e = link_error(s, d);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("8") && Contains("4") && Contains("head"));
  }
  SECTION("page size, dtype and head_dim must match") {
    model m;
    m.kv = kv_model{4, 2, 2, 16, false, {0}};
    auto s = make_schema(m, 2, 0, 1, 0, nullptr, sz);
    auto d = make_schema(m, 4, 0, 1, 0, nullptr, sz);
    d.pools.kv->page_tokens = 64;
    CHECK_THAT(link_error(s, d), Contains("page_tokens") && Contains("16") && Contains("64"));
    d = make_schema(m, 4, 0, 1, 0, nullptr, sz);
    d.pools.kv->dtype_bytes = 4;
    CHECK_THAT(link_error(s, d), Contains("dtype_bytes") && Contains("2") && Contains("4"));
    d = make_schema(m, 4, 0, 1, 0, nullptr, sz);
    d.pools.kv->head_dim = 3;
    CHECK_THAT(link_error(s, d), Contains("head_dim") && Contains("2") && Contains("3"));
  }
  SECTION("a shard group of 12 does not split over TP 8") {
    model m;
    m.mamba_layers = {0};
    m.tensors = {{"conv", {32, 3}, 2, 0u, {12, 12, 8}}};
    auto s = make_schema(m, 4, 0, 1, 0, nullptr, sz);  // 3 + 3 + 2 per rank
    auto d = make_schema(m, 8, 0, 1, 0, nullptr, sz);  // 12 / 8 does not divide
    const auto e = link_error(s, d);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("conv") && Contains("12") && Contains("8"));
  }
  SECTION("shard units that neither divide nor are divided by the decode TP size") {
    model m;
    m.mamba_layers = {0};
    m.tensors = {{"conv", {72, 3}, 2, 0u, {48, 12, 12}, {6, 3, 3}}};  // n_groups 3
    auto s = make_schema(m, 1, 0, 1, 0, nullptr, sz);
    auto d = s;  // a decode at TP 2 cannot hold 3 groups: 3 % 2 and 2 % 3 are not 0
    d.tp_size = 2;
    d.pools.mamba->tensors[0].shape = {36, 3};
    const auto e = link_error(s, d);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("mamba.tensors[0] (conv) shard group 1 (12 elements in 3 units) "
                           "cannot be held by TP 2: 3 is neither a multiple nor a divisor of 2"));
  }
  SECTION("the model contract: what the state means must agree") {
    model m;
    m.mamba_layers = {0};
    m.tensors = {{"conv", {64, 3}, 2, 0u, {16, 16, 32}}};
    auto s = make_schema(m, 1, 0, 1, 0, nullptr, sz);
    auto d = s;
    s.model = model_contract{"Qwen3NextForCausalLM", "n", {{"a", "1"}, {"b", "2"}}};
    d.model = s.model;
    CHECK(link_error(s, d).empty());
    d.model->state_covers = "n_minus_1";
    CHECK(link_error(s, d) ==
          "model.state_covers differs: prefill has n, decode has n_minus_1 (a state that covers N "
          "prompt tokens cannot stand in for one that covers N - 1)");
    d.model = s.model;
    d.model->architecture = "KimiLinearForCausalLM";
    CHECK(link_error(s, d) ==
          "model.architecture differs: prefill has Qwen3NextForCausalLM, "
          "decode has KimiLinearForCausalLM");
    d.model = s.model;
    d.model->fields = {{"a", "1"}, {"b", "3"}};
    CHECK(link_error(s, d) == "model.fields.b differs: prefill has 2, decode has 3");
    d.model->fields = {{"a", "1"}};
    CHECK(link_error(s, d) == "model.fields.b differs: prefill has 2, decode has none");
    d.model->fields = {{"a", "1"}, {"b", "2"}, {"c", "0"}};
    CHECK(link_error(s, d) == "model.fields.c differs: prefill has none, decode has 0");
    d.model.reset();
    CHECK(link_error(s, d) ==
          "model differs: the prefill declares Qwen3NextForCausalLM (model section), the decode "
          "declares none: declare the same model on both sides, or on neither");
    // dtype names: two types of one width are told apart
    d = s;
    s.pools.mamba->tensors[0].dtype = "bf16";
    d.pools.mamba->tensors[0].dtype = "fp16";
    CHECK(link_error(s, d) ==
          "mamba.tensors[0] (conv) dtype differs: prefill has bf16, decode "
          "has fp16");
  }
  SECTION("the two sides disagree on a group's units") {
    model m;
    m.mamba_layers = {0};
    m.tensors = {{"conv", {80, 3}, 2, 0u, {64, 8, 8}, {8, 1, 1}}};
    auto s = make_schema(m, 2, 0, 1, 0, nullptr, sz);
    m.tensors[0].shard_units = {8, 2, 2};
    auto d = make_schema(m, 2, 0, 1, 0, nullptr, sz);
    const auto e = link_error(s, d);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("slicing differs") && Contains("shard_units [8, 1, 1]") &&
                      Contains("shard_units [8, 2, 2]"));
  }
  SECTION("a sliced dim that does not split over the decode TP size") {
    model m;
    m.mamba_layers = {0};
    m.tensors = {{"temporal", {12, 2, 2}, 4, 0u, {}}};
    auto s = make_schema(m, 4, 0, 1, 0, nullptr, sz);  // 3 heads per rank
    auto d = make_schema(m, 8, 0, 1, 0, nullptr, sz);
    d.pools.mamba->tensors[0].shape = {1, 2, 2};  // 12 heads over 8 ranks cannot be declared
    const auto e = link_error(s, d);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("temporal") && Contains("12"));
  }
  SECTION("missing slice_axis under a TP mismatch is refused, never copied whole") {
    model m;
    m.mamba_layers = {0, 1};
    m.tensors = {{"temporal", {8, 2, 2}, 4, std::nullopt, {}}};
    for (uint32_t ps : tp_sizes)
      for (uint32_t pd : tp_sizes) {
        if (ps == pd) continue;
        const auto e = link_error(make_schema(m, ps, 0, 1, 0, nullptr, sz),
                                  make_schema(m, pd, 0, 1, 0, nullptr, sz));
        INFO("Ps=" << ps << " Pd=" << pd << ": " << e);
        CHECK_THAT(e, Contains("temporal") && Contains("slice_axis"));
      }
    for (uint32_t p : tp_sizes) {
      INFO("Ps=Pd=" << p);
      CHECK(link_error(make_schema(m, p, 0, 1, 0, nullptr, sz),
                       make_schema(m, p, 0, 1, 0, nullptr, sz)) == "");
    }
  }
  SECTION("TP sizes of which neither divides the other") {
    model m = qwen_like();
    m.tensors[0].shard_groups = {24, 24, 48};
    m.tensors[0].full_shape = {96, 3};
    m.tensors[1].full_shape = {6, 2, 3};
    m.kv->heads = 6;
    const auto e = link_error(make_schema(m, 2, 0, 1, 0, nullptr, sz),
                              make_schema(m, 3, 0, 1, 0, nullptr, sz));
    INFO(e);
    CHECK_THAT(e, Contains("TP") && Contains("2") && Contains("3"));
  }
  SECTION("a prefill layer id the decode lacks") {
    model m = qwen_like();
    m.kv->layer_ids = {1, 4};
    m.mamba_layers = {0, 2, 3, 5};
    const std::vector<uint32_t> stage1{3, 4, 5};
    const auto s = make_schema(m, 2, 0, 2, 1, &stage1, sz);
    model dm = m;  // the decode lacks attention layer 4
    dm.kv->layer_ids = {1};
    auto e = link_error(s, make_schema(dm, 2, 0, 1, 0, nullptr, sz));
    INFO(e);
    CHECK_THAT(e, Contains("layer 4"));
    dm = m;  // the decode lacks GDN layer 5
    dm.mamba_layers = {0, 2, 3};
    e = link_error(s, make_schema(dm, 2, 0, 1, 0, nullptr, sz));
    INFO(e);
    CHECK_THAT(e, Contains("layer 5"));
  }
}

TEST_CASE("geometry property: select_prefill_peers names what is missing or duplicated",
          "[unit][geometry][geometry-property]") {
  const pool_sizes sz;
  model m = qwen_like();
  m.kv->layer_ids = {1, 4};
  m.mamba_layers = {0, 2, 3, 5};
  const stages st{{0, 1, 2}, {3, 4, 5}};
  // Prefill TP 4, PP 2; decode TP 2, PP 1: decode rank 1 needs TP ranks 2 and 3 of both stages.
  std::vector<rank_schema> all;
  for (uint32_t s = 0; s < 2; ++s)
    for (uint32_t r = 0; r < 4; ++r) all.push_back(make_schema(m, 4, r, 2, s, &st[s], sz));
  const auto decode = make_schema(m, 2, 1, 1, 0, nullptr, sz);

  SECTION("all named: the four peers, outsiders left out") {
    auto r = select_prefill_peers(decode, all);
    REQUIRE(static_cast<bool>(r));
    auto v = r.value;
    std::sort(v.begin(), v.end());
    CHECK(v == std::vector<size_t>{2, 3, 6, 7});
  }
  SECTION("a required rank is missing") {
    auto named = all;
    named.erase(named.begin() + 7);  // stage 1, TP rank 3
    const auto e = select_error(decode, named);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("rank 3") && Contains("stage 1"));
  }
  SECTION("a required rank is named twice") {
    auto named = all;
    named.push_back(all[2]);  // stage 0, TP rank 2 again
    const auto e = select_error(decode, named);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("rank 2") && Contains("stage 0"));
  }
  SECTION("a decode layer no stage holds") {
    const stages partial{{0, 1, 2}, {3, 4}};  // GDN layer 5 held by nobody
    std::vector<rank_schema> named;
    for (uint32_t s = 0; s < 2; ++s)
      for (uint32_t r = 0; r < 4; ++r) named.push_back(make_schema(m, 4, r, 2, s, &partial[s], sz));
    const auto e = select_error(decode, named);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("layer 5"));
  }
  SECTION("a decode layer two stages hold") {
    const stages overlap{{0, 1, 2, 3}, {3, 4, 5}};  // GDN layer 3 held twice
    std::vector<rank_schema> named;
    for (uint32_t s = 0; s < 2; ++s)
      for (uint32_t r = 0; r < 4; ++r) named.push_back(make_schema(m, 4, r, 2, s, &overlap[s], sz));
    const auto e = select_error(decode, named);
    INFO(e);
    REQUIRE_FALSE(e.empty());
    CHECK_THAT(e, Contains("layer 3"));
  }
  SECTION("a TP rank of a required stage that lacks a layer its stage holds") {
    // Stage 1's TP rank 3 lacks attention layer 4 (and GDN layer 5) that stage 1's TP rank 2
    // holds. Decode rank 1 needs heads of layer 4 from both ranks 2 and 3, so rank 3's share
    // would never be written: the selection (or the link) must refuse, not leave it unsent.
    auto named = all;
    named[7].pools.kv.reset();
    named[7].pools.mamba->layer_ids = {3};
    std::string e = select_error(decode, named);
    if (e.empty()) e = link_error(named[7], decode);
    INFO(e);
    CHECK_THAT(e, Contains("layer 4") || Contains("layer 5"));
  }
  SECTION("attention DP: one group's ranks are chosen, two groups' are refused") {
    auto group = [&](uint32_t dp) {
      auto g = all;
      for (auto& s : g) s.dp_size = 2, s.dp_rank = dp;
      return g;
    };
    auto r = select_prefill_peers(decode, group(1));
    REQUIRE(static_cast<bool>(r));
    auto named = group(0);
    named[5].dp_rank = 1;
    const auto e = select_error(decode, named);
    INFO(e);
    CHECK_THAT(e, Contains("different attention DP groups") && Contains("DP rank 0 of 2") &&
                      Contains("DP rank 1 of 2"));
  }
  SECTION("PP 2 -> PP 2: the decode stage's layers must be the prefill stage's") {
    const auto d0 = make_schema(m, 2, 0, 2, 0, &st[0], sz);
    auto r = select_prefill_peers(d0, all);
    REQUIRE(static_cast<bool>(r));
    auto v = r.value;
    std::sort(v.begin(), v.end());
    CHECK(v == std::vector<size_t>{0, 1});
    const std::vector<uint32_t> more{0, 1, 2, 3};  // decode stage 0 also holds layer 3
    const auto e = select_error(make_schema(m, 2, 0, 2, 0, &more, sz), all);
    INFO(e);
    CHECK_THAT(e, Contains("layer 3"));
  }
}

TEST_CASE("geometry property: a room planned one layer at a time moves the bytes of a whole room",
          "[unit][geometry][geometry-property]") {
  // Every layer of a prefill rank on its own, in a shuffled order: the same bytes land, each
  // once, whole pages, packed slices (scatter), staged rows (gather) or per-token writes alike.
  model pp = qwen_like(16);
  pp.kv->layer_ids = {1, 4};
  pp.mamba_layers = {0, 2, 3, 5};
  const stages contiguous{{0, 1, 2}, {3, 4, 5}};
  for (uint32_t ps : tp_sizes)
    for (uint32_t pd : tp_sizes) {
      auto o = sized_for(1, seed_of({20, ps, pd}));
      o.layer_wise = true;
      check_geometry(fmt::format("layer-wise Qwen3-Next-like, Ps={} Pd={}", ps, pd), qwen_like(),
                     ps, pd, {}, {}, o);
      auto q = sized_for(16, seed_of({21, ps, pd}));
      q.layer_wise = true;
      auto t = sized_for(1, seed_of({23, ps, pd}));  // every run gathered, 1 KiB slices
      t.layer_wise = true;
      t.threshold = uint64_t{1} << 30;
      t.slice_bytes = 1024;
      check_geometry(fmt::format("layer-wise packed Qwen3-Next-like, Ps={} Pd={}", ps, pd),
                     qwen_like(), ps, pd, {}, {}, t);
      check_geometry(fmt::format("layer-wise PP 2 -> PP 1, Ps={} Pd={}", ps, pd), pp, ps, pd,
                     contiguous, {}, q);
      check_geometry(fmt::format("layer-wise PP 2 -> PP 2, Ps={} Pd={}", ps, pd), pp, ps, pd,
                     contiguous, contiguous, q);
    }
  model mla;
  mla.kv = kv_model{1, 6, 2, 16, true, {0, 1}};
  mla.aux_row_bytes = 16;
  auto o = sized_for(16, seed_of({22}));
  o.layer_wise = true;
  check_geometry("layer-wise MLA Ps=2 Pd=4", mla, 2, 4, {}, {}, o);
}

TEST_CASE("geometry: docs/geometry.md's worked example (c), Mamba2 with n_groups 1",
          "[unit][geometry]") {
  // conv [x | B | C] = [8192 | 128 | 128] x 3 bf16, units [128 heads, 1, 1]: the segments the
  // document lists, byte for byte.
  model m;
  m.mamba_layers = {0};
  m.tensors = {{"conv", {8448, 3}, 2, 0u, {8192, 128, 128}, {128, 1, 1}}};
  const pool_sizes sz;
  auto segments = [&](uint32_t ps, uint32_t p, uint32_t pd, uint32_t d) {
    auto plan = make_link_plan(make_schema(m, ps, p, 1, 0, nullptr, sz),
                               make_schema(m, pd, d, 1, 0, nullptr, sz));
    REQUIRE(plan);
    REQUIRE(plan.value.state_segments.size() == 1);
    return plan.value.state_segments[0];
  };
  using segs = std::vector<segment>;
  CHECK(segments(1, 0, 2, 0) == segs{{0, 0, 24576}, {49152, 24576, 1536}});
  CHECK(segments(1, 0, 2, 1) == segs{{24576, 0, 26112}});
  CHECK(segments(2, 1, 4, 2) == segs{{0, 0, 12288}, {24576, 12288, 1536}});
  CHECK(segments(2, 1, 4, 3) == segs{{12288, 0, 13824}});
  // Gather: prefill ranks 0 and 1 both hold B and C; the lowest sends them.
  CHECK(segments(4, 0, 2, 0) == segs{{0, 0, 12288}, {12288, 24576, 1536}});
  CHECK(segments(4, 1, 2, 0) == segs{{0, 12288, 12288}});
}

// ---------------------------------------------------------------------------------------------
// Every family of the model catalogue (core/model_catalogue.hpp), scaled down: the catalogue's
// layout at TP 1 is the unsharded model; at every TP size it allows, its per-rank layout must be
// the reference's sharding of that model; and every pair of allowed sizes (and its PP 2 stages
// into PP 1) must move byte-exact. A size it refuses names the numbers.

namespace {

struct family_case {
  const char* name;
  const char* engine;
  std::string json;
  const char* conv_layout = "";  ///< vLLM's VLLM_SSM_CONV_STATE_LAYOUT
};

std::vector<family_case> catalogue_families() {
  return {
      {"Qwen3-Next", "sglang",
       R"({"architectures": ["Qwen3NextForCausalLM"], "torch_dtype": "bfloat16",
           "num_hidden_layers": 4, "full_attention_interval": 4, "num_key_value_heads": 2,
           "head_dim": 4, "linear_num_key_heads": 8, "linear_num_value_heads": 8,
           "linear_key_head_dim": 2, "linear_value_head_dim": 2, "linear_conv_kernel_dim": 4})"},
      {"Kimi-Linear", "sglang",
       R"({"architectures": ["KimiLinearForCausalLM"], "torch_dtype": "bfloat16",
           "num_hidden_layers": 4, "kv_lora_rank": 4, "qk_rope_head_dim": 2,
           "linear_attn_config": {"full_attn_layers": [4], "kda_layers": [1, 2, 3],
             "num_heads": 4, "head_dim": 2, "short_conv_kernel_size": 4}})"},
      {"Nemotron-H", "sglang",
       R"({"architectures": ["NemotronHForCausalLM"], "torch_dtype": "bfloat16",
           "hybrid_override_pattern": "M*M-", "num_key_value_heads": 4, "head_dim": 4,
           "mamba_num_heads": 8, "mamba_head_dim": 2, "n_groups": 2, "ssm_state_size": 2,
           "conv_kernel": 4})"},
      {"Falcon-H1", "sglang",
       R"({"architectures": ["FalconH1ForCausalLM"], "torch_dtype": "bfloat16",
           "num_hidden_layers": 2, "num_key_value_heads": 2, "head_dim": 4, "mamba_d_ssm": 16,
           "mamba_n_heads": 8, "mamba_d_head": 2, "mamba_n_groups": 1, "mamba_d_state": 2,
           "mamba_d_conv": 4})"},
      {"Nemotron-H (vLLM, conv layout DS)", "vllm",
       R"({"architectures": ["NemotronHForCausalLM"], "torch_dtype": "bfloat16",
           "hybrid_override_pattern": "M*M-", "num_key_value_heads": 4, "head_dim": 4,
           "mamba_num_heads": 8, "mamba_head_dim": 2, "n_groups": 1, "ssm_state_size": 2,
           "conv_kernel": 4})",
       "DS"},
      {"Granite-4.0-H (vLLM)", "vllm",
       R"({"architectures": ["GraniteMoeHybridForCausalLM"], "torch_dtype": "bfloat16",
           "layer_types": ["mamba", "attention", "mamba"], "num_attention_heads": 2,
           "hidden_size": 8, "num_key_value_heads": 2, "mamba_n_heads": 8, "mamba_d_head": 2,
           "mamba_n_groups": 1, "mamba_d_state": 2, "mamba_d_conv": 4})"},
      {"Jamba", "sglang",
       R"({"architectures": ["JambaForCausalLM"], "torch_dtype": "bfloat16",
           "num_hidden_layers": 4, "attn_layer_period": 2, "attn_layer_offset": 1,
           "hidden_size": 8, "mamba_expand": 2, "mamba_d_state": 2, "mamba_d_conv": 4,
           "num_attention_heads": 2, "num_key_value_heads": 2})"},
      {"MiniMax-Text-01 (vLLM)", "vllm",
       R"({"architectures": ["MiniMaxText01ForCausalLM"], "torch_dtype": "bfloat16",
           "attn_type_list": [0, 1, 0], "num_attention_heads": 8, "head_dim": 2,
           "num_key_value_heads": 2})"},
      {"DeepSeek-V3 (MLA)", "sglang",
       R"({"architectures": ["DeepseekV3ForCausalLM"], "torch_dtype": "bfloat16",
           "num_hidden_layers": 2, "kv_lora_rank": 4, "qk_rope_head_dim": 2})"},
  };
}

result<catalogue_layout> catalogue_at(const family_case& f, uint32_t tp, uint32_t pp = 1,
                                      uint32_t pp_rank = 0) {
  catalogue_request req;
  req.config_text = f.json;
  req.source = f.name;
  req.engine = f.engine;
  req.conv_layout = f.conv_layout;
  req.tp_size = tp;
  req.pp_size = pp;
  req.pp_rank = pp_rank;
  return catalogue_lookup(req);
}

/// The catalogue's TP 1 layout as the reference's unsharded model.
model model_of(const catalogue_layout& l) {
  model m;
  if (l.kv)
    m.kv = kv_model{l.kv->mla ? 1 : l.kv->total_heads,
                    l.kv->head_dim,
                    l.kv->dtype_bytes,
                    1,
                    l.kv->mla,
                    l.kv->layer_ids};
  if (l.mamba) {
    m.mamba_layers = l.mamba->layer_ids;
    for (const auto& t : l.mamba->tensors)
      m.tensors.push_back(
          {t.name, t.shape, t.dtype_bytes, t.slice_axis, t.shard_groups, t.shard_units});
  }
  m.aux_row_bytes = 16;
  return m;
}

}  // namespace

TEST_CASE("geometry property: every catalogued family over every TP pair it allows, and PP 2",
          "[unit][geometry][geometry-property][catalogue]") {
  uint64_t n = 0;
  for (const auto& f : catalogue_families()) {
    INFO(f.name);
    auto full = catalogue_at(f, 1);
    INFO(full.message);
    REQUIRE(full);
    const model m = model_of(full.value);
    std::vector<uint32_t> allowed;
    for (uint32_t tp : tp_sizes) {
      auto at = catalogue_at(f, tp);
      if (!at) {
        CHECK_THAT(at.message, Contains(fmt::format("cannot be split over TP {}", tp)));
        continue;
      }
      allowed.push_back(tp);
      // The catalogue's shares are the reference's (rank 0 shows the shapes of every rank).
      if (m.kv)
        CHECK(at.value.kv->kv_heads == (m.kv->mla ? 1u : std::max<uint32_t>(1, m.kv->heads / tp)));
      for (size_t i = 0; i < m.tensors.size(); ++i)
        CHECK(at.value.mamba->tensors[i].shape == rank_shape(m.tensors[i], tp));
    }
    CHECK(allowed.size() >= 3);
    for (uint32_t ps : allowed)
      for (uint32_t pd : allowed)
        check_geometry(fmt::format("{} Ps={} Pd={}", f.name, ps, pd), m, ps, pd, {}, {},
                       sized_for(1, seed_of({40, ++n, ps, pd})), false);
    // PP 2 -> 1, its stages split as the catalogue splits them.
    stages pst;
    for (uint32_t s = 0; s < 2; ++s) {
      auto st = catalogue_at(f, 1, 2, s);
      REQUIRE(st);
      std::vector<uint32_t> layers;
      if (st.value.kv) layers = st.value.kv->layer_ids;
      if (st.value.mamba)
        for (uint32_t id : st.value.mamba->layer_ids)
          if (std::find(layers.begin(), layers.end(), id) == layers.end()) layers.push_back(id);
      pst.push_back(layers);
    }
    for (uint32_t pd : allowed)
      check_geometry(fmt::format("{} PP 2 -> 1, Ps=1 Pd={}", f.name, pd), m, 1, pd, pst, {},
                     sized_for(1, seed_of({41, ++n, pd})), false);
  }
}
