#include "core/pack.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ferry {
namespace {

std::string size_text(double b) {
  if (b < 1024) return fmt::format("{:.0f} B", b);
  if (b < 1024.0 * 1024) return fmt::format("{:.1f} KiB", b / 1024);
  return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
}

uint64_t ceil_div(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

}  // namespace

std::string kv_decision::describe() const {
  const std::string where = dst_staged ? "to the decode's staging" : "to the decode's pages";
  if (per_token)
    return fmt::format("{} {}: {} runs, one write per token and buffer ({} writes; no staging)",
                       to_string(mode), where, runs, direct_writes);
  return fmt::format(
      "{} {}: {} runs of {} per buffer on average; {} gathered through staging ({} copied) into "
      "{} writes, {} direct (threshold {} B; one write per run would be {})",
      to_string(mode), where, runs,
      size_text(runs && buffers ? double(bytes) / double(runs * buffers) : 0.0), packed_runs,
      size_text(double(packed_bytes)), packed_writes, direct_writes, threshold, runs * buffers);
}

kv_plan plan_kv(const link_plan& link, const node_layout& src, const node_layout& dst,
                std::span<const page_run> runs_in, const kv_options& o) {
  kv_plan out;
  auto& d = out.decision;
  d.mode = link.kv;
  d.threshold = o.threshold;
  if (link.kv == kv_mode::none || runs_in.empty()) return out;
  const auto& sp = src[pool_kind::kv];
  const auto& dp = dst[pool_kind::kv];
  const uint64_t pt = link.page_tokens, len = link.row.length, unit = pt * len;
  // The buffer pairs of this send's layers; a pair keeps its index i (its place in staging).
  std::vector<size_t> bufs;
  for (size_t i = 0; i < link.kv_buffers.size(); ++i)
    if (o.layers.contains(sp.buffers[link.kv_buffers[i].src].layer_id)) bufs.push_back(i);
  if (bufs.empty()) return out;
  const size_t buffers = bufs.size();
  const bool staged = o.dst_staging.has_value();
  d.dst_staged = staged;

  // In the landing block every position follows the previous one: runs break only where the
  // source does.
  std::vector<page_run> runs;
  for (const auto& r : runs_in) {
    if (staged && !runs.empty() && runs.back().src + runs.back().count == r.src) {
      runs.back().count += r.count;
      continue;
    }
    runs.push_back(r);
  }
  d.runs = runs.size();
  d.buffers = buffers;
  for (const auto& r : runs) d.bytes += r.count * unit * buffers;

  auto src_at = [&](size_t i, uint32_t page) {
    return sp.buffers[link.kv_buffers[i].src].offset + uint64_t{page} * link.src_page_bytes +
           link.row.src;
  };
  // Whole pages and packed slices fill the decode row (row.dst is 0); unpacked rows land only
  // in staging.
  auto dst_at = [&](size_t i, const page_run& r) {
    return staged ? *o.dst_staging + (i * o.room_pages + r.position) * unit
                  : dp.buffers[link.kv_buffers[i].dst].offset +
                        uint64_t{r.dst} * link.dst_page_bytes + link.row.dst;
  };
  const space to = staged ? space::staging : space::kv;
  const bool strided = link.kv == kv_mode::pack;

  // Sliced rows without the staging they need: one write per token and buffer.
  if ((link.kv == kv_mode::unpack && !staged) || (strided && o.slice_bytes < len)) {
    d.per_token = true;
    const uint64_t dst_stride = staged ? len : link.dst_row_bytes;
    for (const auto& r : runs)
      for (size_t i : bufs)
        for (uint64_t t = 0; t < r.count * pt; ++t)
          out.writes.push_back({space::kv, to, src_at(i, r.src) + t * link.src_row_bytes,
                                dst_at(i, r) + t * dst_stride, len});
    d.direct_writes = out.writes.size();
    return out;
  }

  // Contiguous sources gather page by page; sliced ones token by token.
  const uint64_t piece = strided ? len : unit;
  const uint64_t stride = strided ? link.src_row_bytes : link.src_page_bytes;
  const uint64_t per_piece = strided ? pt : 1;  // pieces per page
  const bool can_gather = o.slice_bytes >= piece && (strided || o.threshold > 0);
  auto small = [&](const page_run& r) {
    return can_gather && (strided || r.count * unit < o.threshold);
  };
  auto direct = [&](const page_run& r) {
    for (size_t i : bufs)
      out.writes.push_back({space::kv, to, src_at(i, r.src), dst_at(i, r), r.count * unit});
    d.direct_writes += buffers;
  };
  const uint64_t max_pieces = can_gather ? std::max<uint64_t>(o.slice_bytes / piece, 1) : 1;

  for (size_t a = 0; a < runs.size();) {
    if (!small(runs[a])) {
      direct(runs[a++]);
      continue;
    }
    // A group: consecutive small runs whose destinations follow each other.
    size_t b = a + 1;
    uint64_t group_bytes = runs[a].count * unit;
    while (b < runs.size() && small(runs[b]) &&
           (staged || runs[b].dst == runs[b - 1].dst + runs[b - 1].count)) {
      group_bytes += runs[b].count * unit;
      ++b;
    }
    const uint64_t k = b - a, slices = ceil_div(group_bytes, o.slice_bytes);
    if (!strided && !(k > slices && (k - slices) * o.threshold > group_bytes)) {
      for (; a < b; ++a) direct(runs[a]);
      continue;
    }
    // Buffer by buffer, so the jobs of one destination range follow each other and merge.
    for (size_t i : bufs)
      for (size_t r = a; r < b; ++r) {
        const uint64_t pieces = runs[r].count * per_piece;
        for (uint64_t p = 0; p < pieces; p += max_pieces)
          out.jobs.push_back({src_at(i, runs[r].src) + p * stride, dst_at(i, runs[r]) + p * piece,
                              std::min(max_pieces, pieces - p), piece, stride, to});
      }
    d.packed_runs += k;
    d.packed_bytes += group_bytes * buffers;
    d.packed_writes += slices * buffers;
    a = b;
  }
  return out;
}

void expand_pack_jobs(std::span<const pack_job> jobs, uint64_t at,
                      std::vector<planned_copy>& copies, std::vector<planned_write>& writes) {
  std::vector<strided_copy> strided;
  expand_pack_jobs(jobs, at, strided, writes);
  for (const auto& c : strided)
    for (uint64_t i = 0; i < c.count; ++i) copies.push_back(c.at(i));
}

void expand_pack_jobs(std::span<const pack_job> jobs, uint64_t at,
                      std::vector<strided_copy>& copies, std::vector<planned_write>& writes) {
  for (const auto& j : jobs) {
    const uint64_t n = j.bytes();
    if (j.src_stride == j.piece_bytes || j.pieces == 1)
      copies.push_back({space::kv, space::staging, j.src_offset, at, n, 1, n, n});
    else
      copies.push_back({space::kv, space::staging, j.src_offset, at, j.piece_bytes, j.pieces,
                        j.src_stride, j.piece_bytes});
    if (!writes.empty()) {
      auto& w = writes.back();
      if (w.src == space::staging && w.dst == j.dst && w.src_offset + w.length == at &&
          w.dst_offset + w.length == j.dst_offset) {
        w.length += n;
        at += n;
        continue;
      }
    }
    writes.push_back({space::staging, j.dst, at, j.dst_offset, n});
    at += n;
  }
}

std::string landing_plan::describe() const {
  return fmt::format("{} runs over {} pages ({} per buffer on average): {}", runs, pages,
                     size_text(runs ? double(pages * page_bytes) / runs : 0.0),
                     bytes ? fmt::format("lands in {} of staging{}", size_text(double(bytes)),
                                         scatter ? " and is scattered on commit" : "")
                           : "lands in the pages");
}

landing_plan plan_landing(const link_plan& link, std::span<const uint32_t> dst_pages,
                          uint64_t threshold, uint64_t capacity) {
  landing_plan out;
  out.pages = dst_pages.size();
  out.page_bytes = uint64_t{link.page_tokens} * link.row.length;
  for (size_t i = 0; i < dst_pages.size(); ++i)
    if (i == 0 || dst_pages[i] != dst_pages[i - 1] + 1) ++out.runs;
  if (link.kv == kv_mode::unpack) {
    out.bytes = link.landing_bytes(dst_pages.size());
    return out;
  }
  if (link.kv == kv_mode::none || threshold == 0 || out.runs < 2) return out;
  const uint64_t bytes = link.landing_bytes(dst_pages.size());
  // Saved: all but one write per run and buffer (the prefill then writes one range); cost: one
  // copy of every byte on commit.
  if ((out.runs - 1) * threshold > out.pages * out.page_bytes && bytes <= capacity / 2) {
    out.bytes = bytes;
    out.scatter = true;
  }
  return out;
}

void plan_unpack(const link_plan& link, const node_layout& dst, std::span<const uint32_t> dst_pages,
                 uint64_t staging, std::vector<strided_copy>& out) {
  if (link.kv == kv_mode::none) return;
  const auto& dp = dst[pool_kind::kv];
  const uint64_t pt = link.page_tokens, len = link.row.length, unit = pt * len;
  uint64_t at = staging;
  auto add = [&](const strided_copy& c) {
    if (!out.empty() && out.back().extends(c))
      ++out.back().count;
    else
      out.push_back(c);
  };
  for (const auto& pair : link.kv_buffers) {
    const uint64_t base = dp.buffers[pair.dst].offset;
    if (link.kv != kv_mode::unpack) {
      // Whole decode rows: one copy per run of consecutive pages.
      for (size_t a = 0; a < dst_pages.size();) {
        size_t b = a + 1;
        while (b < dst_pages.size() && dst_pages[b] == dst_pages[b - 1] + 1) ++b;
        const uint64_t n = (b - a) * unit;
        out.push_back({space::staging, space::kv, at,
                       base + uint64_t{dst_pages[a]} * link.dst_page_bytes, n, 1, n, n});
        at += n;
        a = b;
      }
      continue;
    }
    // Row slices: packed one after the other in staging, a row apart in the pages.
    for (uint32_t page : dst_pages) {
      const uint64_t d0 = base + uint64_t{page} * link.dst_page_bytes + link.row.dst;
      for (uint64_t t = 0; t < pt; ++t, at += len)
        add({space::staging, space::kv, at, d0 + t * link.dst_row_bytes, len, 1, len,
             link.dst_row_bytes});
    }
  }
}

void plan_unpack(const link_plan& link, const node_layout& dst, std::span<const uint32_t> dst_pages,
                 uint64_t staging, std::vector<planned_copy>& out) {
  std::vector<strided_copy> strided;
  plan_unpack(link, dst, dst_pages, staging, strided);
  for (const auto& c : strided)
    for (uint64_t i = 0; i < c.count; ++i) out.push_back(c.at(i));
}

}  // namespace ferry
