#pragma once
/// The events a client has read from ferryd and not handed out yet (ferry/client.hpp): in
/// arrival order for `next_event`, and by room for `wait_terminal`, which takes one room's
/// terminal event out of the middle. Both are O(1) (a list, and per room the places of its
/// terminal events), so an engine holding thousands of rooms does not pay a scan of every kept
/// event per wait, nor per event read while it waits. Dropping a room's events (rare: a reused
/// id) scans the queue. Not thread-safe (one client per thread).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <iterator>
#include <list>
#include <optional>
#include <unordered_map>
#include <utility>

#include "core/protocol.hpp"
#include "core/status.hpp"

namespace ferry::client {

using proto::event;

class event_queue {
 public:
  void push(event e) {
    const uint64_t room = e.room;
    const bool terminal = is_terminal(e.status);
    events_.push_back(std::move(e));
    if (terminal) terminal_[room].push_back(std::prev(events_.end()));
  }
  bool empty() const { return events_.empty(); }
  size_t size() const { return events_.size(); }
  /// The oldest event, taken out; nothing when none is kept.
  std::optional<event> pop_front() {
    if (events_.empty()) return std::nullopt;
    if (is_terminal(events_.front().status)) drop_place(events_.front().room, events_.begin());
    event e = std::move(events_.front());
    events_.pop_front();
    return e;
  }
  /// The oldest terminal event of `room`, taken out; nothing when none is kept.
  std::optional<event> take_terminal(uint64_t room) {
    auto t = terminal_.find(room);
    if (t == terminal_.end()) return std::nullopt;
    const auto it = t->second.front();
    t->second.pop_front();
    if (t->second.empty()) terminal_.erase(t);
    event e = std::move(*it);
    events_.erase(it);
    return e;
  }
  /// Drop the kept events of `room` for which `pred(event)` holds.
  template <class Pred>
  void erase_room(uint64_t room, Pred&& pred) {
    for (auto it = events_.begin(); it != events_.end();) {
      if (it->room != room || !pred(*it)) {
        ++it;
        continue;
      }
      if (is_terminal(it->status)) drop_place(room, it);
      it = events_.erase(it);
    }
  }
  /// Rooms with a terminal event kept, for tests (a room is forgotten with its last one).
  size_t rooms_with_terminal() const { return terminal_.size(); }

 private:
  using place = std::list<event>::iterator;
  void drop_place(uint64_t room, place it) {
    auto t = terminal_.find(room);
    if (t == terminal_.end()) return;
    auto& places = t->second;
    for (auto p = places.begin(); p != places.end(); ++p)  // a room's few terminal events
      if (*p == it) {
        places.erase(p);
        break;
      }
    if (places.empty()) terminal_.erase(t);
  }

  std::list<event> events_;
  /// Per room, the places of its terminal events in `events_`, oldest first.
  std::unordered_map<uint64_t, std::deque<place>> terminal_;
};

}  // namespace ferry::client
