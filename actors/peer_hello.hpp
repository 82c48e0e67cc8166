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

namespace ferry {

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
                         const peer_region& staging, const bytes& nonce, caf::actor self);

/// Validate a peer's hello against our config; `we_decode` says which side we are on this link.
/// The error names the first problem: protocol versions, roles, the peer's own config (it must
/// pass the same validation as ours), its declared position, the link plan between the two
/// layouts, and the regions it describes (`errc::peer_incompatible`). Pure: its fabric address
/// is added afterwards.
result<std::shared_ptr<peer_info>> validate_peer(const ferry_config& mine, const peer_hello& h,
                                                 bool we_decode, const std::string& address);

}  // namespace ferry
