#pragma once

#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

namespace ferry::soak {

/// Indices (pages, slots, rows, room ids) free for a new room, taken at random. Giving back an
/// index that is not taken is a bug of this program, and aborts it.
class free_list {
 public:
  void reset(uint32_t n) {
    items_.resize(n);
    std::iota(items_.begin(), items_.end(), 0u);
    taken_.assign(n, 0);
  }
  size_t size() const { return items_.size(); }
  size_t capacity() const { return taken_.size(); }
  uint32_t take(std::mt19937_64& rng) {
    const size_t i = rng() % items_.size();
    std::swap(items_[i], items_.back());
    const uint32_t v = items_.back();
    items_.pop_back();
    taken_[v] = 1;
    return v;
  }
  void give(uint32_t v) {
    if (v >= taken_.size() || !taken_[v]) {
      std::cerr << "ferry-soak: internal error: index " << v << " given back twice\n";
      std::abort();
    }
    taken_[v] = 0;
    items_.push_back(v);
  }

 private:
  std::vector<uint32_t> items_;
  std::vector<uint8_t> taken_;
};

}  // namespace ferry::soak
