#include "ferry/workload.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/pattern.hpp"

namespace ferry::client {
namespace {

constexpr uint32_t kv_pool = static_cast<uint32_t>(pool_kind::kv);
constexpr uint32_t state_pool = static_cast<uint32_t>(pool_kind::state);
constexpr uint32_t aux_pool = static_cast<uint32_t>(pool_kind::aux);

const pool_layout& layout_of(const client& c, pool_kind k) {
  return c.daemon().pools[static_cast<int>(k)].layout;
}

std::span<uint8_t> item_span(const client& c, pool_kind k, size_t b, uint64_t index) {
  const auto& buf = layout_of(c, k).buffers[b];
  return {c.item(k, b, index), buf.item_bytes};
}

}  // namespace

void fill_kv(client& c, uint64_t key, std::span<const uint32_t> pages, uint32_t first_position) {
  const auto& l = layout_of(c, pool_kind::kv);
  for (size_t b = 0; b < l.buffers.size(); ++b)
    for (size_t i = 0; i < pages.size(); ++i)
      fill_pattern(item_span(c, pool_kind::kv, b, pages[i]), pattern_seed(key, kv_pool, static_cast<uint32_t>(b), first_position + i));
}

void fill_state_and_aux(client& c, uint64_t key, uint32_t state_slot, uint32_t aux_row, uint64_t room) {
  if (c.daemon().pools[state_pool].present) {
    const auto& l = layout_of(c, pool_kind::state);
    for (size_t b = 0; b < l.buffers.size(); ++b)
      fill_pattern(item_span(c, pool_kind::state, b, state_slot), pattern_seed(key, state_pool, static_cast<uint32_t>(b), 0));
  }
  if (c.daemon().pools[aux_pool].present) {
    auto row = item_span(c, pool_kind::aux, 0, aux_row);
    fill_pattern(row.subspan(8), pattern_seed(key, aux_pool, 0, 0));
    std::memcpy(row.data(), &room, 8);
  }
}

std::string verify_room(const client& c, uint64_t key, uint64_t room, std::span<const uint32_t> pages,
                        uint32_t state_slot, uint32_t aux_row) {
  if (c.daemon().pools[kv_pool].present) {
    const auto& l = layout_of(c, pool_kind::kv);
    for (size_t b = 0; b < l.buffers.size(); ++b)
      for (size_t i = 0; i < pages.size(); ++i) {
        auto at = check_pattern(item_span(c, pool_kind::kv, b, pages[i]), pattern_seed(key, kv_pool, static_cast<uint32_t>(b), i));
        if (at >= 0)
          return fmt::format("room {}: kv buffer {} (layer {}) page {} (position {}) differs at byte {}", room, b,
                             l.buffers[b].layer_id, pages[i], i, at);
      }
  }
  if (c.daemon().pools[state_pool].present) {
    const auto& l = layout_of(c, pool_kind::state);
    for (size_t b = 0; b < l.buffers.size(); ++b) {
      auto at = check_pattern(item_span(c, pool_kind::state, b, state_slot), pattern_seed(key, state_pool, static_cast<uint32_t>(b), 0));
      if (at >= 0)
        return fmt::format("room {}: state buffer {} (tensor {}, layer {}) slot {} differs at byte {}", room, b,
                           l.buffers[b].tensor, l.buffers[b].layer_id, state_slot, at);
    }
  }
  if (c.daemon().pools[aux_pool].present) {
    auto row = item_span(c, pool_kind::aux, 0, aux_row);
    uint64_t stored = 0;
    std::memcpy(&stored, row.data(), 8);
    if (stored != room) return fmt::format("room {}: aux row {} carries room id {}", room, aux_row, stored);
    auto at = check_pattern(row.subspan(8), pattern_seed(key, aux_pool, 0, 0));
    if (at >= 0) return fmt::format("room {}: aux row {} differs at byte {}", room, aux_row, at + 8);
  }
  return {};
}

void clear_room(client& c, std::span<const uint32_t> pages, uint32_t state_slot, uint32_t aux_row) {
  if (c.daemon().pools[kv_pool].present) {
    const auto& l = layout_of(c, pool_kind::kv);
    for (size_t b = 0; b < l.buffers.size(); ++b)
      for (auto p : pages) {
        auto s = item_span(c, pool_kind::kv, b, p);
        std::memset(s.data(), 0, s.size());
      }
  }
  if (c.daemon().pools[state_pool].present && state_slot != no_index) {
    const auto& l = layout_of(c, pool_kind::state);
    for (size_t b = 0; b < l.buffers.size(); ++b) {
      auto s = item_span(c, pool_kind::state, b, state_slot);
      std::memset(s.data(), 0, s.size());
    }
  }
  if (c.daemon().pools[aux_pool].present && aux_row != no_index) {
    auto s = item_span(c, pool_kind::aux, 0, aux_row);
    std::memset(s.data(), 0, s.size());
  }
}

}  // namespace ferry::client
