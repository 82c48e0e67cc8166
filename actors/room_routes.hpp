#pragma once
/// Where a room's inbound peer messages and landed-write counts go, read by the threads that
/// receive them -- a peer link's gate thread, the fabric's progress thread -- so each posts
/// straight to the room's actor: one hop, not through the Connection and the Scheduler.
///
/// A room's route exists before any message can take it, and a message that finds none takes
/// the slower path (the Connection, then the Scheduler) -- so no message of a link can overtake
/// an earlier one of the same link that took the slower path:
/// - a decode room adds its tokens when it starts, before it sends the prepare from which each
///   of its prefill ranks learns one, and tokens are never reused;
/// - a prefill room adds a decode's link when it has taken that link's prepare (which came
///   through the Scheduler, as every prepare does: it opens rooms and admits them), so that
///   link's outcome and staging grant, which follow its prepare on the wire, arrive after it
///   either way.
/// The Scheduler, which creates rooms and keeps the registry, removes a room's routes when the
/// room ends; what arrives for it later takes the slower path and is counted there as stray.
///
/// Thread-safe. Removal names the actor too, so an ended incarnation never removes the route of
/// a new one under the same room id.

#include <caf/all.hpp>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "core/peer_messages.hpp"

namespace ferry {

/// Whether `M` is a room's message (what the Scheduler forwards to a room actor).
template <class M>
constexpr bool is_room_message =
    std::is_same_v<M, peer_prepare> || std::is_same_v<M, peer_prepare_paged> ||
    std::is_same_v<M, peer_prepare_ack> || std::is_same_v<M, peer_announce> ||
    std::is_same_v<M, peer_outcome> || std::is_same_v<M, peer_drained> ||
    std::is_same_v<M, peer_staging_request> || std::is_same_v<M, peer_staging_grant> ||
    std::is_same_v<M, peer_prepare_checked> || std::is_same_v<M, peer_announce_checked>;

class room_routes {
 public:
  /// A decode room's tokens [first, first + count).
  void add_decode(uint64_t first, uint32_t count, const caf::actor& room) {
    std::lock_guard g(mutex_);
    for (uint32_t i = 0; i < count; ++i) decode_[first + i] = room;
  }
  void remove_decode(uint64_t first, uint32_t count, const caf::actor& room) {
    std::lock_guard g(mutex_);
    for (uint32_t i = 0; i < count; ++i)
      if (auto it = decode_.find(first + i); it != decode_.end() && it->second == room)
        decode_.erase(it);
  }
  /// Prefill room `room_id` took the prepare that came on link `link` (its Connection's id).
  void add_prefill(uint64_t room_id, const caf::actor& room, caf::actor_id link) {
    std::lock_guard g(mutex_);
    auto& r = prefill_[room_id];
    if (r.actor != room) r = prefill_route{room, {}};
    r.links.push_back(link);
  }
  void remove_prefill(uint64_t room_id, const caf::actor& room) {
    std::lock_guard g(mutex_);
    if (auto it = prefill_.find(room_id); it != prefill_.end() && it->second.actor == room)
      prefill_.erase(it);
  }

  /// The decode room whose token is `token`, or an invalid handle.
  caf::actor decode(uint64_t token) const {
    std::lock_guard g(mutex_);
    return find(token);
  }

  /// The room actor `m`, which arrived on link `link`, goes to, or an invalid handle (a prepare:
  /// the Scheduler opens or finds its room; anything of a room or link that has no route).
  template <class Message>
  caf::actor of(const Message& m, caf::actor_id link) const {
    std::lock_guard g(mutex_);
    if constexpr (std::is_same_v<Message, peer_prepare_ack> ||
                  std::is_same_v<Message, peer_announce> || std::is_same_v<Message, peer_drained> ||
                  std::is_same_v<Message, peer_staging_request>) {
      return find(m.token);
    } else if constexpr (std::is_same_v<Message, peer_announce_checked>) {
      return find(m.announce.token);
    } else if constexpr (std::is_same_v<Message, peer_outcome> ||
                         std::is_same_v<Message, peer_staging_grant>) {
      if constexpr (std::is_same_v<Message, peer_outcome>)
        if (m.to_decode) return find(m.token);
      auto it = prefill_.find(m.room);
      if (it == prefill_.end()) return {};
      for (auto l : it->second.links)
        if (l == link) return it->second.actor;
      return {};
    } else {
      return {};
    }
  }

  size_t size() const {
    std::lock_guard g(mutex_);
    return decode_.size() + prefill_.size();
  }

 private:
  struct prefill_route {
    caf::actor actor;
    std::vector<caf::actor_id> links;  ///< whose prepare the room took
  };
  caf::actor find(uint64_t token) const {
    auto it = decode_.find(token);
    return it == decode_.end() ? caf::actor{} : it->second;
  }

  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, caf::actor> decode_;
  std::unordered_map<uint64_t, prefill_route> prefill_;
};

}  // namespace ferry
