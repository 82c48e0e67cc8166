#pragma once
/// The pure parts of ferry-bench's open loop (open_loop.cpp), tested without daemons
/// (tests/tools/test_open_loop_plan.cpp): the size mix, the Poisson arrivals, and the allocators
/// that hand out and take back pool pages, state slots and aux rows so that rooms of different
/// sizes coexist in the pools.
///
/// Not thread-safe; no I/O.

#include <cstdint>
#include <map>
#include <optional>
#include <random>
#include <string_view>
#include <vector>

#include "core/errors.hpp"

namespace ferry::bench {

/// One size of the mix: rooms of `tokens` tokens make up `fraction` of the arrivals.
struct mix_class {
  uint32_t tokens = 0;
  double fraction = 0;
};

/// Parse `TOKENS:FRACTION[,TOKENS:FRACTION...]`, e.g. `16:0.90,4096:0.09,32768:0.01`: token
/// counts positive integers, each once; fractions in (0, 1] summing to 1 (within 1e-6). The
/// error names the entry and what was wrong (invalid_request).
result<std::vector<mix_class>> parse_mix(std::string_view text);

/// Poisson arrivals at `rate` per second, each of a class drawn by the mix's fractions; the
/// same seed gives the same sequence.
class arrival_schedule {
 public:
  arrival_schedule(double rate, const std::vector<mix_class>& mix, uint64_t seed);
  struct arrival {
    double at_s = 0;   ///< seconds since the schedule's start
    size_t klass = 0;  ///< index into the mix
  };
  /// The next arrival (times grow strictly).
  arrival next();

 private:
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
  std::uniform_real_distribution<double> pick_{0.0, 1.0};
  std::vector<double> cumulative_;
  double now_s_ = 0;
};

/// Pages [first, first + count) of a pool, handed out and taken back. `allocate` takes the first
/// free run long enough (first fit), and when no run is, the free pages in address order, as an
/// engine's allocator would hand a fragmented list; `release` merges freed runs with their
/// neighbours.
class page_allocator {
 public:
  page_allocator(uint32_t first, uint32_t count);
  /// `n` pages in the order they are to be used, or nothing when fewer than `n` are free.
  /// `fragmented` (if given) says whether they are more than one run.
  std::optional<std::vector<uint32_t>> allocate(uint32_t n, bool* fragmented = nullptr);
  /// Give pages back; false (and nothing changed) when one is outside the pool or already free.
  bool release(const std::vector<uint32_t>& pages);
  uint64_t free_pages() const { return free_; }
  /// Free runs (1 when nothing is allocated and the pool is not empty).
  size_t free_runs() const { return runs_.size(); }

 private:
  uint32_t first_, count_;
  uint64_t free_ = 0;
  std::map<uint32_t, uint32_t> runs_;  ///< free runs: start -> length
};

/// Indices 0..count-1 (state slots with their aux rows), lowest first.
class index_allocator {
 public:
  explicit index_allocator(uint32_t count);
  std::optional<uint32_t> take();
  /// False when `i` is out of range or already free.
  bool give(uint32_t i);
  uint32_t free_count() const { return static_cast<uint32_t>(free_.size()); }

 private:
  uint32_t count_;
  std::vector<uint32_t> free_;  ///< kept sorted descending: the lowest is at the back
};

}  // namespace ferry::bench
