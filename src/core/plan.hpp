#pragma once
/// Transfer planning: which byte ranges of the prefill pools go where in the decode pools.
/// Pure functions of a link plan (core/geometry.hpp), the two layouts and the page/slot/row
/// indices; no I/O.
///
/// - KV: source and destination page lists are paired by position and split into runs where
///   *both* sides step by one. Per run and KV buffer pair: one write of whole pages (same heads),
///   or, under a TP mismatch, one packed write (pack at the source) or one write into the
///   decode's staging (unpack at the destination); without staging, one write per token. Small
///   runs may be gathered through staging on either side (core/pack.hpp).
/// - State: one (source slot, destination slot) pair; per (tensor, layer) buffer pair one write
///   per segment of the link (one segment at equal TP). A paged state pool (swa, dsa,
///   minimax_index_k) pairs its own page lists by position, in runs like KV.
/// - Aux: one (source row, destination row) pair; one write, from one prefill rank.
/// Any write longer than `piece_bytes` is split into pieces so many can be in flight.
/// A `layer_range` (core/layer_ranges.hpp) restricts the KV and state writes to the buffers of
/// those global layer ids, keeping each buffer pair's place (its staging offset) as in a whole
/// plan, so a room sent layer by layer moves exactly the bytes of a room sent whole.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "core/layer_ranges.hpp"
#include "core/layout.hpp"

namespace ferry {

/// A run of `count` pages, contiguous on both sides; `position` is the index of its first page
/// in the decode's page list of the room.
struct page_run {
  uint32_t src = 0;
  uint32_t dst = 0;
  uint32_t count = 0;
  uint32_t position = 0;
  bool operator==(const page_run&) const = default;
};

/// Split position-paired page lists into maximal runs contiguous on both sides; `first_position`
/// is the position of src[0] in the room. Precondition: src.size() == dst.size().
/// Example: src [10,11,12,40,41], dst [7,8,9,10,11] gives {10→7 ×3 @0}, {40→10 ×2 @3}.
std::vector<page_run> coalesce_runs(std::span<const uint32_t> src, std::span<const uint32_t> dst,
                                    uint32_t first_position = 0);

/// Memory a planned operation addresses; offsets are relative to the space's base. `staging` is
/// the daemon's registered bounce region.
enum class space : uint8_t { kv = 0, state = 1, aux = 2, staging = 3 };
inline constexpr int space_count = 4;
const char* to_string(space s);

/// One RMA write from prefill memory to decode memory.
struct planned_write {
  space src = space::kv;
  space dst = space::kv;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  bool operator==(const planned_write&) const = default;
};

/// One local copy within a daemon (packing at the prefill, unpacking at the decode).
struct planned_copy {
  space from = space::kv;
  space to = space::staging;
  uint64_t from_offset = 0;
  uint64_t to_offset = 0;
  uint64_t length = 0;
  bool operator==(const planned_copy&) const = default;
};

/// `count` local copies of `length` bytes at regular strides: the i-th from
/// from_offset + i x from_stride to to_offset + i x to_stride. A decode unpacks a run of
/// head-sliced rows (one per token) as one of these, not as one planned_copy per row: 72 MiB of
/// 128-byte rows would otherwise be a 19 MB list built and freed per room.
struct strided_copy {
  space from = space::staging;
  space to = space::kv;
  uint64_t from_offset = 0;
  uint64_t to_offset = 0;
  uint64_t length = 0;
  uint64_t count = 1;
  uint64_t from_stride = 0;
  uint64_t to_stride = 0;
  uint64_t bytes() const { return length * count; }
  /// Copy i as a planned_copy.
  planned_copy at(uint64_t i) const {
    return {from, to, from_offset + i * from_stride, to_offset + i * to_stride, length};
  }
  /// Whether `c`, one copy, is this one's next: then count grows by one instead of a new entry.
  bool extends(const strided_copy& c) const {
    return c.count == 1 && c.from == from && c.to == to && c.length == length &&
           c.from_offset == from_offset + count * from_stride &&
           c.to_offset == to_offset + count * to_stride;
  }
  bool operator==(const strided_copy&) const = default;
};

/// Staging a chunk may use: `src` is where packed bytes go at the prefill (kv_mode::pack);
/// `dst` is this link's staging range in the room at the decode (kv_mode::unpack; each link of
/// a gathering room has its own), laid out [kv buffer pair][page position][token][row slice]
/// over `room_pages` positions. nullopt: no staging, so a sliced row goes out as one write per
/// token.
struct staging_use {
  std::optional<uint64_t> src;
  std::optional<uint64_t> dst;
  uint32_t room_pages = 0;
};

/// Source staging bytes packing these runs needs (0 unless the link packs).
uint64_t pack_bytes(const link_plan& link, std::span<const page_run> runs);

/// Plan the KV of a chunk all at once: local copies to do first (packing head-sliced KV into
/// unbounded staging at `staging.src`), then the writes; the landing block `staging.dst` is used
/// for kv_mode::unpack only, and runs are never gathered (the direct plan: one write per run).
/// The Sender plans with `plan_kv` (core/pack.hpp), which also gathers small runs.
void plan_kv_chunk(const link_plan& link, const node_layout& src, const node_layout& dst,
                   std::span<const page_run> runs, const staging_use& staging,
                   std::vector<planned_copy>& pack, std::vector<planned_write>& writes,
                   layer_range layers = {});
/// Append the writes of the single state slot pair (one per segment per buffer pair).
void plan_state_link(const link_plan& link, const node_layout& src, const node_layout& dst,
                     uint32_t src_slot, uint32_t dst_slot, std::vector<planned_write>& out,
                     layer_range layers = {});
/// Append the writes of a paged state pool's pages (swa, dsa, minimax_index_k), paired by
/// position: per run of pages contiguous on both sides and buffer pair, one write when the
/// link moves whole items, else one per page and segment. Precondition: equal list lengths.
void plan_state_pages(const link_plan& link, const node_layout& src, const node_layout& dst,
                      std::span<const uint32_t> src_pages, std::span<const uint32_t> dst_pages,
                      std::vector<planned_write>& out, layer_range layers = {});
/// Append the aux row write when the link carries aux.
void plan_aux_link(const link_plan& link, const node_layout& src, const node_layout& dst,
                   uint32_t src_row, uint32_t dst_row, std::vector<planned_write>& out);
/// Split every write longer than `piece_bytes` into consecutive pieces (in place, order kept).
void split_pieces(std::vector<planned_write>& writes, uint64_t piece_bytes);

/// Bounds and uniqueness check of indices into a pool; the error names `what`, the first bad
/// index, its position and the pool size, e.g. "dst page 9000 (position 3) is outside the kv pool
/// of 8192 pages", or an index named twice: "dst page 400 is named twice (positions 0 and 1)"
/// (`errc::invalid_request`).
result<> check_indices(std::span<const uint32_t> indices, uint64_t limit, const char* what,
                       const char* unit);

/// Maps the chunks of a room onto the decode's destination page list by position.
class chunk_cursor {
 public:
  explicit chunk_cursor(uint32_t dst_pages = 0) : dst_pages_(dst_pages) {}
  /// Reserve positions for a chunk of `n` pages; returns the first position, or an error when
  /// the chunk overruns the list, a last chunk leaves pages unfilled, or the last chunk was
  /// already sent (`errc::invalid_request`).
  result<uint32_t> take(uint32_t n, bool last);
  uint32_t position() const { return position_; }
  bool finished() const { return finished_; }

 private:
  uint32_t dst_pages_;
  uint32_t position_ = 0;
  bool finished_ = false;
};

/// Decode-side commit rule: Success only when the sender's announced total equals the number of
/// writes counted as landed (remote CQ data), in whichever order the two arrive.
class commit_counter {
 public:
  enum class state { pending, complete, overflow };
  state add_landed(uint64_t n) {
    landed_ += n;
    return evaluate();
  }
  state announce(uint64_t total) {
    expected_ = total;
    return evaluate();
  }
  uint64_t landed() const { return landed_; }
  std::optional<uint64_t> expected() const { return expected_; }

 private:
  state evaluate() const {
    if (expected_ && landed_ > *expected_) return state::overflow;
    if (expected_ && landed_ == *expected_) return state::complete;
    return state::pending;
  }
  std::optional<uint64_t> expected_;
  uint64_t landed_ = 0;
};

}  // namespace ferry
