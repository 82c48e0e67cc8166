#pragma once
/// Deadlines ordered by due time, each cancellable by the token `arm` returned. A cancelled
/// deadline is gone at once (no tombstone waits for its time to come), so the queue holds only
/// the deadlines that can still fire: a room's few, not one per status it passed through.
/// Not thread-safe (the timer service guards it); pure, so it is tested without threads.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry {

template <class Payload, class Clock = std::chrono::steady_clock>
class deadline_queue {
 public:
  using time_point = typename Clock::time_point;
  using token = uint64_t;  ///< never 0, never reused

  token arm(time_point due, Payload p) {
    const token t = ++last_;
    by_due_.emplace(key{due, t}, std::move(p));
    due_of_.emplace(t, due);
    return t;
  }
  /// False when `t` already fired, was cancelled, or was never armed.
  bool cancel(token t) {
    auto it = due_of_.find(t);
    if (it == due_of_.end()) return false;
    by_due_.erase(key{it->second, t});
    due_of_.erase(it);
    return true;
  }
  /// The earliest due time, if any deadline is armed.
  std::optional<time_point> next_due() const {
    if (by_due_.empty()) return std::nullopt;
    return by_due_.begin()->first.first;
  }
  /// Remove and return every deadline due at or before `now`, earliest first (ties in the order
  /// they were armed).
  std::vector<Payload> take_due(time_point now) {
    std::vector<Payload> out;
    while (!by_due_.empty() && by_due_.begin()->first.first <= now) {
      auto it = by_due_.begin();
      due_of_.erase(it->first.second);
      out.push_back(std::move(it->second));
      by_due_.erase(it);
    }
    return out;
  }
  size_t size() const { return due_of_.size(); }
  bool empty() const { return due_of_.empty(); }
  void clear() {
    by_due_.clear();
    due_of_.clear();
  }

 private:
  using key = std::pair<time_point, token>;
  std::map<key, Payload> by_due_;
  std::unordered_map<token, time_point> due_of_;
  token last_ = 0;
};

}  // namespace ferry
