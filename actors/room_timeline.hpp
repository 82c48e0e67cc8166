#pragma once
/// When each milestone of a room happened, on this daemon's clock: what `ferry-bench --latency`
/// reports per phase on both daemons, and the `timelines` info document (docs/protocol.md).
///
/// A room actor keeps its own timeline (no locking) and hands it to the daemon's
/// `timeline_log` when it ends; the log keeps the last `timeline_log::capacity` rooms per side.

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>

namespace ferry {

/// A decode room's milestones: the client's prepare taken, every named prefill rank accepted,
/// every rank announced its totals, the last write landed, Success.
enum class decode_mark : uint8_t { prepared, acknowledged, announced, landed, success };
/// A prefill room's: the room opened (the engine's first send or a decode's prepare), the first
/// decode's prepare taken, the engine's last chunk taken, the totals announced, the last write
/// completed here, Success (the decode's outcome heard).
enum class prefill_mark : uint8_t { opened, prepared, sent, announced, written, success };

class room_timeline {
 public:
  static constexpr size_t max_marks = 6;
  using clock = std::chrono::steady_clock;

  /// The first milestone is the start: the room actor's creation, where the request that opened
  /// the room was taken.
  room_timeline() {
    us_.fill(-1);
    us_[0] = 0;
  }
  /// The milestone happened now (a later call moves it: the last write, the last announce).
  template <class Mark>
  void mark(Mark m) {
    us_[static_cast<size_t>(m)] =
        std::chrono::duration_cast<std::chrono::microseconds>(clock::now() - start_).count();
  }
  /// Only the first time (the first prepare of several).
  template <class Mark>
  void mark_once(Mark m) {
    if (us_[static_cast<size_t>(m)] < 0) mark(m);
  }
  /// Microseconds from the room's start; -1 where it was not reached.
  const std::array<int64_t, max_marks>& us() const { return us_; }

 private:
  clock::time_point start_ = clock::now();
  std::array<int64_t, max_marks> us_;
};

/// The last rooms' timelines, per side. Thread-safe.
class timeline_log {
 public:
  static constexpr size_t capacity = 4096;

  void add(bool decode, uint64_t room, const room_timeline& t) {
    std::lock_guard g(mutex_);
    auto& q = decode ? decode_ : prefill_;
    q.push_back({room, t.us()});
    if (q.size() > capacity) q.pop_front();
  }

  /// {"unit": "us", "decode": {"marks": [...], "rooms": [[room, us...], ...]}, "prefill": ...},
  /// oldest first; a milestone not reached is null.
  nlohmann::json to_json() const {
    std::lock_guard g(mutex_);
    auto side = [](const std::deque<entry>& q, std::initializer_list<const char*> marks) {
      nlohmann::json rooms = nlohmann::json::array();
      for (const auto& e : q) {
        nlohmann::json row = nlohmann::json::array({e.room});
        for (size_t i = 0; i < marks.size(); ++i)
          row.push_back(e.us[i] < 0 ? nlohmann::json(nullptr) : nlohmann::json(e.us[i]));
        rooms.push_back(std::move(row));
      }
      return nlohmann::json{{"marks", marks}, {"rooms", std::move(rooms)}};
    };
    return {
        {"unit", "us"},
        {"decode", side(decode_, {"prepared", "acknowledged", "announced", "landed", "success"})},
        {"prefill",
         side(prefill_, {"opened", "prepared", "sent", "announced", "written", "success"})}};
  }

 private:
  struct entry {
    uint64_t room;
    std::array<int64_t, room_timeline::max_marks> us;
  };
  mutable std::mutex mutex_;
  std::deque<entry> decode_, prefill_;
};

}  // namespace ferry
