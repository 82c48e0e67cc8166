#pragma once
/// Client-owned pools (`memory: client`, docs/protocol.md register_memory): checking a client's
/// buffer table and descriptors against the config, mapping them into the pool's reserved
/// address range and registering it with the fabric, and undoing that. The Scheduler drives
/// the states (actors/context.hpp, client_pool); the mapping and the fabric calls run off the
/// actor workers (a detached actor), since a registration waits for the progress thread.

#include <optional>
#include <string>
#include <vector>

#include "actors/context.hpp"
#include "core/protocol.hpp"
#include "core/registration_checks.hpp"

namespace ferry {

/// Reserve the address range of every `memory: client` pool (no access until registered).
result<> reserve_client_pools(daemon_context& ctx);

/// Why `req` (with the descriptors that came with it) cannot be registered (invalid_request).
/// Checks the pool, its state, the memory kind and every descriptor (a sealed memfd); then, for
/// a pool the config describes, the table against its layout (large enough, aligned offsets, no
/// overlaps), and for a pool the registration describes, the description it makes (core/
/// registration.hpp, validate_config, and the first registration's). Touches nothing.
result<registration_plan> check_registration(const daemon_context& ctx,
                                             const proto::register_memory& req,
                                             const std::vector<int>& fds);

/// Reserve the backing of every buffer, map the buffers at their layout offsets (a described
/// pool: each descriptor's span at its place, reserving the range at the first registration)
/// and register the pool for local access (ctx.regions). Blocking (mmap, fallocate, the
/// progress thread): call it off the actor workers. On failure the range is reserved again and
/// nothing stays registered. Does not close `fds`.
result<> map_client_pool(daemon_context& ctx, const proto::register_memory& req,
                         const std::vector<int>& fds, const registration_plan& plan);

/// Whether pool `k` is described by its registration (pool_placement::registered).
bool registered_pool(const daemon_context& ctx, int k);

/// Why this daemon cannot describe itself to a peer yet: a pool its registration describes has
/// not been registered (the text a refused handshake carries), or nothing. Scheduler only.
std::optional<std::string> undescribed_pool(const daemon_context& ctx);

/// Deregister pool `k` and drop the client's memory from its range (reserved again, no
/// access). Blocking, like map_client_pool.
result<> unmap_client_pool(daemon_context& ctx, int k);

}  // namespace ferry
