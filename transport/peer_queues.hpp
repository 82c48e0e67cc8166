#pragma once
/// Per-peer posting queues. Peers take turns one write at a time, so one large transfer to one
/// decode cannot starve the others. Within a peer the item with the fewest bytes left to post
/// goes first (shortest remaining first): a small room started while large rooms flow to the
/// same peer waits for the bytes already in flight, not for every byte queued before it; equal
/// rooms still finish in the order they came (the earlier one has less left once it started).
/// So that a stream of small items cannot starve a large one, every `oldest_every`-th write of
/// a peer goes to its oldest item. Pure data structure, used only by the progress thread.
///
/// The item chosen for a peer's turn stays its front until the turn ends (`next_turn`), the
/// peer's turn is passed (`skip_peer`) or the item is removed (`pop_front`): a split commit
/// posts a write's data and then its marker from the same item.

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ferry::transport {

/// `Remaining` gives an item's bytes (or any size) left to post: `uint64_t(const T&)`.
template <class T, class Remaining>
class peer_queues {
 public:
  static constexpr uint32_t oldest_every = 8;

  explicit peer_queues(Remaining remaining = {}) : remaining_(std::move(remaining)) {}

  /// Queue `item` for `peer`; a peer with no items joins the turn order last.
  void push(uint64_t peer, T item) {
    auto& q = queues_[peer];
    if (q.by_age.empty()) order_.push_back(peer);
    const uint64_t seq = next_seq_++;
    const uint64_t key = remaining_(item);
    q.by_age.emplace(seq, entry{std::move(item), key});
    q.by_size.emplace(key, seq);
  }
  bool empty() const { return order_.empty(); }
  /// Peers with items.
  size_t peers() const { return order_.size(); }
  /// The item of the peer whose turn it is. Precondition: !empty().
  T& front() { return current_entry(queues_.at(order_.front())).item; }
  /// Remove the current peer's front item; the peer keeps its turn for its next item.
  void pop_front() {
    const auto peer = order_.front();
    auto& q = queues_.at(peer);
    current_entry(q);
    const auto it = q.by_age.find(*q.current);
    q.by_size.erase({it->second.key, it->first});
    q.by_age.erase(it);
    q.current.reset();
    if (q.by_age.empty()) {
      queues_.erase(peer);
      order_.pop_front();
    }
  }
  /// The current peer has had its write: its item's size is read again, and the next peer's
  /// turn begins.
  void next_turn() {
    auto& q = queues_.at(order_.front());
    if (q.current) {
      auto& e = q.by_age.at(*q.current);
      const uint64_t key = remaining_(e.item);
      if (key != e.key) {
        q.by_size.erase({e.key, *q.current});
        q.by_size.emplace(key, *q.current);
        e.key = key;
      }
      q.current.reset();
    }
    ++q.writes;
    rotate();
  }
  /// The current peer cannot take a write now (its bytes in flight are at their bound): the
  /// next peer's turn, the peer's own choice unchanged.
  void skip_peer() { rotate(); }
  /// Visit every queued item (any order).
  template <class F>
  void for_each(F&& f) {
    for (auto& [peer, q] : queues_)
      for (auto& [seq, e] : q.by_age) f(e.item);
  }
  /// Read every item's size again (after a change outside a turn, such as a cancel).
  void refresh() {
    for (auto& [peer, q] : queues_)
      for (auto& [seq, e] : q.by_age) {
        const uint64_t key = remaining_(e.item);
        if (key == e.key) continue;
        q.by_size.erase({e.key, seq});
        q.by_size.emplace(key, seq);
        e.key = key;
      }
  }
  /// Drop the items matching `pred`; peers left without items leave the turn order.
  template <class Pred>
  void erase_if(Pred&& pred) {
    for (auto it = queues_.begin(); it != queues_.end();) {
      auto& q = it->second;
      for (auto e = q.by_age.begin(); e != q.by_age.end();) {
        if (!pred(e->second.item)) {
          ++e;
          continue;
        }
        if (q.current == e->first) q.current.reset();
        q.by_size.erase({e->second.key, e->first});
        e = q.by_age.erase(e);
      }
      if (q.by_age.empty()) {
        std::erase(order_, it->first);
        it = queues_.erase(it);
      } else {
        ++it;
      }
    }
  }
  /// Remove and return every item (each peer's oldest first).
  std::vector<T> take_all() {
    std::vector<T> out;
    for (auto& [peer, q] : queues_)
      for (auto& [seq, e] : q.by_age) out.push_back(std::move(e.item));
    queues_.clear();
    order_.clear();
    return out;
  }

 private:
  struct entry {
    T item;
    uint64_t key;  ///< its size when last read (its place in by_size)
  };
  struct queue {
    std::map<uint64_t, entry> by_age;                 ///< arrival number -> item
    std::set<std::pair<uint64_t, uint64_t>> by_size;  ///< (size, arrival number)
    std::optional<uint64_t> current;                  ///< the item of this turn, once chosen
    uint64_t writes = 0;                              ///< turns this peer has had
  };

  entry& current_entry(queue& q) {
    if (!q.current)
      q.current = q.writes % oldest_every == oldest_every - 1 ? q.by_age.begin()->first
                                                              : q.by_size.begin()->second;
    return q.by_age.at(*q.current);
  }
  void rotate() {
    if (order_.size() < 2) return;
    order_.push_back(order_.front());
    order_.pop_front();
  }

  Remaining remaining_;
  uint64_t next_seq_ = 0;
  std::unordered_map<uint64_t, queue> queues_;
  std::deque<uint64_t> order_;  // peers with items, in turn order (front: whose turn it is)
};

}  // namespace ferry::transport
