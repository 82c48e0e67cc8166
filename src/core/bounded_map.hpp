#pragma once
/// A map that remembers at most `limit` keys, forgetting the oldest first: the Scheduler's
/// histories (finished rooms for poll, tokens of ended rooms, rooms polled before they existed)
/// are bounded so a daemon that serves millions of rooms keeps a constant footprint.
///
/// Age is insertion order: assigning to a key already present keeps its place. A key erased and
/// inserted again is as young as its new insertion (the old place in the order is skipped when
/// it comes up, it does not evict the new entry). Memory is bounded by the limit, whatever the
/// mix of insertions and erasures.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <unordered_map>
#include <utility>

namespace ferry {

template <class K, class V>
class bounded_map {
 public:
  explicit bounded_map(size_t limit) : limit_(limit) {}

  /// Insert or assign; true when `k` was not present.
  bool put(const K& k, V v) {
    if (auto it = map_.find(k); it != map_.end()) {
      it->second.value = std::move(v);
      return false;
    }
    map_.emplace(k, slot{std::move(v), next_});
    order_.emplace_back(k, next_++);
    evict();
    return true;
  }
  /// Insert if absent; the value stored for `k` either way.
  V& get_or_put(const K& k, V v) {
    if (auto it = map_.find(k); it != map_.end()) return it->second.value;
    put(k, std::move(v));
    return map_.find(k)->second.value;
  }
  const V* find(const K& k) const {
    auto it = map_.find(k);
    return it == map_.end() ? nullptr : &it->second.value;
  }
  bool contains(const K& k) const { return map_.count(k) != 0; }
  void erase(const K& k) {
    map_.erase(k);
    // Keys erased leave their place behind; compact before those outnumber the live ones.
    if (order_.size() > 2 * map_.size() + 64) compact();
  }
  size_t size() const { return map_.size(); }
  size_t limit() const { return limit_; }
  /// Places kept in the insertion order (live keys and erased ones not compacted yet).
  size_t places() const { return order_.size(); }

 private:
  struct slot {
    V value;
    uint64_t seq;  ///< when this incarnation of the key was inserted
  };
  void evict() {
    while (map_.size() > limit_ && !order_.empty()) {
      auto [k, seq] = order_.front();
      order_.pop_front();
      if (live({k, seq})) map_.erase(k);
    }
  }
  bool live(const std::pair<K, uint64_t>& place) const {
    auto it = map_.find(place.first);
    return it != map_.end() && it->second.seq == place.second;
  }
  void compact() {
    std::deque<std::pair<K, uint64_t>> kept;
    for (auto& p : order_)
      if (live(p)) kept.push_back(std::move(p));
    order_.swap(kept);
  }

  size_t limit_;
  std::unordered_map<K, slot> map_;
  std::deque<std::pair<K, uint64_t>> order_;
  uint64_t next_ = 0;
};

}  // namespace ferry
