#include "core/layout.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

namespace ferry {
namespace {

constexpr uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
constexpr uint64_t buffer_alignment = 4096;

void add_buffer(pool_layout& pool, buffer_layout b) {
  b.offset = align_up(pool.total_bytes, buffer_alignment);
  pool.total_bytes = b.offset + b.item_bytes * b.items;
  pool.buffers.push_back(b);
}

// FNV-1a over the canonical schema text: cheap, stable across builds and architectures.
uint64_t fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

/// The pool's buffers at `offsets` (a registered pool's, given in layout order) instead of the
/// computed ones; the pool spans up to the end of its last byte, rounded up to a page.
void place(pool_layout& pool, const std::vector<uint64_t>& offsets) {
  if (offsets.empty() || offsets.size() != pool.buffers.size()) return;
  pool.total_bytes = 0;
  for (size_t b = 0; b < offsets.size(); ++b) {
    auto& buf = pool.buffers[b];
    buf.offset = offsets[b];
    pool.total_bytes = std::max(pool.total_bytes, buf.offset + buf.item_bytes * buf.items);
  }
  pool.total_bytes = align_up(pool.total_bytes, buffer_alignment);
}

}  // namespace

const char* to_string(pool_kind k) {
  switch (k) {
    case pool_kind::kv:
      return "kv";
    case pool_kind::state:
      return "state";
    case pool_kind::aux:
      return "aux";
  }
  return "?";
}

const char* to_string(buffer_kind k) {
  switch (k) {
    case buffer_kind::k:
      return "K";
    case buffer_kind::v:
      return "V";
    case buffer_kind::kv:
      return "KV";
    case buffer_kind::state:
      return "state";
    case buffer_kind::aux:
      return "aux";
  }
  return "?";
}

node_layout make_layout(const pools_config& cfg) {
  node_layout out;
  if (cfg.kv) {
    auto& pool = out[pool_kind::kv];
    pool.present = true;
    const auto& kv = *cfg.kv;
    if (kv.mla) {
      for (auto id : kv.layer_ids)
        add_buffer(pool, {0, kv.page_bytes(), kv.pages, id, 0, buffer_kind::kv});
    } else {
      for (auto id : kv.layer_ids)
        add_buffer(pool, {0, kv.page_bytes(), kv.pages, id, 0, buffer_kind::k});
      for (auto id : kv.layer_ids)
        add_buffer(pool, {0, kv.page_bytes(), kv.pages, id, 0, buffer_kind::v});
    }
  }
  if (cfg.mamba) {
    auto& pool = out[pool_kind::state];
    pool.present = true;
    const auto& m = *cfg.mamba;
    for (uint32_t t = 0; t < m.tensors.size(); ++t)
      for (auto id : m.layer_ids)
        add_buffer(pool, {0, m.tensors[t].slot_bytes(), m.slots, id, t, buffer_kind::state});
  }
  if (cfg.aux) {
    auto& pool = out[pool_kind::aux];
    pool.present = true;
    if (!(cfg.aux->placement.registered && cfg.aux->rows == 0))  // described yet
      for (auto bytes : cfg.aux->row_sizes())
        add_buffer(pool, {0, bytes, cfg.aux->rows, 0, 0, buffer_kind::aux});
  }
  if (cfg.kv) place(out[pool_kind::kv], cfg.kv->placement.offsets);
  if (cfg.mamba) place(out[pool_kind::state], cfg.mamba->placement.offsets);
  if (cfg.aux) place(out[pool_kind::aux], cfg.aux->placement.offsets);
  return out;
}

std::vector<uint32_t> layer_ids(const node_layout& layout) {
  std::vector<uint32_t> ids;
  for (auto k : {pool_kind::kv, pool_kind::state})
    for (const auto& b : layout[k].buffers) ids.push_back(b.layer_id);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

uint64_t compatibility_hash(const pools_config& c) {
  std::string s;
  if (c.kv)
    s += fmt::format("kv:{}:{}:{}:{}:{}:{}:{};", c.kv->page_tokens, c.kv->dtype_bytes, c.kv->mla,
                     c.kv->kv_heads, c.kv->total_heads, c.kv->head_dim, c.kv->layer_ids);
  if (c.mamba) {
    s += fmt::format("mamba:{};", c.mamba->layer_ids);
    if (c.mamba->type != state_type::mamba) s += fmt::format("type:{};", to_string(c.mamba->type));
    for (const auto& t : c.mamba->tensors) {
      s += fmt::format("t:{}:{}:{}:{}:{};", t.name, t.shape, t.dtype_bytes,
                       t.slice_axis ? int64_t{*t.slice_axis} : -1, t.shard_groups);
      if (!t.shard_units.empty()) s += fmt::format("u:{};", t.shard_units);
    }
  }
  if (c.aux) {
    s += fmt::format("aux:{};", c.aux->row_bytes);
    if (!c.aux->more_row_bytes.empty() || c.aux->room_id_buffer != 0)
      s += fmt::format("aux+:{}:{};", c.aux->more_row_bytes, c.aux->room_id_buffer);
  }
  return fnv1a(s);
}

}  // namespace ferry
