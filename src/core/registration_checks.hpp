#pragma once
/// Whether a client's register_memory (docs/protocol.md) may be taken: checked against the
/// daemon's config and layout and where each of its `memory: client` pools stands. Pure: the
/// Scheduler's shell (actors/client_memory.cpp) measures the descriptors (each must be a
/// sealed memfd) between the two steps, and maps what passes. Every refusal is invalid_request
/// naming the pool and what is wrong; the order of the checks is the order of the refusals a
/// client sees. The table is tests/core/test_registration_checks.cpp.

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "core/config_types.hpp"
#include "core/errors.hpp"
#include "core/layout.hpp"
#include "core/protocol.hpp"
#include "core/registration.hpp"

namespace ferry {

/// Where a `memory: client` pool stands (the Scheduler moves it).
enum class client_pool_state : uint8_t { unregistered, registering, registered, releasing };
const char* to_string(client_pool_state s);

/// Whether pool `k` is described by its registration (pool_placement::registered).
bool registered_pool(const ferry_config& cfg, int k);

/// What the daemon knows of one pool when a registration arrives.
struct pool_standing {
  bool client = false;  ///< `memory: client`
  client_pool_state now = client_pool_state::unregistered;
  /// A pool its registration describes: the first registration's description, once made.
  const described_pool* described = nullptr;
};
using pool_standings = std::array<pool_standing, pool_kind_count>;

/// What a checked registration maps: for a pool the registration describes, that description.
struct registration_plan {
  std::optional<described_pool> described;
};

/// Before the descriptors are looked at: the pool is configured and engine memory, its state
/// type agrees with the config's, it is not registered or being released, and its memory kind
/// is one this build can map.
result<> check_registration_request(const ferry_config& cfg, const node_layout& layout,
                                    const pool_standings& pools, const proto::register_memory& req);

/// With the descriptors' sizes: for a pool the config describes, the table against its layout
/// (every buffer as laid out, within its descriptor at a page-aligned offset, no two
/// overlapping, no descriptor unused); for a pool the registration describes, the description it
/// makes (core/registration.hpp), the model catalogue's, validate_config's and, after the first
/// registration, that one's.
result<registration_plan> check_registration_layout(const ferry_config& cfg,
                                                    const node_layout& layout,
                                                    const pool_standings& pools,
                                                    const proto::register_memory& req,
                                                    const std::vector<uint64_t>& sizes);

}  // namespace ferry
