#include "ferry/workload.hpp"

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

/// Check every index the call will touch, with the daemon's wording; "" when all are valid.
std::string check(const client& c, std::span<const uint32_t> pages, uint32_t slot, uint32_t row) {
  if (!c.pool(pool_kind::kv) && !pages.empty() && has(c, pool_kind::kv))
    return "pools are not mapped (call map_pools)";
  if (!pages.empty()) {
    if (!has(c, pool_kind::kv)) return "kv pages given but the daemon has no kv pool";
    if (auto e =
            check_indices(pages, layout_of(c, pool_kind::kv).buffers[0].items, "kv page", "pages"))
      return *e;
  }
  if (slot != no_index) {
    if (!has(c, pool_kind::state))
      return fmt::format("state slot {} given but the daemon has no mamba pool", slot);
    const auto slots = layout_of(c, pool_kind::state).buffers[0].items;
    if (slot >= slots)
      return fmt::format("state slot {} is outside the pool of {} slots", slot, slots);
  }
  if (row != no_index) {
    if (!has(c, pool_kind::aux))
      return fmt::format("aux row {} given but the daemon has no aux pool", row);
    const auto rows = layout_of(c, pool_kind::aux).buffers[0].items;
    if (row >= rows) return fmt::format("aux row {} is outside the pool of {} rows", row, rows);
  }
  if ((slot != no_index && !c.pool(pool_kind::state)) ||
      (row != no_index && !c.pool(pool_kind::aux)))
    return "pools are not mapped (call map_pools)";
  return {};
}

}  // namespace

std::string fill_kv(client& c, uint64_t key, std::span<const uint32_t> pages,
                    uint32_t first_position) {
  if (auto e = check(c, pages, no_index, no_index); !e.empty()) return e;
  if (pages.empty()) return {};
  const auto& l = layout_of(c, pool_kind::kv);
  for (size_t b = 0; b < l.buffers.size(); ++b)
    for (size_t i = 0; i < pages.size(); ++i)
      fill_pattern(item_span(c, pool_kind::kv, b, pages[i]),
                   pattern_seed(key, kv_pool, static_cast<uint32_t>(b), first_position + i));
  return {};
}

std::string fill_state_and_aux(client& c, uint64_t key, uint32_t state_slot, uint32_t aux_row,
                               uint64_t room) {
  if (auto e = check(c, {}, state_slot, aux_row); !e.empty()) return e;
  if (state_slot != no_index) {
    const auto& l = layout_of(c, pool_kind::state);
    for (size_t b = 0; b < l.buffers.size(); ++b)
      fill_pattern(item_span(c, pool_kind::state, b, state_slot),
                   pattern_seed(key, state_pool, static_cast<uint32_t>(b), 0));
  }
  if (aux_row != no_index) {
    auto row = item_span(c, pool_kind::aux, 0, aux_row);
    fill_pattern(row.subspan(8), pattern_seed(key, aux_pool, 0, 0));
    std::memcpy(row.data(), &room, 8);
  }
  return {};
}

std::string verify_room(const client& c, uint64_t key, uint64_t room,
                        std::span<const uint32_t> pages, uint32_t state_slot, uint32_t aux_row) {
  if (auto e = check(c, pages, state_slot, aux_row); !e.empty()) return e;
  if (!pages.empty()) {
    const auto& l = layout_of(c, pool_kind::kv);
    for (size_t b = 0; b < l.buffers.size(); ++b)
      for (size_t i = 0; i < pages.size(); ++i) {
        auto at = check_pattern(item_span(c, pool_kind::kv, b, pages[i]),
                                pattern_seed(key, kv_pool, static_cast<uint32_t>(b), i));
        if (at >= 0)
          return fmt::format(
              "room {}: kv buffer {} (layer {}) page {} (position {}) differs at byte {}", room, b,
              l.buffers[b].layer_id, pages[i], i, at);
      }
  }
  if (state_slot != no_index) {
    const auto& l = layout_of(c, pool_kind::state);
    for (size_t b = 0; b < l.buffers.size(); ++b) {
      auto at = check_pattern(item_span(c, pool_kind::state, b, state_slot),
                              pattern_seed(key, state_pool, static_cast<uint32_t>(b), 0));
      if (at >= 0)
        return fmt::format(
            "room {}: state buffer {} (tensor {}, layer {}) slot {} differs at byte {}", room, b,
            l.buffers[b].tensor, l.buffers[b].layer_id, state_slot, at);
    }
  }
  if (aux_row != no_index) {
    auto row = item_span(c, pool_kind::aux, 0, aux_row);
    uint64_t stored = 0;
    std::memcpy(&stored, row.data(), 8);
    if (stored != room)
      return fmt::format("room {}: aux row {} carries room id {}", room, aux_row, stored);
    auto at = check_pattern(row.subspan(8), pattern_seed(key, aux_pool, 0, 0));
    if (at >= 0)
      return fmt::format("room {}: aux row {} differs at byte {}", room, aux_row, at + 8);
  }
  return {};
}

std::string clear_room(client& c, std::span<const uint32_t> pages, uint32_t state_slot,
                       uint32_t aux_row) {
  if (auto e = check(c, pages, state_slot, aux_row); !e.empty()) return e;
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
