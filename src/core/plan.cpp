#include "core/plan.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/pack.hpp"

namespace ferry {

std::vector<page_run> coalesce_runs(std::span<const uint32_t> src, std::span<const uint32_t> dst,
                                    uint32_t first_position) {
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
    runs.push_back({src[i], dst[i], 1, first_position + static_cast<uint32_t>(i)});
  }
  return runs;
}

const char* to_string(space s) {
  switch (s) {
    case space::kv:
      return "kv";
    case space::state:
      return "state";
    case space::aux:
      return "aux";
    case space::staging:
      return "staging";
  }
  return "?";
}

uint64_t pack_bytes(const link_plan& link, std::span<const page_run> runs) {
  if (link.kv != kv_mode::pack) return 0;
  uint64_t tokens = 0;
  for (const auto& r : runs) tokens += uint64_t{r.count} * link.page_tokens;
  return tokens * link.row.length * link.kv_buffers.size();
}

void plan_kv_chunk(const link_plan& link, const node_layout& src, const node_layout& dst,
                   std::span<const page_run> runs, const staging_use& staging,
                   std::vector<planned_copy>& pack, std::vector<planned_write>& writes,
                   layer_range layers) {
  kv_options o;
  if (link.kv == kv_mode::unpack) o.dst_staging = staging.dst;
  o.room_pages = staging.room_pages;
  o.slice_bytes = staging.src ? ~uint64_t{0} : 0;
  o.layers = layers;
  auto plan = plan_kv(link, src, dst, runs, o);
  writes.insert(writes.end(), plan.writes.begin(), plan.writes.end());
  if (!plan.jobs.empty()) expand_pack_jobs(plan.jobs, *staging.src, pack, writes);
}

void plan_state_link(const link_plan& link, const node_layout& src, const node_layout& dst,
                     uint32_t src_slot, uint32_t dst_slot, std::vector<planned_write>& out,
                     layer_range layers) {
  const auto& sp = src[pool_kind::state];
  const auto& dp = dst[pool_kind::state];
  for (const auto& pair : link.state_buffers) {
    const auto& s = sp.buffers[pair.src];
    if (!layers.contains(s.layer_id)) continue;
    const auto& d = dp.buffers[pair.dst];
    const uint64_t s0 = s.offset + uint64_t{src_slot} * s.item_bytes;
    const uint64_t d0 = d.offset + uint64_t{dst_slot} * d.item_bytes;
    for (const auto& seg : link.state_segments[pair.tensor])
      out.push_back({space::state, space::state, s0 + seg.src, d0 + seg.dst, seg.length});
  }
}

void plan_state_pages(const link_plan& link, const node_layout& src, const node_layout& dst,
                      std::span<const uint32_t> src_pages, std::span<const uint32_t> dst_pages,
                      std::vector<planned_write>& out, layer_range layers) {
  const auto& sp = src[pool_kind::state];
  const auto& dp = dst[pool_kind::state];
  const auto runs = coalesce_runs(src_pages, dst_pages);
  for (const auto& pair : link.state_buffers) {
    const auto& s = sp.buffers[pair.src];
    if (!layers.contains(s.layer_id)) continue;
    const auto& d = dp.buffers[pair.dst];
    const auto& segs = link.state_segments[pair.tensor];
    const bool whole = segs.size() == 1 && segs[0].src == 0 && segs[0].dst == 0 &&
                       segs[0].length == s.item_bytes && s.item_bytes == d.item_bytes;
    for (const auto& r : runs) {
      const uint64_t s0 = s.offset + uint64_t{r.src} * s.item_bytes;
      const uint64_t d0 = d.offset + uint64_t{r.dst} * d.item_bytes;
      if (whole) {
        out.push_back({space::state, space::state, s0, d0, uint64_t{r.count} * s.item_bytes});
        continue;
      }
      for (uint32_t i = 0; i < r.count; ++i)
        for (const auto& seg : segs)
          out.push_back({space::state, space::state, s0 + i * s.item_bytes + seg.src,
                         d0 + i * d.item_bytes + seg.dst, seg.length});
    }
  }
}

void plan_aux_link(const link_plan& link, const node_layout& src, const node_layout& dst,
                   uint32_t src_row, uint32_t dst_row, std::vector<planned_write>& out) {
  if (!link.aux) return;
  // The row of every aux buffer (the geometry checked that both sides have the same ones).
  const auto& sb = src[pool_kind::aux].buffers;
  const auto& db = dst[pool_kind::aux].buffers;
  for (size_t b = 0; b < sb.size() && b < db.size(); ++b)
    out.push_back({space::aux, space::aux, sb[b].offset + uint64_t{src_row} * sb[b].item_bytes,
                   db[b].offset + uint64_t{dst_row} * db[b].item_bytes, sb[b].item_bytes});
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
      out.push_back({w.src, w.dst, w.src_offset + off, w.dst_offset + off,
                     std::min(piece_bytes, w.length - off)});
  writes = std::move(out);
}

result<> check_indices(std::span<const uint32_t> indices, uint64_t limit, const char* what,
                       const char* unit) {
  for (size_t i = 0; i < indices.size(); ++i)
    if (indices[i] >= limit)
      return error{errc::invalid_request,
                   fmt::format("{} {} (position {}) is outside the pool of {} {}", what, indices[i],
                               i, limit, unit)};
  // An index named twice would make two positions share one item: one position's bytes lost.
  std::vector<std::pair<uint32_t, uint32_t>> sorted(indices.size());  // (index, position)
  for (size_t i = 0; i < indices.size(); ++i) sorted[i] = {indices[i], static_cast<uint32_t>(i)};
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i].first == sorted[i - 1].first)
      return error{errc::invalid_request,
                   fmt::format("{} {} is named twice (positions {} and {})", what, sorted[i].first,
                               sorted[i - 1].second, sorted[i].second)};
  return {};
}

result<uint32_t> chunk_cursor::take(uint32_t n, bool last) {
  if (finished_)
    return error{
        errc::invalid_request,
        fmt::format("the last chunk was already sent ({} pages); no further chunk is accepted",
                    position_)};
  if (uint64_t{position_} + n > dst_pages_)
    return error{
        errc::invalid_request,
        fmt::format(
            "chunk of {} pages at position {} goes beyond the decode's page list of {} pages", n,
            position_, dst_pages_)};
  if (last && position_ + n != dst_pages_)
    return error{errc::invalid_request,
                 fmt::format("last chunk ends at page position {} but the decode prepared {} pages",
                             position_ + n, dst_pages_)};
  const uint32_t first_position = position_;
  position_ += n;
  finished_ = last;
  return first_position;
}

}  // namespace ferry
