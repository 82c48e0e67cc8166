#pragma once
/// Every message exchanged by Ferry's actors, in one place.
///
/// Two boundaries:
/// - between daemons (CAF's BASP, serialized, on sockets the peer gate authenticated):
///   `peer_*` types, exchanged only between the two Connection actors of a peer pair. They carry
///   scalars and lists of page indices; the state slot is always one scalar per side.
/// - inside a daemon (local only, never serialized): client requests from the gateway thread,
///   fabric completions from the progress thread, and room bookkeeping.
///
/// Bulk bytes never travel in messages: they move by RMA writes; messages carry descriptors.

#include <caf/all.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/metrics.hpp"
#include "core/config.hpp"
#include "core/geometry.hpp"
#include "core/layout.hpp"
#include "core/plan.hpp"
#include "core/protocol.hpp"
#include "core/registration.hpp"
#include "core/status.hpp"
#include "transport/engine.hpp"

namespace ferry {

/// Versions of the daemon-to-daemon handshake; the highest is bumped on any change of the peer_*
/// types or of what goes over the fabric, and a hello carries the range its daemon speaks.
/// 4: on tcp each write is a plain write plus a 0-byte write carrying its immediate, so the
/// decode's fence may cut a connection mid-write (a version-3 prefill sends writes with payload
/// and immediate in one, and cutting one of those mid-write crashes libfabric 1.17's ofi_rxm at
/// the decode, so version 3 peers are refused). 5: room failures carry an error code
/// (`peer_prepare_ack`, `peer_outcome`), and the hello carries the range (`min_version`); the
/// layouts of version 4 differ, so its peers are refused too. 6: a daemon that begins a stop
/// tells its peers (`peer_leaving`), so new rooms naming it fail at once with `draining`; a
/// version-5 peer is not told, and its new prepares are refused by the draining daemon instead.
/// 7: a daemon may have several fabric endpoints (rails); once ready, the two Connections
/// exchange them (`peer_rails`) and the prefill stripes its writes across the rails both have.
/// A peer of version 5 or 6 is sent none, and the pair uses one endpoint each (the hello's).
/// 8: a state pool may be indexed by pages (swa, dsa, minimax_index_k); such a pool's prepares
/// go as `peer_prepare_paged`. A daemon with a paged state pool refuses peers below version 8.
inline constexpr uint32_t peer_protocol_version = 8;
inline constexpr uint32_t peer_paged_state_version = 8;
inline constexpr uint32_t peer_protocol_min_version = 5;

/// "No staging" in peer_prepare::dst_staging.
inline constexpr uint64_t no_staging = ~uint64_t{0};

// ---------------------------------------------------------------------------------------------
// Between daemons
// ---------------------------------------------------------------------------------------------

/// A registered pool as the peer must address it.
struct peer_region {
  bool present = false;
  uint64_t remote_base = 0;
  uint64_t key = 0;
  uint64_t length = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_region& x) {
  return f(caf::meta::type_name("peer_region"), x.present, x.remote_base, x.key, x.length);
}

/// Handshake, sent by the connecting side's Connection to the peer daemon's Scheduler, and
/// answered by the accepting side's Connection with its own `peer_hello`.
struct peer_hello {
  uint32_t version = peer_protocol_version;
  std::string node;
  std::string instance;
  std::string role;
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  uint32_t pp_size = 1;
  uint32_t pp_rank = 0;
  std::string config_yaml;   ///< the sender's effective config; pools give the layout
  uint64_t compat_hash = 0;  ///< compatibility_hash(pools)
  std::vector<uint8_t> fabric_address;
  std::vector<peer_region> regions;  ///< indexed by pool_kind
  peer_region staging;               ///< bounce region for head-sliced KV (may be absent)
  caf::actor connection;             ///< the sender's Connection actor
  /// Challenge-response with the cluster secret (security.cluster_secret): each side sends a
  /// fresh nonce; the accepting side's hello carries its proof over both nonces, and the
  /// connecting side answers with `peer_auth`. Both empty when no secret is configured.
  std::vector<uint8_t> nonce;
  std::vector<uint8_t> proof;
  uint32_t min_version = peer_protocol_min_version;  ///< lowest version the sender speaks
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_hello& x) {
  return f(caf::meta::type_name("peer_hello"), x.version, x.node, x.instance, x.role, x.tp_size,
           x.tp_rank, x.pp_size, x.pp_rank, x.config_yaml, x.compat_hash, x.fabric_address,
           x.regions, x.staging, x.connection, x.nonce, x.proof, x.min_version);
}

/// Connecting side -> accepting side, after it verified the accepting side's proof: its own
/// proof of the cluster secret. The accepting side takes no room message before it.
struct peer_auth {
  std::vector<uint8_t> proof;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_auth& x) {
  return f(caf::meta::type_name("peer_auth"), x.proof);
}

/// The accepting side refused the handshake (version, compatibility, role).
struct peer_refused {
  std::string reason;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_refused& x) {
  return f(caf::meta::type_name("peer_refused"), x.reason);
}

/// Decode -> prefill: where room `room` must land. Exactly one destination slot and aux row.
struct peer_prepare {
  uint64_t room = 0;
  uint64_t token = 0;  ///< immediate data every write of this room must carry
  std::vector<uint32_t> dst_pages;
  uint32_t dst_state_slot = no_index;
  uint32_t dst_aux_row = no_index;
  /// Offset in the decode's staging region reserved for this room's head-sliced KV from this
  /// prefill rank (link kv_mode::unpack), or no_staging: write each token's slice directly.
  uint64_t dst_staging = no_staging;
  uint32_t prefix_tokens = 0;  ///< the decode engine's prepare.prefix_tokens (decode_prefix_len)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_prepare& x) {
  return f(caf::meta::type_name("peer_prepare"), x.room, x.token, x.dst_pages, x.dst_state_slot,
           x.dst_aux_row, x.dst_staging, x.prefix_tokens);
}

/// Decode -> prefill (version 8): a prepare whose state pool is indexed by pages (swa, dsa,
/// minimax_index_k) names those pages too, in the order the engine gave them.
struct peer_prepare_paged {
  peer_prepare prepare;
  std::vector<uint32_t> dst_state_pages;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_prepare_paged& x) {
  return f(caf::meta::type_name("peer_prepare_paged"), x.prepare, x.dst_state_pages);
}

// Every room message after the prepare carries the prepare's `token`: the epoch of that room
// incarnation. A room id may be reused once its room is terminal; a late message (or write) of
// an earlier incarnation carries an older token and is ignored.

/// Prefill -> decode: the prepare was accepted (ok) or refused with a reason.
struct peer_prepare_ack {
  uint64_t room = 0;
  uint64_t token = 0;
  bool ok = true;
  std::string reason;
  uint16_t code = 0;  ///< errc of the refusal
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_prepare_ack& x) {
  return f(caf::meta::type_name("peer_prepare_ack"), x.room, x.token, x.ok, x.reason, x.code);
}

/// Prefill -> decode: every write of the room has been posted; `total_writes` will land.
struct peer_announce {
  uint64_t room = 0;
  uint64_t token = 0;
  uint64_t total_writes = 0;
  uint64_t total_bytes = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_announce& x) {
  return f(caf::meta::type_name("peer_announce"), x.room, x.token, x.total_writes, x.total_bytes);
}

/// Decode -> prefill: the room committed (every write landed) or failed with a reason.
/// Prefill -> decode with ok=false: the prefill side failed or cancelled the room.
struct peer_outcome {
  uint64_t room = 0;
  uint64_t token = 0;
  bool to_decode = false;  ///< which side's room it concerns (both roles may share a room id)
  bool ok = false;
  std::string reason;
  uint16_t code = 0;  ///< errc of the failure
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_outcome& x) {
  return f(caf::meta::type_name("peer_outcome"), x.room, x.token, x.to_decode, x.ok, x.reason,
           x.code);
}

/// Prefill -> decode, after the prefill's room failed (for any reason, on either side): every
/// write it posted for the room has completed locally, so no more will be posted. `completed`
/// writes succeeded locally and will land (the decode counts their immediates before it lets
/// the room's pages and slot go); `failed` writes completed with an error or were never posted.
struct peer_drained {
  uint64_t room = 0;
  uint64_t token = 0;
  uint64_t completed = 0;
  uint64_t failed = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_drained& x) {
  return f(caf::meta::type_name("peer_drained"), x.room, x.token, x.completed, x.failed);
}

/// Connection -> Connection (version 6): this daemon began a stop. It finishes the rooms it
/// accepted and takes no new one; new rooms naming it should fail at once with `draining`.
struct peer_leaving {
  std::string reason;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_leaving& x) {
  return f(caf::meta::type_name("peer_leaving"), x.reason);
}
inline constexpr uint32_t peer_leaving_version = 6;

/// One of a daemon's fabric endpoints, as `peer_rails` lists them (transport::rail_desc).
struct peer_rail_desc {
  std::vector<uint8_t> fabric_address;
  bool express = false;  ///< carries only small batches (fabric.express_bytes)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_rail_desc& x) {
  return f(caf::meta::type_name("peer_rail_desc"), x.fabric_address, x.express);
}

/// Connection -> Connection (version 7): the sender's fabric endpoints, rail 0 (the one its
/// hello named) first. The prefill side sends its own once ready; the decode side, once it has
/// made the prefill's known on its own rails (so its fence can cut them), answers with its
/// own; only then does the prefill write on them. Each side pairs the two lists alike
/// (core/rails.hpp). Memory keys are the same on every rail, so no key travels here.
struct peer_rails {
  std::vector<peer_rail_desc> rails;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, peer_rails& x) {
  return f(caf::meta::type_name("peer_rails"), x.rails);
}
inline constexpr uint32_t peer_rails_version = 7;
/// The most endpoints a peer may list.
inline constexpr size_t max_peer_rails = 64;

/// Connection <-> Connection liveness: sent every timeouts.heartbeat_ms by both sides; a peer
/// from which nothing arrived for heartbeat_ms x heartbeat_misses is declared dead.
using heartbeat_atom = caf::atom_constant<caf::atom("heartbeat")>;

// ---------------------------------------------------------------------------------------------
// Inside a daemon (local only)
// ---------------------------------------------------------------------------------------------

/// What a daemon knows of a connected peer; shared read-only by its rooms.
struct peer_info {
  std::string address;  ///< control address (connecting side) or node/instance
  std::string node;
  std::string instance;
  /// The peer protocol version of this link: the highest both ranges hold. A later version that
  /// changes a peer_* type adds the new layout as a new type and sends the old one where this
  /// is lower, so a cluster moves one daemon at a time.
  uint32_t version = peer_protocol_version;
  pools_config pools;
  node_layout layout;
  std::vector<peer_region> regions;
  peer_region staging;
  transport::peer_handle fabric_peer = 0;
  rank_schema schema;                       ///< the peer's pools and TP/PP position
  std::vector<std::string> instance_ranks;  ///< its config's discovery.instance_ranks
  std::shared_ptr<const link_plan> link;    ///< prefill -> decode plan for this pair, validated at
                                            ///< handshake (whichever side we are)

  /// Remote region of a space at the peer.
  const peer_region& region(space s) const {
    return s == space::staging ? staging : regions[static_cast<int>(s)];
  }
};
using peer_info_ptr = std::shared_ptr<const peer_info>;

/// Connection -> room: the peer's description once the handshake is done, or why it failed.
struct peer_lookup {
  peer_info_ptr info;
  std::string error;
  errc code = errc::ok;  ///< why the peer cannot be used (with `error`)
};
using info_atom = caf::atom_constant<caf::atom("info")>;
/// Scheduler -> Connection: tell the peer this daemon is leaving (peer_leaving). Connection ->
/// Scheduler, with the peer's address: the peer said it is leaving.
using leaving_atom = caf::atom_constant<caf::atom("leaving")>;
/// Connection -> Scheduler: the peer has the goodbye (it answered the peer_leaving request), or
/// it cannot get it any more; a drain ends only after every ready peer's.
using goodbye_atom = caf::atom_constant<caf::atom("goodbye")>;

/// Written once when a drain has nothing left to wait for; its descriptor is closed when the
/// last holder (the stopping thread, the Scheduler) lets go, so a late write finds it open.
struct stop_notice {
  int fd;
  stop_notice();
  ~stop_notice();
  stop_notice(const stop_notice&) = delete;
  stop_notice& operator=(const stop_notice&) = delete;
  void notify() const;
};

/// The stopping thread -> Scheduler: begin the drain; `done` is notified once no room is
/// active.
struct drain_msg {
  std::shared_ptr<stop_notice> done;
};

/// A metrics scrape -> Scheduler: answered with a metrics_snapshot (actors/metrics.hpp).
using metrics_atom = caf::atom_constant<caf::atom("metrics")>;

/// A decoded client request, with where to send the reply.
struct client_request {
  uint64_t conn = 0;
  uint32_t seq = 0;
  proto::message msg;
  uint16_t version = proto::protocol_version;  ///< the connection's protocol version
  /// register_memory: the descriptors that came with it, owned by whoever handles the request
  /// (closed once mapped, or when refused).
  std::vector<int> fds;
};

/// A client connection closed.
struct client_gone {
  uint64_t conn = 0;
};

/// Arrived immediates from the progress thread (credit-bounded: one in flight).
struct immediates_msg {
  transport::immediate_counts counts;
};

/// A write batch of a room finished locally.
struct batch_done_msg {
  uint64_t batch = 0;
  transport::batch_result result;
};

/// Off the actor workers -> Scheduler: a client pool's mapping and registration finished or
/// failed; the request (`conn`, `seq`) is answered now.
struct memory_mapped {
  int pool = 0;
  uint64_t conn = 0;
  uint32_t seq = 0;
  result<> outcome;
  std::optional<described_pool> described;  ///< a registered pool's description
};
/// Off the actor workers -> Scheduler: a client pool's memory was deregistered and unmapped.
struct memory_released {
  int pool = 0;
  result<> outcome;
};

/// A room actor's status changed (to the Scheduler).
struct room_update {
  uint64_t room = 0;
  bool decode_side = false;
  room_status status = room_status::failed;
  std::string reason;
  uint64_t bytes = 0;          ///< bytes moved (set with Success)
  errc code = errc::ok;        ///< with Failed: why, in the one error vocabulary
  uint32_t prefix_tokens = 0;  ///< prefill: the decode's prefix, once every decode rank prepared
};

/// Connection -> Scheduler: the handshake finished (ok) or failed.
struct peer_ready {
  std::string address;
  peer_info_ptr info;  ///< null on failure
  std::string error;
  /// The registrations this peer may write into (for the Scheduler to fence them should the
  /// Connection end without doing so itself).
  std::vector<transport::region_id> fence;
};

/// Connection -> Scheduler, during the handshake: what the Connection made for its peer so far
/// (the registrations the peer may write into, its fabric address), so that a Connection that
/// ends abnormally before it is ready still has them fenced (the Scheduler's down handler).
struct peer_resources {
  std::vector<transport::region_id> fence;
  std::optional<transport::peer_handle> handle;
};

/// Connection -> Scheduler: a peer message arrived for a room.
struct peer_inbound {
  peer_info_ptr from;
  caf::actor connection;
  caf::message msg;  ///< one of the peer_* room messages
};

/// Connection -> Scheduler: the peer went away.
struct peer_down {
  std::string address;
  caf::actor connection;
  std::string reason;
  bool was_connected = false;  ///< false: the connect or handshake itself failed
  bool fenced = false;  ///< the peer's memory registrations are closed: no write of it can land
  bool unresponsive = false;  ///< declared dead by the heartbeat (hung or partitioned)
  /// The Connection already removed the peer from the fabric (it fenced registrations the peer
  /// could write into, and cut its connection with them). Otherwise the Scheduler removes the
  /// peer once it has told the rooms, so a room learns why before its writes fail with "peer
  /// removed".
  bool cut = false;
  /// peer_lost once connected; before, peer_unreachable or (a refused or failed handshake)
  /// peer_incompatible.
  errc code = errc::peer_lost;
};

/// The failure reason a room reports when its peer connection ends.
inline std::string describe(const peer_down& d) {
  return (d.was_connected ? "peer " + d.address + " lost: "
                          : "could not use peer " + d.address + ": ") +
         d.reason;
}

/// Room actor -> Connection: deliver to the peer.
struct peer_outbound {
  caf::message msg;
};

/// Decode side: writes that landed for this room (aggregated), by the token (link) they carry.
struct landed_msg {
  uint64_t token = 0;
  uint64_t count = 0;
};

/// A room's bounded wait expired; `what` names the wait for the failure reason. `state`: the
/// deadline of one status (it expires only if the room is still in it); nullopt: the bound of
/// the whole room, or of its drain once failed.
struct deadline_msg {
  std::string what;
  uint32_t ms = 0;
  std::optional<room_status> state;
};

/// Scheduler -> room, with the reason: a client cancelled the room, or the connection that
/// created it closed (hello.cancel_on_disconnect).
using cancel_atom = caf::atom_constant<caf::atom("cancel")>;

/// Room -> itself: the drain of a failed room (timeouts.drain_ms) is over.
using drain_atom = caf::atom_constant<caf::atom("drain")>;

/// Connection -> itself: time to send a heartbeat and check the peer's.
using tick_atom = caf::atom_constant<caf::atom("tick")>;

/// Scheduler -> Connection, with the new instance id: the same peer node completed a handshake
/// as a new instance, so this connection belongs to a process that is gone.
using replaced_atom = caf::atom_constant<caf::atom("replaced")>;

/// Connection -> itself, with the reason: the peer is known to be unusable (declared
/// unresponsive moments ago), so fail at once instead of waiting for a handshake to time out.
using unusable_atom = caf::atom_constant<caf::atom("unusable")>;

/// Room -> Connection, with the reason: a failed room's drain deadline passed while this peer
/// may still have writes of it in flight. The connection ends and fences the peer (its
/// registrations closed and its fabric connection cut), so the room may report Failed.
using fence_atom = caf::atom_constant<caf::atom("fence")>;

/// Engine -> Connection: the fence it asked for (engine::fence_peer) has happened.
using fenced_atom = caf::atom_constant<caf::atom("fenced")>;

/// Room -> itself: continue packing (Sender) or unpacking (Receiver) head-sliced KV. Copies run
/// on the actor in quanta of `copy_quantum_bytes`, so other messages (and other rooms on the
/// same worker) get their turn between quanta.
using pump_atom = caf::atom_constant<caf::atom("pump")>;
using unpack_atom = caf::atom_constant<caf::atom("unpack")>;
inline constexpr uint64_t copy_quantum_bytes = 8u << 20;

/// Register the serialized types on an actor system config (both daemons must do this).
void add_ferry_message_types(caf::actor_system_config& cfg);

}  // namespace ferry

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_info_ptr)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::metrics_snapshot)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::drain_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::client_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::client_gone)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::immediates_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::batch_done_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::room_update)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::memory_mapped)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::memory_released)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_ready)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_resources)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_inbound)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_down)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_outbound)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_lookup)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::landed_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::deadline_msg)
