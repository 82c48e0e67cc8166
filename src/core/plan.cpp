#include "core/plan.hpp"

#include <fmt/format.h>

#include <algorithm>

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

void plan_pack_jobs(const link_plan& link, const node_layout& src, const node_layout& dst,
                    std::span<const page_run> runs, uint64_t max_tokens, std::vector<pack_job>& out,
                    layer_range layers) {
  if (link.kv != kv_mode::pack) return;
  max_tokens = std::max<uint64_t>(max_tokens, 1);
  const auto& sp = src[pool_kind::kv];
  const auto& dp = dst[pool_kind::kv];
  for (const auto& run : runs)
    for (const auto& pair : link.kv_buffers) {
      if (!layers.contains(sp.buffers[pair.src].layer_id)) continue;
      const uint64_t s0 =
          sp.buffers[pair.src].offset + uint64_t{run.src} * link.src_page_bytes + link.row.src;
      const uint64_t d0 = dp.buffers[pair.dst].offset + uint64_t{run.dst} * link.dst_page_bytes;
      const uint64_t tokens = uint64_t{run.count} * link.page_tokens;
      // The decode row is exactly the slice, so the destination of a run is contiguous.
      for (uint64_t t = 0; t < tokens; t += max_tokens)
        out.push_back({s0 + t * link.src_row_bytes, d0 + t * link.row.length,
                       std::min(max_tokens, tokens - t)});
    }
}

void expand_pack_job(const link_plan& link, const pack_job& job, uint64_t staging,
                     std::vector<planned_copy>& copies, std::vector<planned_write>& writes) {
  const uint64_t len = link.row.length;
  for (uint64_t t = 0; t < job.tokens; ++t)
    copies.push_back({space::kv, space::staging, job.src_offset + t * link.src_row_bytes,
                      staging + t * len, len});
  writes.push_back({space::staging, space::kv, staging, job.dst_offset, job.tokens * len});
}

void plan_kv_chunk(const link_plan& link, const node_layout& src, const node_layout& dst,
                   std::span<const page_run> runs, const staging_use& staging,
                   std::vector<planned_copy>& pack, std::vector<planned_write>& writes,
                   layer_range layers) {
  if (link.kv == kv_mode::none) return;
  const auto& sp = src[pool_kind::kv];
  const auto& dp = dst[pool_kind::kv];
  const uint64_t pt = link.page_tokens, len = link.row.length;
  const bool packed = link.kv == kv_mode::pack && staging.src;
  const bool unpacked = link.kv == kv_mode::unpack && staging.dst;
  uint64_t cursor = staging.src.value_or(0);
  for (const auto& run : runs)
    for (size_t i = 0; i < link.kv_buffers.size(); ++i) {
      const auto& pair = link.kv_buffers[i];
      // A pair keeps its index i when others are left out: it places the pair in staging.
      if (!layers.contains(sp.buffers[pair.src].layer_id)) continue;
      const uint64_t s0 = sp.buffers[pair.src].offset + uint64_t{run.src} * link.src_page_bytes;
      const uint64_t d0 = dp.buffers[pair.dst].offset + uint64_t{run.dst} * link.dst_page_bytes;
      const uint64_t tokens = run.count * pt;
      if (link.kv == kv_mode::whole_pages) {
        writes.push_back({space::kv, space::kv, s0, d0, run.count * link.src_page_bytes});
      } else if (packed) {
        // The decode row is the slice: gather it from every source token, write the run once.
        const pack_job job{s0 + link.row.src, d0, tokens};
        expand_pack_job(link, job, cursor, pack, writes);
        cursor += tokens * len;
      } else if (unpacked) {
        // The source row is the slice: whole source runs land in the room's staging, ordered
        // [buffer pair][position][token], and the decode scatters them on commit.
        const uint64_t at = *staging.dst + ((i * staging.room_pages + run.position) * pt) * len;
        writes.push_back({space::kv, space::staging, s0, at, tokens * len});
      } else {
        for (uint64_t t = 0; t < tokens; ++t)
          writes.push_back({space::kv, space::kv, s0 + t * link.src_row_bytes + link.row.src,
                            d0 + t * link.dst_row_bytes + link.row.dst, len});
      }
    }
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

void plan_aux_link(const link_plan& link, const node_layout& src, const node_layout& dst,
                   uint32_t src_row, uint32_t dst_row, std::vector<planned_write>& out) {
  if (!link.aux) return;
  const auto& s = src[pool_kind::aux].buffers.at(0);
  const auto& d = dst[pool_kind::aux].buffers.at(0);
  out.push_back({space::aux, space::aux, s.offset + uint64_t{src_row} * s.item_bytes,
                 d.offset + uint64_t{dst_row} * d.item_bytes, s.item_bytes});
}

void plan_unpack(const link_plan& link, const node_layout& dst, std::span<const uint32_t> dst_pages,
                 uint64_t staging, std::vector<planned_copy>& out) {
  if (link.kv != kv_mode::unpack) return;
  const auto& dp = dst[pool_kind::kv];
  const uint64_t pt = link.page_tokens, len = link.row.length;
  uint64_t at = staging;
  for (const auto& pair : link.kv_buffers) {
    const uint64_t base = dp.buffers[pair.dst].offset;
    for (uint32_t page : dst_pages) {
      const uint64_t d0 = base + uint64_t{page} * link.dst_page_bytes + link.row.dst;
      for (uint64_t t = 0; t < pt; ++t, at += len)
        out.push_back({space::staging, space::kv, at, d0 + t * link.dst_row_bytes, len});
    }
  }
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
