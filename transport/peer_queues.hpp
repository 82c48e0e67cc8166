#pragma once
/// Per-peer posting queues: items (write batches) wait FIFO per peer, and peers take turns one
/// write at a time. Within a peer, FIFO keeps commit latency low for equal rooms (the first room
/// finishes first); across peers, turns keep one large transfer to one decode from starving the
/// others. Pure data structure, used only by the progress thread.

#include <cstdint>
#include <deque>
#include <unordered_map>
#include <vector>

namespace ferry::transport {

template <class T>
class peer_queues {
 public:
  /// Queue `item` behind the peer's earlier items; a peer with no items joins the turn order last.
  void push(uint64_t peer, T item) {
    auto& q = queues_[peer];
    if (q.empty()) order_.push_back(peer);
    q.push_back(std::move(item));
  }
  bool empty() const { return order_.empty(); }
  /// Front item of the peer whose turn it is. Precondition: !empty().
  T& front() { return queues_.at(order_.front()).front(); }
  /// Remove the current peer's front item; the peer keeps its turn for its next item.
  void pop_front() {
    const auto peer = order_.front();
    auto& q = queues_.at(peer);
    q.pop_front();
    if (q.empty()) {
      queues_.erase(peer);
      order_.pop_front();
    }
  }
  /// The current peer has had its write; the next peer's turn.
  void next_turn() {
    if (order_.size() < 2) return;
    order_.push_back(order_.front());
    order_.pop_front();
  }
  /// Visit every queued item (any order).
  template <class F>
  void for_each(F&& f) {
    for (auto& [peer, q] : queues_)
      for (auto& x : q) f(x);
  }
  /// Drop the items matching `pred`; peers left without items leave the turn order.
  template <class Pred>
  void erase_if(Pred&& pred) {
    for (auto it = queues_.begin(); it != queues_.end();) {
      std::erase_if(it->second, pred);
      if (it->second.empty()) {
        std::erase(order_, it->first);
        it = queues_.erase(it);
      } else {
        ++it;
      }
    }
  }
  /// Remove and return every item.
  std::vector<T> take_all() {
    std::vector<T> out;
    for (auto& [peer, q] : queues_) out.insert(out.end(), q.begin(), q.end());
    queues_.clear();
    order_.clear();
    return out;
  }

 private:
  std::unordered_map<uint64_t, std::deque<T>> queues_;
  std::deque<uint64_t> order_;  // peers with items, in turn order (front: whose turn it is)
};

}  // namespace ferry::transport
