#include "core/plan.hpp"

#include <fmt/format.h>

namespace ferry {

std::vector<page_run> coalesce_runs(std::span<const uint32_t> src, std::span<const uint32_t> dst) {
  std::vector<page_run> runs;
  const size_t n = std::min(src.size(), dst.size());
  for (size_t i = 0; i < n; ++i) {
    if (!runs.empty()) {
      auto& r = runs.back();
      if (src[i] == r.src + r.count && dst[i] == r.dst + r.count) {
        ++r.count;
        continue;
      }
    }
    runs.push_back({src[i], dst[i], 1});
  }
  return runs;
}

void plan_kv(const pool_layout& src, const pool_layout& dst, std::span<const page_run> runs,
             std::vector<planned_write>& out) {
  // Buffers are paired by index: the compatibility check guarantees identical buffer lists.
  for (const auto& run : runs)
    for (size_t b = 0; b < src.buffers.size(); ++b) {
      const auto& s = src.buffers[b];
      const auto& d = dst.buffers[b];
      out.push_back({pool_kind::kv, s.offset + uint64_t{run.src} * s.item_bytes,
                     d.offset + uint64_t{run.dst} * d.item_bytes,
                     uint64_t{run.count} * s.item_bytes});
    }
}

void plan_state(const pool_layout& src, const pool_layout& dst, uint32_t src_slot,
                uint32_t dst_slot, std::vector<planned_write>& out) {
  for (size_t b = 0; b < src.buffers.size(); ++b) {
    const auto& s = src.buffers[b];
    const auto& d = dst.buffers[b];
    out.push_back({pool_kind::state, s.offset + uint64_t{src_slot} * s.item_bytes,
                   d.offset + uint64_t{dst_slot} * d.item_bytes, s.item_bytes});
  }
}

void plan_aux(const pool_layout& src, const pool_layout& dst, uint32_t src_row, uint32_t dst_row,
              std::vector<planned_write>& out) {
  const auto& s = src.buffers.at(0);
  const auto& d = dst.buffers.at(0);
  out.push_back({pool_kind::aux, s.offset + uint64_t{src_row} * s.item_bytes,
                 d.offset + uint64_t{dst_row} * d.item_bytes, s.item_bytes});
}

void split_pieces(std::vector<planned_write>& writes, uint64_t piece_bytes) {
  if (piece_bytes == 0) return;
  size_t extra = 0;
  for (const auto& w : writes)
    if (w.length > piece_bytes) extra += (w.length - 1) / piece_bytes;
  if (extra == 0) return;
  std::vector<planned_write> out;
  out.reserve(writes.size() + extra);
  for (const auto& w : writes)
    for (uint64_t off = 0; off < w.length; off += piece_bytes)
      out.push_back(
          {w.pool, w.src_offset + off, w.dst_offset + off, std::min(piece_bytes, w.length - off)});
  writes = std::move(out);
}

std::optional<std::string> check_indices(std::span<const uint32_t> indices, uint64_t limit,
                                         const char* what, const char* unit) {
  for (size_t i = 0; i < indices.size(); ++i)
    if (indices[i] >= limit)
      return fmt::format("{} {} (position {}) is outside the pool of {} {}", what, indices[i], i,
                         limit, unit);
  return std::nullopt;
}

std::optional<std::string> chunk_cursor::take(uint32_t n, bool last, uint32_t& first_position) {
  if (finished_)
    return fmt::format("the last chunk was already sent ({} pages); no further chunk is accepted",
                       position_);
  if (uint64_t{position_} + n > dst_pages_)
    return fmt::format(
        "chunk of {} pages at position {} goes beyond the decode's page list of {} pages", n,
        position_, dst_pages_);
  if (last && position_ + n != dst_pages_)
    return fmt::format("last chunk ends at page position {} but the decode prepared {} pages",
                       position_ + n, dst_pages_);
  first_position = position_;
  position_ += n;
  finished_ = last;
  return std::nullopt;
}

}  // namespace ferry
