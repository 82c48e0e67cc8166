#pragma once
/// Who waits for bytes of a shared area (the staging area, actors/context.hpp), in arrival order.
/// A release wakes only the waiters at the front whose needs fit in the bytes now free together,
/// not every waiter: with W rooms waiting, waking all of them at each release cost W messages and
/// W retries per release, so O(W^2) for W rooms to get through (10 000 rooms held on a decode
/// whose KV lands sliced all wait for staging).
///
/// No wake-up is lost: a woken waiter either comes back (waits again, at the back, or is served)
/// or leaves (it ended); `leave` then says whether it had been woken and not come back, and the
/// caller wakes again on its behalf. A waiter whose need is larger than what is free is not
/// woken; the ones behind it wait too (first come, first served, so a large need is not starved
/// by small ones); every release wakes again.
///
/// Pure and single-threaded (the staging area locks around it); every operation is O(1)
/// amortized, a wake O(woken + skipped stale places).

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ferry {

template <class Id>
class waiter_queue {
 public:
  /// `id` waits for `need` bytes. If it was woken, it came back: it waits again at the back. If
  /// it is waiting already, its place is kept and its need updated.
  void wait(Id id, uint64_t need) {
    woken_.erase(id);
    if (auto it = waiting_.find(id); it != waiting_.end()) {
      it->second.need = need;
      return;
    }
    waiting_.emplace(id, entry{need, next_});
    order_.emplace_back(id, next_++);
  }
  /// `id` got its bytes: neither waiting nor woken any more.
  void served(Id id) {
    woken_.erase(id);
    forget(id);
  }
  /// `id` ended: forgotten. True when it had been woken and had not come back, so its turn
  /// passes on: the caller calls `wake` again.
  bool leave(Id id) {
    const bool was_woken = woken_.erase(id) > 0;
    forget(id);
    return was_woken;
  }
  /// With `free` bytes free: the waiters to wake, front first, as many as fit in `free`
  /// together. They are no longer waiting but woken, until they come back or leave.
  std::vector<Id> wake(uint64_t free) {
    std::vector<Id> out;
    uint64_t sum = 0;
    while (!order_.empty()) {
      const auto [id, seq] = order_.front();
      auto it = waiting_.find(id);
      if (it == waiting_.end() || it->second.seq != seq) {  // a place left behind
        order_.pop_front();
        continue;
      }
      if (sum + it->second.need > free) break;
      sum += it->second.need;
      out.push_back(id);
      woken_.insert(id);
      waiting_.erase(it);
      order_.pop_front();
    }
    return out;
  }
  size_t waiting() const { return waiting_.size(); }
  size_t woken() const { return woken_.size(); }
  bool is_waiting(Id id) const { return waiting_.count(id) != 0; }
  /// Places kept in the arrival order (live and stale), for tests: bounded by the live ones.
  size_t places() const { return order_.size(); }

 private:
  struct entry {
    uint64_t need;
    uint64_t seq;  ///< its place in `order_`
  };
  void forget(Id id) {
    waiting_.erase(id);
    // Places of waiters that left stay behind until the front reaches them; compact before they
    // outnumber the live ones, so memory is bounded by the waiters, whatever the churn.
    if (order_.size() > 2 * waiting_.size() + 64) {
      std::deque<std::pair<Id, uint64_t>> kept;
      for (const auto& p : order_)
        if (auto it = waiting_.find(p.first); it != waiting_.end() && it->second.seq == p.second)
          kept.push_back(p);
      order_.swap(kept);
    }
  }

  std::unordered_map<Id, entry> waiting_;
  std::deque<std::pair<Id, uint64_t>> order_;  ///< (id, seq), front first
  std::unordered_set<Id> woken_;
  uint64_t next_ = 0;
};

}  // namespace ferry
