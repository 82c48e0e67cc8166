#pragma once
/// The Scheduler's room registry as pure code: the rooms of each side (active, and a bounded
/// history of finished ones for poll), admission, the answers of poll, the rule for a send
/// after its room ended, and the peers declared unresponsive. The Scheduler (actors/
/// scheduler*.cpp) keeps only what is actors: the room actors, their connections and
/// subscribers (its `Entry`).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

#include "core/bounded_map.hpp"
#include "core/config_types.hpp"
#include "core/errors.hpp"
#include "core/protocol.hpp"
#include "core/status.hpp"

namespace ferry {

/// Finished rooms, tokens of ended rooms and rooms polled unknown are remembered this long.
inline constexpr size_t history_limit = 65536;

struct finished_room {
  room_status status;
  std::string reason;
  errc code = errc::ok;
  uint32_t prefix_tokens = 0;
  /// Prefill: the room ended before any decode rank prepared it, so none was told; a prepare
  /// that arrives now is late for it (see `late_prepare`).
  bool without_decode = false;
};

/// Rooms of one side (`Entry`: what the Scheduler keeps of an active room). A room id may be
/// reused after its terminal state: lookups check `active` first, and the new incarnation's
/// outcome replaces the old one in `finished`.
template <class Entry>
struct room_table {
  std::unordered_map<uint64_t, Entry> active;
  bounded_map<uint64_t, finished_room> finished{history_limit};
  uint64_t succeeded = 0, failed = 0, bytes = 0;

  /// `room` ended with `s`: counted, no longer active, its outcome kept for poll.
  void finish(uint64_t room, room_status s, std::string reason, errc code,
              uint32_t prefix_tokens = 0, uint64_t moved_bytes = 0, bool without_decode = false) {
    if (s == room_status::success) {
      ++succeeded;
      bytes += moved_bytes;
    } else {
      ++failed;
    }
    active.erase(room);
    finished.put(room, finished_room{s, std::move(reason), code, prefix_tokens, without_decode});
  }
};

/// Admission: at most `limit` non-terminal rooms per side (limits.max_active_rooms), so one
/// runaway client cannot exhaust the daemon for everyone else.
result<> admit(size_t active, uint32_t limit, const char* side);

/// Whether a send for `room` may still be taken: room_finished once that room has finished.
result<> send_still_open(const bounded_map<uint64_t, finished_room>& finished, uint64_t room);

/// Prefill: whether a decode rank's prepare for `room`, which has no active room, is late for
/// a room that already failed before any decode rank prepared it (cancelled by its client, or
/// timed out waiting for the prepare). Such a prepare is refused with the room's own reason and
/// code, so the decode fails at once instead of opening a new incarnation that no send will
/// ever feed (and waiting out its whole transfer_ms).
result<> late_prepare(const bounded_map<uint64_t, finished_room>& finished, uint64_t room);

/// Prefill: the refusal of a decode rank's prepare that room `room`'s actor never took, because
/// the room ended (`s`, `reason`, `code`) while the prepare was on its way to it. Without this
/// answer that decode rank would wait for a drain report no one sends, and fence the link.
error ended_before_prepare(uint64_t room, room_status s, const std::string& reason, errc code);

/// A poll's answer from a side's active rooms (its status, and its `note` as the reason: why
/// it waits there, if it says), or nothing.
template <class Entry>
std::optional<proto::poll_reply> active_poll(const room_table<Entry>& side, uint64_t room) {
  if (auto it = side.active.find(room); it != side.active.end())
    return proto::poll_reply{room, it->second.status, it->second.note, errc::ok,
                             it->second.prefix_tokens};
  return std::nullopt;
}

/// A poll's answer from a side's finished rooms (its outcome), or nothing.
template <class Entry>
std::optional<proto::poll_reply> finished_poll(const room_table<Entry>& side, uint64_t room) {
  if (const auto* f = side.finished.find(room))
    return proto::poll_reply{room, f->status, f->reason, f->code, f->prefix_tokens};
  return std::nullopt;
}

/// Prefill, protocol v4: a room polled before anything of it arrived (the decode's prepare and
/// the engine's first send may still be on their way) is Bootstrapping until
/// timeouts.bootstrapping_ms after its first such poll, then Failed (timed_out).
class unknown_polls {
 public:
  using clock = std::chrono::steady_clock;
  proto::poll_reply poll(uint64_t room, clock::time_point now, uint32_t bootstrapping_ms);
  /// The room became known: its first poll no longer matters.
  void forget(uint64_t room) { first_.erase(room); }
  size_t size() const { return first_.size(); }

 private:
  bounded_map<uint64_t, clock::time_point> first_{history_limit};
};

/// Prefill: rooms a client cancelled before anything of them reached this daemon (SGLang's
/// prefill aborts a request while the decode's prepare is still on its way). The cancel has
/// nothing to stop here, but a decode's prepare of such a room is refused at once, naming the
/// cancel, so the decode fails within one round trip instead of holding its pages until its
/// waiting_for_input_ms; until `until`, the longest room deadline after the cancel. The prefill
/// engine's next send or poll of the room forgets it: SGLang bootstraps a retracted request
/// again under the same room id. Bounded like the histories: the oldest are forgotten first.
class cancelled_rooms {
 public:
  using clock = std::chrono::steady_clock;
  void cancel(uint64_t room, clock::time_point until) { until_.put(room, until); }
  /// Whether a decode's prepare of `room` may open it: `cancelled`, naming the cancel, while
  /// the room is remembered (an expired entry is forgotten).
  result<> prepare_allowed(uint64_t room, clock::time_point now);
  void forget(uint64_t room) { until_.erase(room); }
  size_t size() const { return until_.size(); }

 private:
  bounded_map<uint64_t, clock::time_point> until_{history_limit};
};

/// The longest deadline a room can run into (timeouts.*): how long a peer's message of a room
/// may still arrive after the room began.
uint32_t longest_room_deadline_ms(const timeouts_config& t);

/// Outbound peers declared unresponsive (by the heartbeat): new rooms naming one fail at once,
/// naming why, until the bound (heartbeat_ms x heartbeat_misses) has passed again. Bounded like
/// the histories: the oldest marks are forgotten first.
class unresponsive_peers {
 public:
  using clock = std::chrono::steady_clock;
  void mark(const std::string& address, std::string why, clock::time_point until);
  /// Why `address` is not retried yet, or nothing (an expired mark is forgotten).
  std::optional<std::string> known_down(const std::string& address, clock::time_point now);
  size_t size() const { return down_.size(); }

 private:
  bounded_map<std::string, std::pair<std::string, clock::time_point>> down_{history_limit};
};

}  // namespace ferry
