#pragma once
/// How a daemon judges what a peer says of itself at handshake, before anything from it reaches
/// the planner: its hello (`check_peer_hello`) and the fabric endpoints it lists
/// (`check_peer_rails`). Pure: the Connection actor (actors/connection.cpp) feeds them what it
/// read and keeps only the I/O. Every refusal is `errc::peer_incompatible` and names the first
/// problem; tests/unit/test_peer_checks.cpp is the table.

#include <memory>
#include <string>
#include <vector>

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

/// A peer's `peer_rails`: at least one and at most `max_peer_rails` endpoints, each with an
/// address of 1 to 4096 bytes, the first a bulk rail (its hello's), at most one express rail.
/// Its endpoints' kinds, in order, for `rails::pair_rails`.
result<std::vector<rails::kind>> check_peer_rails(const peer_rails& m);

}  // namespace ferry
