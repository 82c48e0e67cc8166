#include "tools/workload/workload.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/pattern.hpp"
#include "core/plan.hpp"

namespace ferry::client {
namespace {

constexpr uint32_t kv_pool = static_cast<uint32_t>(pool_kind::kv);
constexpr uint32_t state_pool = static_cast<uint32_t>(pool_kind::state);
constexpr uint32_t aux_pool = static_cast<uint32_t>(pool_kind::aux);

const pool_layout& layout_of(const client& c, pool_kind k) {
  return c.daemon().pools[static_cast<int>(k)].layout;
}
bool has(const client& c, pool_kind k) { return c.daemon().pools[static_cast<int>(k)].present; }

std::span<uint8_t> item_span(const client& c, pool_kind k, size_t b, uint64_t index) {
  return {c.item(k, b, index), layout_of(c, k).buffers[b].item_bytes};
}

/// Check every index the call will touch, with the daemon's wording.
result<> check(const client& c, std::span<const uint32_t> pages, uint32_t slot, uint32_t row) {
  if (!c.pool(pool_kind::kv) && !pages.empty() && has(c, pool_kind::kv))
    return error{errc::invalid_request, "pools are not mapped (call map_pools)"};
  if (!pages.empty()) {
    if (!has(c, pool_kind::kv))
      return error{errc::invalid_request, "kv pages given but the daemon has no kv pool"};
    if (auto e =
            check_indices(pages, layout_of(c, pool_kind::kv).buffers[0].items, "kv page", "pages");
        !e)
      return e;
  }
  if (slot != no_index) {
    if (!has(c, pool_kind::state))
      return error{errc::invalid_request,
                   fmt::format("state slot {} given but the daemon has no mamba pool", slot)};
    const auto slots = layout_of(c, pool_kind::state).buffers[0].items;
    if (slot >= slots)
      return error{errc::invalid_request,
                   fmt::format("state slot {} is outside the pool of {} slots", slot, slots)};
  }
  if (row != no_index) {
    if (!has(c, pool_kind::aux))
      return error{errc::invalid_request,
                   fmt::format("aux row {} given but the daemon has no aux pool", row)};
    const auto rows = layout_of(c, pool_kind::aux).buffers[0].items;
    if (row >= rows)
      return error{errc::invalid_request,
                   fmt::format("aux row {} is outside the pool of {} rows", row, rows)};
  }
  if ((slot != no_index && !c.pool(pool_kind::state)) ||
      (row != no_index && !c.pool(pool_kind::aux)))
    return error{errc::invalid_request, "pools are not mapped (call map_pools)"};
  return {};
}

/// Seed of one unit of the global model: the pattern depends only on global coordinates (layer
/// id, K/V or tensor, token position, global head or channel), so any TP/PP geometry of either
/// side must end with the same bytes.
uint64_t unit_seed(uint64_t key, uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t h = splitmix64(key ^ 0x5bd1e995u);
  for (uint64_t x : {a, b, c, d}) h = splitmix64(h ^ x);
  return h;
}

/// The daemon's geometry, from the config it sent at hello.
struct geometry {
  std::shared_ptr<const ferry_config> cfg;
  uint32_t tp = 1, rank = 0;
};

result<> geometry_of(const client& c, geometry& g) {
  g.cfg = daemon_config(c);
  if (!g.cfg)
    return error{errc::internal, "the daemon's config is not available (hello carried none)"};
  g.tp = g.cfg->tp.size;
  g.rank = g.cfg->tp.rank;
  return {};
}

/// Global index of the first KV head this rank holds, and the bytes of one head (or of the
/// whole row for MLA, which is replicated). Written from the ownership rule on purpose rather
/// than calling core/geometry, so verification does not trust the planner's own code.
std::pair<uint64_t, uint64_t> head_geometry(const geometry& g) {
  const auto& kv = *g.cfg->pools.kv;
  const uint64_t head_bytes = uint64_t{kv.head_dim} * kv.dtype_bytes;
  if (kv.mla) return {0, head_bytes * kv.kv_heads};
  const uint32_t total = kv.model_heads(g.tp);
  const uint64_t first =
      g.tp <= total ? uint64_t{g.rank} * (total / g.tp) : g.rank / (g.tp / total);
  return {first, head_bytes};
}

/// Calls `f(unit, seed, token, global head)` for every unit (one head of one token) of a KV
/// page, until f returns false.
template <class F>
void for_each_kv_unit(const client& c, const geometry& g, uint64_t key, size_t b, uint32_t page,
                      uint64_t position, F&& f) {
  const auto& l = layout_of(c, pool_kind::kv);
  const auto& buf = l.buffers[b];
  const auto& kv = *g.cfg->pools.kv;
  auto [first_head, unit] = head_geometry(g);
  auto item = item_span(c, pool_kind::kv, b, page);
  const uint64_t row = item.size() / kv.page_tokens;
  for (uint64_t t = 0; t < kv.page_tokens; ++t)
    for (uint64_t h = 0; h * unit < row; ++h)
      if (!f(item.subspan(t * row + h * unit, unit),
             unit_seed(key, kv_pool,
                       (uint64_t{static_cast<uint8_t>(buf.kind)} << 32) | buf.layer_id,
                       position * kv.page_tokens + t, first_head + h),
             t, first_head + h))
        return;
}

/// Calls `f(unit, seed, outer row, global channel)` for every unit of one state slot buffer: one
/// unit per (outer row, global channel) of the sliced axis, or the whole slot without slicing
/// metadata; until f returns false.
template <class F>
void for_each_state_unit(const client& c, const geometry& g, uint64_t key, size_t b, uint32_t slot,
                         F&& f) {
  const auto& buf = layout_of(c, pool_kind::state).buffers[b];
  const auto& t = g.cfg->pools.mamba->tensors.at(buf.tensor);
  auto item = item_span(c, pool_kind::state, b, slot);
  const uint64_t tag = (uint64_t{buf.tensor} << 32) | buf.layer_id;
  if (!t.slice_axis) {
    f(item, unit_seed(key, state_pool, tag, 0, 0), 0, 0);
    return;
  }
  const uint64_t unit = t.unit_bytes(), local = t.sliced_dim();
  const std::vector<uint64_t> groups =
      t.shard_groups.empty() ? std::vector<uint64_t>{local * g.tp} : t.shard_groups;
  for (uint64_t o = 0; o < t.outer_count(); ++o) {
    uint64_t x = 0, group_start = 0;
    for (size_t i = 0; i < groups.size(); ++i) {
      // A replicated group's channels have the same global index, so the same bytes, on every
      // rank that holds them (shard_units).
      const auto [first, n] = shard_share(
          groups[i], t.shard_groups.empty() ? groups[i] : t.group_units(i), g.tp, g.rank);
      for (uint64_t j = 0; j < n; ++j, ++x)
        if (!f(item.subspan((o * local + x) * unit, unit),
               unit_seed(key, state_pool, tag, o, group_start + first + j), o,
               group_start + first + j))
          return;
      group_start += groups[i];
    }
  }
}

}  // namespace

result<> fill_kv(client& c, uint64_t key, std::span<const uint32_t> pages,
                 uint32_t first_position) {
  if (auto e = check(c, pages, no_index, no_index); !e) return e;
  if (pages.empty()) return {};
  geometry g;
  if (auto e = geometry_of(c, g); !e) return e;
  const auto& l = layout_of(c, pool_kind::kv);
  for (size_t b = 0; b < l.buffers.size(); ++b)
    for (size_t i = 0; i < pages.size(); ++i)
      for_each_kv_unit(c, g, key, b, pages[i], first_position + i,
                       [](std::span<uint8_t> u, uint64_t seed, uint64_t, uint64_t) {
                         fill_pattern(u, seed);
                         return true;
                       });
  return {};
}

result<> fill_state_and_aux(client& c, uint64_t key, uint32_t state_slot, uint32_t aux_row,
                            uint64_t room) {
  if (auto e = check(c, {}, state_slot, aux_row); !e) return e;
  if (state_slot != no_index) {
    geometry g;
    if (auto e = geometry_of(c, g); !e) return e;
    const auto& l = layout_of(c, pool_kind::state);
    for (size_t b = 0; b < l.buffers.size(); ++b)
      for_each_state_unit(c, g, key, b, state_slot,
                          [](std::span<uint8_t> u, uint64_t seed, uint64_t, uint64_t) {
                            fill_pattern(u, seed);
                            return true;
                          });
  }
  if (aux_row != no_index) {
    auto row = item_span(c, pool_kind::aux, 0, aux_row);
    fill_pattern(row.subspan(8), pattern_seed(key, aux_pool, 0, 0));
    std::memcpy(row.data(), &room, 8);
  }
  return {};
}

result<> verify_room(const client& c, uint64_t key, uint64_t room, std::span<const uint32_t> pages,
                     uint32_t state_slot, uint32_t aux_row) {
  if (auto e = check(c, pages, state_slot, aux_row); !e) return e;
  geometry g;
  if (!pages.empty() || state_slot != no_index)
    if (auto e = geometry_of(c, g); !e) return e;
  std::string bad;
  if (!pages.empty()) {
    const auto& l = layout_of(c, pool_kind::kv);
    static constexpr const char* kinds[] = {"K", "V", "KV"};
    for (size_t b = 0; b < l.buffers.size() && bad.empty(); ++b)
      for (size_t i = 0; i < pages.size() && bad.empty(); ++i)
        for_each_kv_unit(c, g, key, b, pages[i], i,
                         [&](std::span<uint8_t> u, uint64_t seed, uint64_t t, uint64_t head) {
                           auto at = check_pattern(u, seed);
                           if (at < 0) return true;
                           bad = fmt::format(
                               "room {}: kv {} layer {} page {} (position {}) token {} head {} "
                               "differs at byte {} of the head",
                               room, kinds[static_cast<int>(l.buffers[b].kind) % 3],
                               l.buffers[b].layer_id, pages[i], i, t, head, at);
                           return false;
                         });
    if (!bad.empty()) return error{errc::internal, bad};
  }
  if (state_slot != no_index) {
    const auto& l = layout_of(c, pool_kind::state);
    for (size_t b = 0; b < l.buffers.size() && bad.empty(); ++b)
      for_each_state_unit(
          c, g, key, b, state_slot,
          [&](std::span<uint8_t> u, uint64_t seed, uint64_t o, uint64_t channel) {
            auto at = check_pattern(u, seed);
            if (at < 0) return true;
            bad = fmt::format(
                "room {}: state tensor {} layer {} slot {} row {} channel {} differs at byte {}",
                room, g.cfg->pools.mamba->tensors[l.buffers[b].tensor].name, l.buffers[b].layer_id,
                state_slot, o, channel, at);
            return false;
          });
    if (!bad.empty()) return error{errc::internal, bad};
  }
  if (aux_row != no_index) {
    auto row = item_span(c, pool_kind::aux, 0, aux_row);
    uint64_t stored = 0;
    std::memcpy(&stored, row.data(), 8);
    if (stored != room)
      return error{errc::invalid_request,
                   fmt::format("room {}: aux row {} carries room id {}", room, aux_row, stored)};
    auto at = check_pattern(row.subspan(8), pattern_seed(key, aux_pool, 0, 0));
    if (at >= 0)
      return error{errc::invalid_request,
                   fmt::format("room {}: aux row {} differs at byte {}", room, aux_row, at + 8)};
  }
  return {};
}

result<> clear_room(client& c, std::span<const uint32_t> pages, uint32_t state_slot,
                    uint32_t aux_row) {
  if (auto e = check(c, pages, state_slot, aux_row); !e) return e;
  auto zero = [](std::span<uint8_t> s) { std::memset(s.data(), 0, s.size()); };
  if (!pages.empty())
    for (size_t b = 0; b < layout_of(c, pool_kind::kv).buffers.size(); ++b)
      for (auto p : pages) zero(item_span(c, pool_kind::kv, b, p));
  if (state_slot != no_index)
    for (size_t b = 0; b < layout_of(c, pool_kind::state).buffers.size(); ++b)
      zero(item_span(c, pool_kind::state, b, state_slot));
  if (aux_row != no_index) zero(item_span(c, pool_kind::aux, 0, aux_row));
  return {};
}

}  // namespace ferry::client
