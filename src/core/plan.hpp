#pragma once
/// Transfer planning: which byte ranges of the prefill pools go where in the decode pools.
/// Pure functions of the two layouts and the page/slot/row indices; no I/O.
///
/// Equal-TP rules (this release):
/// - KV: source and destination page lists are paired by position and split into runs where
///   *both* sides step by one; each run becomes one write per layer buffer.
/// - State: one (source slot, destination slot) pair; one write per (tensor, layer) buffer.
/// - Aux: one (source row, destination row) pair; one write.
/// Any write longer than `piece_bytes` is split into pieces so many can be in flight.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/layout.hpp"

namespace ferry {

/// A run of `count` pages, contiguous on both sides.
struct page_run {
  uint32_t src = 0;
  uint32_t dst = 0;
  uint32_t count = 0;
  bool operator==(const page_run&) const = default;
};

/// Split position-paired page lists into maximal runs contiguous on both sides.
/// Precondition: src.size() == dst.size(). Example: src [10,11,12,40,41], dst [7,8,9,10,11]
/// gives {10→7 ×3}, {40→10 ×2}.
std::vector<page_run> coalesce_runs(std::span<const uint32_t> src, std::span<const uint32_t> dst);

/// One planned write: offsets are relative to the source and destination pool bases.
struct planned_write {
  pool_kind pool = pool_kind::kv;
  uint64_t src_offset = 0;
  uint64_t dst_offset = 0;
  uint64_t length = 0;
  bool operator==(const planned_write&) const = default;
};

/// Append one write per run per KV layer buffer.
void plan_kv(const pool_layout& src, const pool_layout& dst, std::span<const page_run> runs,
             std::vector<planned_write>& out);
/// Append one write per state buffer (tensor × layer) for the single slot pair.
void plan_state(const pool_layout& src, const pool_layout& dst, uint32_t src_slot,
                uint32_t dst_slot, std::vector<planned_write>& out);
/// Append the aux row write.
void plan_aux(const pool_layout& src, const pool_layout& dst, uint32_t src_row, uint32_t dst_row,
              std::vector<planned_write>& out);
/// Split every write longer than `piece_bytes` into consecutive pieces (in place, order kept).
void split_pieces(std::vector<planned_write>& writes, uint64_t piece_bytes);

/// Bounds check of indices into a pool; the error names `what`, the first bad index, its
/// position and the pool size, e.g. "dst page 9000 (position 3) is outside the kv pool of 8192
/// pages".
std::optional<std::string> check_indices(std::span<const uint32_t> indices, uint64_t limit,
                                         const char* what, const char* unit);

/// Maps the chunks of a room onto the decode's destination page list by position.
class chunk_cursor {
 public:
  explicit chunk_cursor(uint32_t dst_pages = 0) : dst_pages_(dst_pages) {}
  /// Reserve positions for a chunk of `n` pages; returns the first position, or an error when
  /// the chunk overruns the list, a last chunk leaves pages unfilled, or the last chunk was
  /// already sent.
  std::optional<std::string> take(uint32_t n, bool last, uint32_t& first_position);
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
