#pragma once
/// How a daemon judges what a peer says, before anything from it reaches the planner: at
/// handshake its hello (`check_peer_hello`) and the fabric endpoints it lists
/// (`check_peer_rails`); then, on a prefill, each decode rank's prepare and staging grant
/// against what that rank declared (`check_prepare_indices`, `check_staging_offset`). Pure: the
/// Connection and Sender actors feed them what they read and keep only the I/O. A handshake's
/// refusals are `errc::peer_incompatible`, a prepare's `errc::invalid_request`; each names the
/// first problem; tests/core/test_peer_checks.cpp is the table.

#include <memory>
#include <string>
#include <vector>

#include "core/auth.hpp"
#include "core/config.hpp"
#include "core/errors.hpp"
#include "core/geometry.hpp"
#include "core/layout.hpp"
#include "core/peer_messages.hpp"
#include "core/rails.hpp"

namespace ferry {

/// What a valid hello says of its peer.
struct checked_peer {
  std::string node;
  std::string instance;
  uint32_t version = 0;  ///< the link's peer protocol version: the highest both ranges hold
  pools_config pools;
  node_layout layout;
  std::vector<peer_region> regions;
  peer_region staging;
  rank_schema schema;                       ///< the peer's pools and TP/PP position
  std::vector<std::string> instance_ranks;  ///< its config's discovery.instance_ranks
  std::shared_ptr<const link_plan> link;    ///< prefill -> decode plan for the pair
};

/// A peer's hello against our config `mine`; `we_decode` says which side we are on this link,
/// `spoken` the highest peer protocol version we speak. Checked in order: protocol versions,
/// roles, the peer's own config (it must pass the same validation as ours, with every pool
/// described), a paged state pool against the pair's version, its compatibility hash, its
/// declared TP/PP position against its config, the link plan between the two layouts, the
/// regions it describes (one per pool kind, each as long as its layout needs) and its fabric
/// address.
result<checked_peer> check_peer_hello(const ferry_config& mine, const peer_hello& h, bool we_decode,
                                      uint32_t spoken);

/// Accepting side, before the hello's contents: the challenge a connecting peer offers. Where
/// we hold a cluster secret its hello must carry a nonce of `auth_nonce_bytes`; where we hold
/// none it must carry no nonce (the peer would wait for a proof we cannot give).
result<> check_peer_challenge(bool we_have_secret, const peer_hello& h);

/// Connecting side, with a cluster secret: the accepting peer's proof over our nonce `ours` and
/// its own. The index in `secrets` of the secret that proves it (for rotation's metrics), or a
/// refusal naming the peer: no proof at all, or one no secret of ours matches.
result<int> check_peer_proof(const cluster_secrets& secrets, const bytes& ours,
                             const peer_hello& h);

/// A peer's `peer_rails`: at least one and at most `max_peer_rails` endpoints, each with an
/// address of 1 to 4096 bytes, the first a bulk rail (its hello's), at most one express rail.
/// Its endpoints' kinds, in order, for `rails::pair_rails`.
result<std::vector<rails::kind>> check_peer_rails(const peer_rails& m);

/// A decode rank's prepare, before a write is planned from it (`errc::invalid_request`, naming
/// the room and the field; a buggy or hostile peer never gets a write outside its pools): its
/// pages, its state slot or pages (one slot when our state pool takes slots, "mamba requires
/// single state index" when it names none), its aux row, and its staging offset. `mine` and
/// `my_layout` are this prefill's pools, `from` what the decode rank's hello said.
result<> check_prepare_indices(const pools_config& mine, const node_layout& my_layout,
                               const checked_peer& from, const peer_prepare& p,
                               const std::vector<uint32_t>& state_pages);

/// A staging offset for `pages` pages of room `room`: the link's landing block must lie inside
/// the decode's staging region. `staging_on_request` passes only where the link speaks the
/// version of late grants and something of it lands in staging.
result<> check_staging_offset(const checked_peer& from, uint64_t room, uint64_t offset,
                              size_t pages);

}  // namespace ferry
