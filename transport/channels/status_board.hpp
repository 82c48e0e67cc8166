#pragma once
/// The status of every active room, readable by the client gateway's thread, so a poll of a
/// room in progress is answered there without waiting behind the actors (an engine polls its
/// rooms every scheduler step).
///
/// Only what cannot mislead is answered from here: the non-terminal status of an active room,
/// which is at most as stale as a poll that had arrived a moment earlier. A terminal status
/// (which tells an engine it may reuse the room's memory), a finished or unknown room, and a
/// poll_many that names any room not here go to the Scheduler, which keeps the room registry
/// and answers with its rules (reused ids, rooms polled before they exist). The Scheduler writes
/// the board as rooms open, move and end. Thread-safe.

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/protocol.hpp"
#include "core/status.hpp"

namespace ferry {

class status_board {
 public:
  /// Room `room` of a side is active with `status` (and `note`: why it waits there, if it
  /// says); a terminal status removes it instead.
  void set(uint64_t room, bool decode, room_status status, uint32_t prefix_tokens,
           const std::string& note = {}) {
    std::lock_guard g(mutex_);
    auto& e = rooms_[room];
    auto& s = decode ? e.decode : e.prefill;
    s.status = is_terminal(status) ? std::nullopt : std::optional(status);
    s.prefix_tokens = prefix_tokens;
    s.note = note;
    if (!e.decode.status && !e.prefill.status) rooms_.erase(room);
  }
  void erase(uint64_t room, bool decode) {
    std::lock_guard g(mutex_);
    auto it = rooms_.find(room);
    if (it == rooms_.end()) return;
    (decode ? it->second.decode : it->second.prefill).status.reset();
    if (!it->second.decode.status && !it->second.prefill.status) rooms_.erase(it);
  }

  /// The answer to a poll of `room` if it is active here (the decode side first, as the
  /// Scheduler answers), or nothing: ask the Scheduler.
  std::optional<proto::poll_reply> poll(uint64_t room) const {
    std::lock_guard g(mutex_);
    auto p = find(room);
    if (p) ++answered_;
    return p;
  }
  /// The answer to a poll_many if every room is active here, or nothing.
  std::optional<proto::poll_many_reply> poll_many(const std::vector<uint64_t>& rooms) const {
    std::lock_guard g(mutex_);
    proto::poll_many_reply out;
    out.rooms.reserve(rooms.size());
    for (auto room : rooms) {
      auto p = find(room);
      if (!p) return std::nullopt;
      out.rooms.push_back(std::move(*p));
    }
    ++answered_;
    return out;
  }
  /// Polls and poll_manys answered from here (not by the Scheduler) since start.
  uint64_t answered() const {
    std::lock_guard g(mutex_);
    return answered_;
  }
  size_t size() const {
    std::lock_guard g(mutex_);
    return rooms_.size();
  }

 private:
  struct side {
    std::optional<room_status> status;  ///< none: not active on this side
    uint32_t prefix_tokens = 0;
    std::string note;
  };
  struct entry {
    side decode, prefill;
  };
  std::optional<proto::poll_reply> find(uint64_t room) const {
    auto it = rooms_.find(room);
    if (it == rooms_.end()) return std::nullopt;
    const auto& s = it->second.decode.status ? it->second.decode : it->second.prefill;
    return proto::poll_reply{room, *s.status, s.note, errc::ok, s.prefix_tokens};
  }

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, entry> rooms_;
  mutable uint64_t answered_ = 0;
};

}  // namespace ferry
