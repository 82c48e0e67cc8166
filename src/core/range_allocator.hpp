#pragma once
/// First-fit allocator of byte ranges within [0, capacity), for the staging region. Thread-safe:
/// room actors on different workers allocate and free concurrently. Allocations are rounded up
/// to `align` (64 B: a cache line, and what RDMA NICs like for DMA).

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace ferry {

class range_allocator {
 public:
  explicit range_allocator(uint64_t capacity = 0, uint64_t align = 64) : align_(align) {
    if (capacity) free_.emplace(0, capacity);
    capacity_ = capacity;
  }

  /// Offset of `bytes` free bytes, or nullopt when no free range is large enough.
  std::optional<uint64_t> allocate(uint64_t bytes) {
    if (bytes == 0) return std::nullopt;
    bytes = (bytes + align_ - 1) / align_ * align_;
    std::lock_guard lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < bytes) continue;
      const uint64_t at = it->first, left = it->second - bytes;
      free_.erase(it);
      if (left) free_.emplace(at + bytes, left);
      used_.emplace(at, bytes);
      in_use_ += bytes;
      return at;
    }
    return std::nullopt;
  }

  /// Return a range from `allocate`; unknown offsets are ignored (returns false).
  bool release(uint64_t offset) {
    std::lock_guard lock(mutex_);
    auto u = used_.find(offset);
    if (u == used_.end()) return false;
    uint64_t at = offset, len = u->second;
    used_.erase(u);
    in_use_ -= len;
    auto next = free_.lower_bound(at);
    if (next != free_.end() && at + len == next->first) {
      len += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += len;
        return true;
      }
    }
    free_.emplace(at, len);
    return true;
  }

  uint64_t capacity() const { return capacity_; }
  uint64_t in_use() const {
    std::lock_guard lock(mutex_);
    return in_use_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, uint64_t> free_;  // offset -> length, coalesced
  std::map<uint64_t, uint64_t> used_;  // offset -> length
  uint64_t capacity_ = 0, in_use_ = 0, align_;
};

}  // namespace ferry
