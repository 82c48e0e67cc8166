#pragma once
/// The messages two daemons exchange on their peer channel (core/peer_wire.hpp encodes them),
/// only ever between the two Connection actors of a peer pair. They carry scalars and lists of
/// page indices; a Mamba state slot is always one scalar per side. Pure data: no CAF.

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.hpp"

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
/// 9: the messages travel on Ferry's own peer channel (core/peer_wire.hpp, preamble version 2),
/// no longer on CAF's BASP; `peer_leaving` is answered with `peer_leaving_ack`. Versions 5 to 8
/// remain in the range so a daemon can be asked (the test failpoints `peer_protocol_6` and `_9`) to
/// behave as an older one towards its peers; no released daemon speaks them on the channel.
/// 10: a decode whose room's KV lands in its staging reserves that staging when the prefill's
/// writes are about to start (`peer_staging_request`, `peer_staging_grant`), not at prepare; a
/// version-9 peer gets the staging offset in the prepare, as before.
/// 11: a decode that checks what lands (integrity.checksums, or the room's prepare asks for it,
/// client protocol 10) prepares with
/// `peer_prepare_checked`, and the prefill announces that link's writes with the digests of what
/// it sent (`peer_announce_checked`). A decode that checks refuses to use a prefill below
/// version 11.
inline constexpr uint32_t peer_protocol_version = 11;
inline constexpr uint32_t peer_paged_state_version = 8;
inline constexpr uint32_t peer_checksums_version = 11;
inline constexpr uint32_t peer_protocol_min_version = 5;

/// "No staging" in peer_prepare::dst_staging and peer_staging_grant::offset.
inline constexpr uint64_t no_staging = ~uint64_t{0};
/// In peer_prepare::dst_staging (version 10): the room's KV from this rank lands in the decode's
/// staging, at an offset granted when the prefill asks for it (`peer_staging_request`).
inline constexpr uint64_t staging_on_request = ~uint64_t{0} - 1;

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
  /// Challenge-response with the cluster secret (security.cluster_secret): each side sends a
  /// fresh nonce; the accepting side's hello carries its proof over both nonces, and the
  /// connecting side answers with `peer_auth`. Both empty when no secret is configured.
  std::vector<uint8_t> nonce;
  std::vector<uint8_t> proof;
  uint32_t min_version = peer_protocol_min_version;  ///< lowest version the sender speaks
};

/// Connecting side -> accepting side, after it verified the accepting side's proof: its own
/// proof of the cluster secret. The accepting side takes no room message before it.
struct peer_auth {
  std::vector<uint8_t> proof;
};

/// The accepting side refused the handshake (version, compatibility, role).
struct peer_refused {
  std::string reason;
};

/// Decode -> prefill: where room `room` must land. Exactly one destination slot and aux row.
struct peer_prepare {
  uint64_t room = 0;
  uint64_t token = 0;  ///< immediate data every write of this room must carry
  std::vector<uint32_t> dst_pages;
  uint32_t dst_state_slot = no_index;
  uint32_t dst_aux_row = no_index;
  /// Offset in the decode's staging region reserved for this room's head-sliced KV from this
  /// prefill rank (link kv_mode::unpack), or no_staging: write each token's slice directly, or
  /// (version 10) staging_on_request: ask for the offset before the first write.
  uint64_t dst_staging = no_staging;
  uint32_t prefix_tokens = 0;  ///< the decode engine's prepare.prefix_tokens (decode_prefix_len)
};

/// Decode -> prefill (version 8): a prepare whose state pool is indexed by pages (swa, dsa,
/// minimax_index_k) names those pages too, in the order the engine gave them.
struct peer_prepare_paged {
  peer_prepare prepare;
  std::vector<uint32_t> dst_state_pages;
};

/// Decode -> prefill (version 11): a prepare whose room checks what lands (integrity.checksums or
/// the client's prepare.checksum):
/// the prefill announces with the digests of what it sent (`peer_announce_checked`). A paged state
/// pool's pages come in `dst_state_pages` (empty otherwise).
struct peer_prepare_checked {
  peer_prepare prepare;
  std::vector<uint32_t> dst_state_pages;
};

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

/// Prefill -> decode: every write of the room has been posted; `total_writes` will land.
struct peer_announce {
  uint64_t room = 0;
  uint64_t token = 0;
  uint64_t total_writes = 0;
  uint64_t total_bytes = 0;
};

/// Prefill -> decode (version 11): the announcement of a link prepared with
/// `peer_prepare_checked`, with the XXH3-64 digests of what this rank sent the link, one per
/// buffer pair in the order of core/room_digest.hpp.
struct peer_announce_checked {
  peer_announce announce;
  std::vector<uint64_t> digests;
};
/// The most digests one peer_announce_checked carries (a link's buffer pairs: KV, state, aux).
inline constexpr uint32_t max_room_digests = 16384;

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

/// Connection -> Connection (version 6): this daemon began a stop. It finishes the rooms it
/// accepted and takes no new one; new rooms naming it should fail at once with `draining`.
struct peer_leaving {
  std::string reason;
};
inline constexpr uint32_t peer_leaving_version = 6;

/// Connection -> Connection (version 9): the answer to `peer_leaving`. The draining daemon's
/// drain waits for it (or for timeouts.heartbeat_ms), so its goodbye is known to have arrived.
struct peer_leaving_ack {};
inline constexpr uint32_t peer_leaving_ack_version = 9;

/// Prefill -> decode (version 10), for a link prepared with `staging_on_request`: the room's
/// first send arrived, so its writes are about to start; the decode reserves the room's staging
/// (queueing while it is full) and answers with `peer_staging_grant`. Sent once per link.
struct peer_staging_request {
  uint64_t room = 0;
  uint64_t token = 0;
};
/// Decode -> prefill (version 10): where this link's KV lands in the decode's staging, or
/// no_staging: write it directly (staging was full and the room's block was only worth having).
/// No write of the link's KV is posted before it.
struct peer_staging_grant {
  uint64_t room = 0;
  uint64_t token = 0;
  uint64_t offset = no_staging;
};
inline constexpr uint32_t peer_late_staging_version = 10;

/// One of a daemon's fabric endpoints, as `peer_rails` lists them (transport::rail_desc).
struct peer_rail_desc {
  std::vector<uint8_t> fabric_address;
  bool express = false;  ///< carries only small batches (fabric.express_bytes)
};

/// Connection -> Connection (version 7): the sender's fabric endpoints, rail 0 (the one its
/// hello named) first. The prefill side sends its own once ready; the decode side, once it has
/// made the prefill's known on its own rails (so its fence can cut them), answers with its
/// own; only then does the prefill write on them. Each side pairs the two lists alike
/// (core/rails.hpp). Memory keys are the same on every rail, so no key travels here.
struct peer_rails {
  std::vector<peer_rail_desc> rails;
};
inline constexpr uint32_t peer_rails_version = 7;
/// The most endpoints a peer may list.
inline constexpr size_t max_peer_rails = 64;

/// Connection <-> Connection liveness: sent every timeouts.heartbeat_ms by both sides; a peer
/// from which nothing arrived for heartbeat_ms x heartbeat_misses is declared dead.
struct peer_heartbeat {};

}  // namespace ferry
