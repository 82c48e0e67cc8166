#pragma once
/// The Scheduler's state and its parts (actors/scheduler*.cpp), shared by them alone: the room
/// registry of each side, the peer directory, the client pools' release, and the handlers of
/// client requests, each in the file named for it.

#include <array>
#include <chrono>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "actors/actors.hpp"
#include "core/dst_claims.hpp"
#include "core/orphan_fence.hpp"
#include "core/room_registry.hpp"

namespace ferry::sched {

struct room_entry {
  caf::actor actor;
  std::vector<caf::actor> connections;  // the peers the room exchanges messages with
  /// Prefill: every decode prepare forwarded to the room's actor, in order (its connection and
  /// token), to answer those the actor did not take before it ended (room_update::prepares).
  std::vector<std::pair<caf::actor, uint64_t>> prepares;
  room_status status = room_status::bootstrapping;
  uint32_t prefix_tokens = 0;  // prefill: the decode's prefix (room_update)
  std::string note;            // why it waits in its status (a poll's reason), if it says
  std::string peer;
  uint64_t token = 0;   // decode: first token of the room's links (one per named peer)
  uint32_t tokens = 0;  // decode: how many
  std::vector<uint64_t> subscribers;  // client connections
  std::optional<uint64_t> owner;      // client connection whose close cancels the room
  // decode: the destination indices it claimed (released at its terminal state)
  std::vector<uint32_t> dst_pages;
  uint32_t dst_slot = no_index, dst_row = no_index;
  std::vector<uint32_t> dst_state_pages;  // a paged state pool's destination pages
  // decode: the room's actor ended abnormally; the room fails once its open links are fenced
  orphan_fence<caf::actor> orphan;
  /// When the room entered its current status (the phase histograms, actors/metrics.hpp).
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

/// Rooms of one side (core/room_registry.hpp), their actors and claims in `room_entry`.
using side_rooms = room_table<room_entry>;

struct scheduler_state {
  static inline const char* name = "ferry.scheduler";
  context_ptr ctx;
  side_rooms prefill, decode;
  std::optional<dst_claims> claims;  // decode: which active room holds each destination index
  /// Decode: token (immediate value and epoch of one link of one room incarnation) -> room.
  /// Tokens are never reused in a daemon's life, so a late message or write of an ended room
  /// finds nothing here.
  std::unordered_map<uint64_t, uint64_t> token_room;
  /// The room each room actor runs, by the actor's id: (decode side?, room). A room actor's
  /// down_msg is usually already queued when its terminal room_update demonitors it, so every
  /// room's end brings one; this finds its room (or none) in one lookup, not a scan of every
  /// active room, which made ending N rooms cost O(N^2).
  std::unordered_map<caf::actor_id, std::pair<bool, uint64_t>> room_actors;
  /// Prefill, v4: rooms polled before anything of them arrived.
  unknown_polls polled_unknown;
  /// Prefill: rooms a client cancelled before anything of them arrived; a decode's prepare of
  /// one is refused at once (core/room_registry.hpp).
  cancelled_rooms cancelled_unknown;
  uint64_t next_token = 1;
  std::unordered_map<std::string, caf::actor> outbound;       // by control address
  std::unordered_map<caf::actor, peer_info_ptr> connections;  // every live connection
  std::set<caf::actor> draining_peers;  // connections whose peer said it drains (peer_leaving)
  std::set<caf::actor> goodbyes;        // draining: connections whose peer has not the goodbye yet
  /// The registrations each ready connection's peer may write into, to fence them should the
  /// Connection end abnormally (normally it fences them itself).
  std::unordered_map<caf::actor, std::vector<transport::region_id>> fences;
  /// The fabric address each connection still in its handshake inserted (peer_resources); a
  /// ready one's is in its peer_info.
  std::unordered_map<caf::actor, transport::peer_handle> handles;
  uint64_t stray_writes = 0;  // immediates of unknown rooms
  /// Tokens of recently ended decode rooms (bounded), so a write that lands after its room's
  /// terminal state (which should never happen; see docs/reliability.md §4 for the one known
  /// case) is reported naming the room and peer, not just counted.
  bounded_map<uint64_t, std::string> ended_tokens{history_limit};
  std::unordered_set<uint64_t> owning_clients;  // said hello with cancel_on_disconnect
  std::unordered_set<uint64_t> clients;         // said hello, still connected
  /// Client pools being released: whether their peers were told to fence, and whether the
  /// unmapping is under way.
  std::array<bool, pool_kind_count> release_fenced{}, release_unmapping{};
  /// Outbound peers declared unresponsive: new rooms naming one fail at once, for a while.
  unresponsive_peers unresponsive;
  /// A stop began (drain_msg): new rooms are refused; `drained` is notified, and dropped, once
  /// no room is active.
  bool draining = false;
  std::shared_ptr<stop_notice> drained;
};

using scheduler_actor = caf::stateful_actor<scheduler_state>;

// scheduler_rooms.cpp: the room registry and the requests that make or change rooms.
std::optional<uint64_t> owner_of(const scheduler_state& st, const client_request& r);
void reply_error(scheduler_actor* self, const client_request& r, errc code, std::string text);
void reply_error(scheduler_actor* self, const client_request& r, error e);
result<> admission(const scheduler_state& st, const side_rooms& side, const char* name);
void notify_subscribers(scheduler_actor* self, const room_entry& e, uint64_t room, room_status s,
                        const std::string& reason, errc code);
void fail_orphan(scheduler_actor* self, side_rooms& side, uint64_t room, std::string reason);
caf::actor connection_for(scheduler_actor* self, const std::string& address);
/// The stop's drain: refuse new rooms, tell the peers, notify `done` once no room is active.
void start_drain(scheduler_actor* self, std::shared_ptr<stop_notice> done);
void check_drained(scheduler_actor* self);
void on_prepare(scheduler_actor* self, client_request& r);
void on_send(scheduler_actor* self, client_request& r);
void on_poll(scheduler_actor* self, client_request& r, uint64_t room);
/// Prefill: a client cancelled a room that nothing of has arrived yet (cancelled_unknown).
void cancel_unknown(scheduler_actor* self, const client_request& r, uint64_t room);
void on_poll_many(scheduler_actor* self, client_request& r, const std::vector<uint64_t>& rooms);
room_entry* find_active(scheduler_state& st, uint64_t room);
/// Open `room` on `side` with its actor (room_actors knows it from now on).
room_entry& open_room(scheduler_state& st, side_rooms& side, uint64_t room, caf::actor actor);
/// `room` of `side` ended: its actor is forgotten and its outcome kept (room_table::finish).
void finish_room(scheduler_state& st, side_rooms& side, uint64_t room, room_status s,
                 std::string reason, errc code, uint32_t prefix_tokens, uint64_t bytes,
                 bool without_decode);

// scheduler_info.cpp: the answers of `info`, JSON documents (docs/protocol.md), and what a
// metrics scrape reads of the Scheduler.
std::string info_json(scheduler_state& st, proto::info_topic topic);
metrics_snapshot snapshot(scheduler_state& st);
/// A room of `side` left status `from` for `to` (its phase observed); counted when terminal.
void room_moved(scheduler_state& st, bool decode, room_entry& e, room_status to, errc code,
                uint64_t bytes);

// scheduler_memory.cpp: engine-owned memory, registered and released.
void on_register_memory(scheduler_actor* self, client_request& r);
void try_release(scheduler_actor* self);
void publish_description(scheduler_actor* self, int k, const described_pool& d);
void start_release(scheduler_actor* self, int k, const std::string& why);

// scheduler_discovery.cpp: the ranks of an engine instance.
void on_discover(scheduler_actor* self, client_request& r);

}  // namespace ferry::sched
