#pragma once
/// Every message exchanged by Ferry's actors, in one place.
///
/// Two boundaries:
/// - between daemons: the `peer_*` types of core/peer_messages.hpp, on Ferry's peer channel
///   (core/peer_wire.hpp, transport/channels/peer_link.hpp), exchanged only between the two
///   Connection actors of a peer pair; here they travel as local messages once received.
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
#include "core/peer_checks.hpp"
#include "core/peer_messages.hpp"
#include "core/peer_wire.hpp"
#include "core/plan.hpp"
#include "core/protocol.hpp"
#include "core/registration.hpp"
#include "core/status.hpp"
#include "transport/channels/client_gateway.hpp"
#include "transport/channels/peer_link.hpp"
#include "transport/engine.hpp"

namespace ferry {

// ---------------------------------------------------------------------------------------------
// Inside a daemon (local only)
// ---------------------------------------------------------------------------------------------

/// What a daemon knows of a connected peer; shared read-only by its rooms: what its hello said,
/// checked (core/peer_checks.hpp; the link's version is the highest both ranges hold, so a
/// cluster moves one daemon at a time), and where it is reached.
struct peer_info : checked_peer {
  std::string address;  ///< control address (connecting side) or node/instance
  transport::peer_handle fabric_peer = 0;
  /// The channel to the peer while this description holds: rooms write their messages on it
  /// themselves (`to_peer`). Weak: the link's deliver function holds this description, so a
  /// strong reference back would keep both alive for good where a link is never closed.
  std::weak_ptr<peer_link> channel;

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

// client_request and client_gone: transport/channels/client_gateway.hpp

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
  /// Prefill: the decode prepares the room's actor has taken (each one answered). The Scheduler
  /// forwards them in order, so those it forwarded beyond this count, which reached an actor that
  /// had already ended, are answered by the Scheduler (core/room_registry.hpp).
  uint32_t prepares = 0;
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
  peer_wire::message msg;
};

/// A room's message to its peer: written on the peer's channel from the room's own thread, no
/// hop through the Connection; through the Connection only where the room knows no channel.
/// Dropped once the channel is over, as the Connection drops it: its end is reported to the
/// room as the peer's loss by then.
void to_peer(const peer_info_ptr& peer, const caf::actor& connection, peer_wire::message m);

/// Peer gate -> Scheduler: the first message on an inbound link (it must be a `peer_hello`);
/// the link reads nothing more until a Connection binds it.
struct peer_link_first {
  peer_link_ptr link;
  peer_wire::message msg;
};

/// Peer gate -> Connection: its link ended other than by its own close; why.
struct link_closed {
  std::string reason;
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
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_link_first)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::link_closed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_region)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_hello)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_auth)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_refused)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_prepare)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_prepare_paged)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_prepare_ack)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_announce)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_outcome)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_drained)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_leaving)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_leaving_ack)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_rails)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_heartbeat)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_staging_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_staging_grant)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_prepare_checked)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_announce_checked)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_lookup)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::landed_msg)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::deadline_msg)
