#include "core/dst_claims.hpp"

#include <fmt/format.h>

#include "core/status.hpp"

namespace ferry {

dst_claims::dst_claims(uint64_t pages, uint64_t slots, uint64_t rows) {
  pages_.holder.resize(pages);
  pages_.taken.resize(pages);
  slots_.holder.resize(slots);
  slots_.taken.resize(slots);
  rows_.holder.resize(rows);
  rows_.taken.resize(rows);
}

result<> dst_claims::claim(uint64_t room, std::span<const uint32_t> pages, uint32_t slot,
                           uint32_t row, std::span<const uint32_t> state_pages) {
  for (size_t i = 0; i < pages.size(); ++i)
    if (pages_.taken[pages[i]])
      return error{errc::invalid_request,
                   fmt::format("room {}: dst page {} (position {}) is held by active room {}", room,
                               pages[i], i, pages_.holder[pages[i]])};
  if (slot != no_index && slots_.taken[slot])
    return error{errc::invalid_request,
                 fmt::format("room {}: dst state slot {} is held by active room {}", room, slot,
                             slots_.holder[slot])};
  for (size_t i = 0; i < state_pages.size(); ++i)
    if (slots_.taken[state_pages[i]])
      return error{errc::invalid_request,
                   fmt::format("room {}: dst state page {} (position {}) is held by active room {}",
                               room, state_pages[i], i, slots_.holder[state_pages[i]])};
  if (row != no_index && rows_.taken[row])
    return error{errc::invalid_request,
                 fmt::format("room {}: dst aux row {} is held by active room {}", room, row,
                             rows_.holder[row])};
  auto take = [&](table& t, uint32_t i) {
    t.taken[i] = true;
    t.holder[i] = room;
    ++t.held;
  };
  for (auto p : pages) take(pages_, p);
  if (slot != no_index) take(slots_, slot);
  for (auto p : state_pages) take(slots_, p);
  if (row != no_index) take(rows_, row);
  return {};
}

void dst_claims::release(uint64_t room, std::span<const uint32_t> pages, uint32_t slot,
                         uint32_t row, std::span<const uint32_t> state_pages) {
  auto drop = [&](table& t, uint32_t i) {
    if (i >= t.taken.size() || !t.taken[i] || t.holder[i] != room) return;
    t.taken[i] = false;
    --t.held;
  };
  for (auto p : pages) drop(pages_, p);
  if (slot != no_index) drop(slots_, slot);
  for (auto p : state_pages) drop(slots_, p);
  if (row != no_index) drop(rows_, row);
}

}  // namespace ferry
