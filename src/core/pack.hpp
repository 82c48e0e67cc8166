#pragma once
/// Packing KV through staging: how one chunk of one link goes, decided from sizes. Pure
/// functions of a link plan, the two layouts and the page lists; no I/O. docs/geometry.md §6.2
/// and docs/performance.md §2 explain the rule and the measurements behind its default.
///
/// The cost model: every write costs the fabric about the same on top of its bytes (posting,
/// completion, on tcp a marker; ~5 µs here), every copied byte costs a memcpy. `threshold`
/// (`fabric.pack_threshold_bytes`) says how many bytes of copying one write is worth.
///
/// - Prefill (`plan_kv`, per chunk, knowing both page lists): the chunk is cut into runs
///   contiguous on both sides; the destination is the decode's pages or, when the decode asked
///   for it, its landing block in staging, which is contiguous by position. A run of at least
///   `threshold` bytes per KV buffer goes as one write. Consecutive smaller runs whose
///   destinations follow each other form a group; a group of k runs and B bytes per buffer is
///   gathered into the prefill's staging and written once per slice when the writes it saves
///   cost more than its copies: (k - slices) × threshold > B. Head-sliced KV (kv_mode::pack)
///   is always gathered: its source is strided, one write per token otherwise.
/// - Decode (`plan_landing`, at prepare, knowing only its own page list): whole pages or packed
///   slices land in one staging block for the room and are scattered into the pages on commit
///   when its list has R runs of consecutive pages over P pages and (R - 1) × threshold >
///   P × page bytes, and the block is at most half the staging area (so one room cannot hold it
///   all). Head-sliced KV that the decode unpacks (kv_mode::unpack) always lands in staging.
///
/// Both sides decide alone: a fragmented source with contiguous destination pages costs one
/// copy (the prefill's gather), a fragmented destination one copy at the decode (and the
/// prefill then sees a contiguous destination), both fragmented a copy on each side.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "core/layout.hpp"
#include "core/plan.hpp"

namespace ferry {

/// Bytes to copy into staging and write as one: `pieces` pieces of `piece_bytes`, the first at
/// `src_offset` in the source kv space and each next one `src_stride` further, packed one after
/// the other, go to `dst_offset` in the decode's `dst` space (its pages, or its landing block).
struct pack_job {
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t pieces = 0;
  uint64_t piece_bytes = 0;
  uint64_t src_stride = 0;
  space dst = space::kv;
  uint64_t bytes() const { return pieces * piece_bytes; }
  bool operator==(const pack_job&) const = default;
};

/// What one chunk of one link may use.
struct kv_options {
  /// The link's landing block in the decode's staging (peer_prepare::dst_staging), laid out
  /// [kv buffer pair][page position][page_tokens × row slice] over `room_pages` positions.
  std::optional<uint64_t> dst_staging;
  uint32_t room_pages = 0;
  /// Most bytes of prefill staging one packed batch uses (0: the prefill has no staging).
  uint64_t slice_bytes = 0;
  /// `fabric.pack_threshold_bytes`: a write is worth this many bytes of copying (0: runs are
  /// never gathered; head-sliced KV still is).
  uint64_t threshold = 0;
  /// The global layers this send carries (a layer-wise send); the KV buffer pairs of other
  /// layers are left out, each pair keeping its place in the landing block.
  layer_range layers;
};

/// What the planner decided for one chunk of one link, and from what (for logs and tests).
struct kv_decision {
  kv_mode mode = kv_mode::none;
  bool dst_staged = false;     ///< lands in the decode's staging
  bool per_token = false;      ///< sliced KV without the staging it needs: one write per token
  uint64_t runs = 0;           ///< runs contiguous on both sides
  uint64_t buffers = 0;        ///< KV buffer pairs, each with the same runs
  uint64_t bytes = 0;          ///< KV bytes of the chunk, every buffer
  uint64_t packed_runs = 0;    ///< runs gathered through staging
  uint64_t packed_bytes = 0;   ///< bytes copied into staging, every buffer
  uint64_t packed_writes = 0;  ///< writes the gathered bytes make (before pieces)
  uint64_t direct_writes = 0;  ///< writes straight from the pages (before pieces)
  uint64_t threshold = 0;
  /// One line, e.g. "whole-pages to the decode's staging: 2049 runs of 2.0 KiB per buffer on
  /// average; 2049 gathered through staging (96.0 MiB copied) into 24 writes, 0 direct
  /// (threshold 65536 B; one write per run would be 49176)".
  std::string describe() const;
};

/// A chunk's KV for one link: writes that go now, and jobs that wait for prefill staging.
struct kv_plan {
  std::vector<planned_write> writes;
  std::vector<pack_job> jobs;  ///< in order; each at most `slice_bytes`
  kv_decision decision;
};

/// Plan the KV of the runs of one chunk (coalesce_runs over its source and destination pages).
kv_plan plan_kv(const link_plan& link, const node_layout& src, const node_layout& dst,
                std::span<const page_run> runs, const kv_options& options);

/// The copies into staging at `at` and the writes of `jobs`, packed one after the other in
/// order; a write whose destination and staging both follow the previous write's is merged
/// into it, so the runs of one destination range leave as one write.
/// The copies go one per job, strided over its pieces.
void expand_pack_jobs(std::span<const pack_job> jobs, uint64_t at,
                      std::vector<strided_copy>& copies, std::vector<planned_write>& writes);
/// The same with the copies one by one (what the strided ones expand to).
void expand_pack_jobs(std::span<const pack_job> jobs, uint64_t at,
                      std::vector<planned_copy>& copies, std::vector<planned_write>& writes);

/// The decode's choice for one link at prepare.
struct landing_plan {
  uint64_t bytes = 0;    ///< staging the link's KV lands in (0: straight into the pages)
  bool scatter = false;  ///< whole pages or packed slices, scattered on commit
  uint64_t runs = 0;     ///< runs of consecutive pages in the decode's list
  uint64_t pages = 0;
  uint64_t page_bytes = 0;  ///< bytes of one page of one KV buffer that land
  /// e.g. "2050 runs over 4096 pages (2.0 KiB per buffer on average): lands in 96.0 MiB of
  /// staging and is scattered on commit".
  std::string describe() const;
};

/// Decode side: whether the KV of `link` for a room of `dst_pages` lands in staging (see the
/// header comment). `capacity` is fabric.staging_bytes.
landing_plan plan_landing(const link_plan& link, std::span<const uint32_t> dst_pages,
                          uint64_t threshold, uint64_t capacity);

/// Decode side, once every write of the link has landed: the copies from its landing block at
/// `staging` into the pages `dst_pages`: for kv_mode::unpack one row slice per token, as one
/// strided copy per KV buffer and run of pages whose rows follow at one stride; otherwise one
/// copy per run of consecutive pages and buffer.
void plan_unpack(const link_plan& link, const node_layout& dst, std::span<const uint32_t> dst_pages,
                 uint64_t staging, std::vector<strided_copy>& out);
/// The same copies one by one (what the strided ones expand to).
void plan_unpack(const link_plan& link, const node_layout& dst, std::span<const uint32_t> dst_pages,
                 uint64_t staging, std::vector<planned_copy>& out);

}  // namespace ferry
