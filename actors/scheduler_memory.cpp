// Engine-owned memory (`memory: client` pools): a registration is mapped off the actor workers,
// and released, once its connection closes, only after its rooms ended and its peers are fenced.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "actors/client_memory.hpp"
#include "actors/scheduler_state.hpp"
#include "core/plan.hpp"
#include "transport/channels/client_gateway.hpp"

namespace ferry::sched {

/// register_memory: check the table and descriptors, then map and register off the actor
/// workers (memory_mapped answers the request).
void on_register_memory(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  const auto& m = std::get<proto::register_memory>(r.msg);
  auto plan = check_registration(*st.ctx, m, r.fds);
  if (!plan) {
    for (int fd : r.fds) close(fd);
    st.ctx->log_sched->warn("client conn={} register_memory refused: {}", r.conn, plan.message);
    return reply_error(self, r, std::move(plan).error());
  }
  const int k = static_cast<int>(m.pool);
  st.ctx->client_pools[k].now = client_pool::state::registering;
  st.ctx->client_pools[k].owner = r.conn;
  auto me = caf::actor_cast<caf::actor>(self);
  self->spawn<caf::detached>(
      [ctx = st.ctx, me, req = m, fds = std::move(r.fds), conn = r.conn, seq = r.seq,
       plan = std::move(plan.value)](caf::blocking_actor*, int k) {
        auto mapped = map_client_pool(*ctx, req, fds, plan);
        for (int fd : fds) close(fd);  // the mappings keep the memory
        caf::anon_send(me, memory_mapped{k, conn, seq, std::move(mapped), plan.described});
      },
      k);  // an argument: CAF 0.17 binds a null tuple for a function spawned without one (UBSan)
}

/// A registered pool's first registration is mapped: its description becomes the pool's config
/// and layout for the daemon's life (context.hpp, client_pool), and what a peer's hello carries.
void publish_description(scheduler_actor* self, int k, const described_pool& d) {
  auto& st = self->state;
  auto& ctx = *st.ctx;
  auto& pool = ctx.client_pools[k];
  if (pool.described) return;
  pool.described = d;
  if (k == static_cast<int>(pool_kind::kv)) ctx.config.pools.kv = d.section.kv;
  if (k == static_cast<int>(pool_kind::state)) ctx.config.pools.mamba = d.section.mamba;
  if (k == static_cast<int>(pool_kind::aux)) ctx.config.pools.aux = d.section.aux;
  ctx.layout.pools[k] = make_layout(d.section).pools[k];
  // No room was ever accepted before (the pool was never usable): size the claims anew.
  const auto& pools = ctx.config.pools;
  if (st.claims->held() == 0)
    st.claims.emplace(pools.kv ? pools.kv->pages : 0, pools.mamba ? pools.mamba->slots : 0,
                      pools.aux ? pools.aux->rows : 0);
  ctx.config_yaml = to_yaml(ctx.config);
  ctx.peer_config_yaml = to_yaml(ctx.config, yaml_for::peers);
  st.ctx->log_sched->info(
      "pool {}: described by its registration: {} buffers in {} bytes ({} "
      "descriptor spans)",
      to_string(static_cast<pool_kind>(k)), ctx.layout.pools[k].buffers.size(), d.bytes,
      d.spans.size());
}

/// Continue releasing client pools whose registering connection closed: once no room is active,
/// fence every peer (a decode's peers hold keys to the memory), then deregister and unmap.
void try_release(scheduler_actor* self) {
  auto& st = self->state;
  for (int k = 0; k < pool_kind_count; ++k) {
    if (st.ctx->client_pools[k].now.load() != client_pool::state::releasing) continue;
    if (!st.decode.active.empty() || !st.prefill.active.empty()) return;
    if (st.ctx->serves_decode() && !st.connections.empty()) {
      if (!st.release_fenced[k]) {
        st.release_fenced[k] = true;
        for (auto& [conn, info] : st.connections)
          self->send(conn, fence_atom::value,
                     fmt::format("fenced: the memory of pool {} is being released by its client",
                                 to_string(static_cast<pool_kind>(k))));
      }
      return;
    }
    if (st.release_unmapping[k]) continue;
    st.release_unmapping[k] = true;
    auto me = caf::actor_cast<caf::actor>(self);
    self->spawn<caf::detached>(
        [ctx = st.ctx, me](caf::blocking_actor*, int k) {
          caf::anon_send(me, memory_released{k, unmap_client_pool(*ctx, k)});
        },
        k);  // an argument: see on_register_memory
  }
}

/// The connection that registered client pool `k` closed: cancel every room (they all use the
/// pool), then release it (try_release).
void start_release(scheduler_actor* self, int k, const std::string& why) {
  auto& st = self->state;
  const auto name = to_string(static_cast<pool_kind>(k));
  st.ctx->client_pools[k].now = client_pool::state::releasing;
  st.release_fenced[k] = st.release_unmapping[k] = false;
  const auto reason = fmt::format("cancelled: the connection that registered pool {} closed", name);
  size_t rooms = 0;
  for (auto* side : {&st.prefill, &st.decode})
    for (auto& [room, e] : side->active) {
      self->send(e.actor, cancel_atom::value, reason);
      ++rooms;
    }
  st.ctx->log_sched->info(
      "pool {}: {}; cancelling {} room(s) and fencing the peers before its "
      "memory is released",
      name, why, rooms);
  try_release(self);
}

}  // namespace ferry::sched
