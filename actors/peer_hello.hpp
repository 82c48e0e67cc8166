#pragma once
/// The handshake's words: what a daemon says of itself to a peer (`peer_hello`), and how it
/// judges what a peer says of itself before anything from it reaches the planner.

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "actors/context.hpp"
#include "actors/messages.hpp"
#include "core/auth.hpp"
#include "core/peer_checks.hpp"
#include "core/rails.hpp"

namespace ferry {

/// The highest peer protocol version this daemon speaks: `peer_protocol_version`, or 6 with the
/// test failpoint `peer_protocol_6` (FERRY_FAILPOINTS), or 9 with `peer_protocol_9`, so the
/// tests can run a daemon that behaves as one of an earlier version towards its peers (6: no
/// rails; 9: staging offsets in the prepare, no grants).
uint32_t spoken_peer_version();

/// "node/instance": how a peer is named before its control address is known.
std::string identity(const std::string& node, const std::string& instance);

/// What is described to a peer: each present pool (by kind), then staging (kind -1).
struct described_space {
  int kind;
  void* base;
  uint64_t length;
  transport::region_id global;  ///< the daemon's own local-only registration
};
std::vector<described_space> described_spaces(const daemon_context& ctx);

/// Our hello to a peer: our node, role, position and config, our fabric address, the memory
/// regions we describe to it, and (with a cluster secret) our nonce.
peer_hello describe_self(const daemon_context& ctx, const std::vector<peer_region>& regions,
                         const peer_region& staging, const bytes& nonce);

/// A peer's hello checked against our config (core/peer_checks.hpp, with the version we speak),
/// as the peer_info rooms use; its fabric address is added afterwards.
result<std::shared_ptr<peer_info>> validate_peer(const ferry_config& mine, const peer_hello& h,
                                                 bool we_decode, const std::string& address);

/// Our fabric endpoints, as `peer_rails` lists them (transport::engine::rails()).
peer_rails describe_rails(const transport::engine& engine);

/// What `engine::add_peer_rails` is asked for a peer that listed `theirs` (validated): each of
/// our rails beyond 0 paired with the peer's (`rails::pair_rails`), with its address.
std::vector<transport::peer_rail> rails_to_add(const transport::engine& engine,
                                               const peer_rails& theirs,
                                               const std::vector<rails::kind>& kinds);

}  // namespace ferry
