// Connection: one per peer daemon.
//
// Outbound (decode side, created for a prepare naming a prefill address): connect to the peer's
// published Scheduler through the middleman (asynchronously, never blocking a worker), send our
// `peer_hello`; the peer spawns an inbound Connection that validates it and answers with its own
// `peer_hello` (or `peer_refused`). Both sides then check version, roles, compatibility of the
// layouts and the memory regions, insert the fabric address, and monitor each other.
//
// Once ready, room messages from local rooms (`peer_outbound`) go to the remote Connection, and
// room messages from the remote go to the local Scheduler for routing. Messages from rooms that
// arrive before the handshake completes are queued.

#include <fmt/format.h>

#include <caf/io/all.hpp>

#include "actors/actors.hpp"

namespace ferry {
namespace {

struct connection_state {
  static inline const char* name = "ferry.connection";
  context_ptr ctx;
  caf::actor scheduler;
  std::string address;
  caf::actor remote;
  peer_info_ptr info;
  std::vector<caf::message> queued;
  std::vector<caf::response_promise> waiting;  // info requests before the handshake finished
  std::string failure;                         // why the connection ended (once done)
  bool done = false;
};

using connection_actor = caf::stateful_actor<connection_state>;

peer_hello make_hello(const daemon_context& ctx, caf::actor self) {
  peer_hello h;
  h.node = ctx.config.node_name;
  h.instance = ctx.instance;
  h.role = to_string(ctx.config.role);
  h.tp_size = ctx.config.tp.size;
  h.tp_rank = ctx.config.tp.rank;
  h.pp_size = ctx.config.pp.size;
  h.pp_rank = ctx.config.pp.rank;
  h.config_yaml = ctx.config_yaml;
  h.compat_hash = compatibility_hash(ctx.config.pools);
  h.fabric_address = ctx.engine->local_address();
  h.regions.resize(pool_kind_count);
  for (int k = 0; k < pool_kind_count; ++k) {
    if (!ctx.layout.pools[k].present) continue;
    auto d = ctx.engine->describe(ctx.regions[k]);
    h.regions[k] = {true, d.remote_base, d.key, d.length};
  }
  if (ctx.staging) {
    auto d = ctx.engine->describe(ctx.staging->region);
    h.staging = {true, d.remote_base, d.key, d.length};
  }
  h.connection = std::move(self);
  return h;
}

/// Validate a peer's hello; `we_decode` says which side we are on this link. The error names the
/// first problem.
std::variant<std::shared_ptr<peer_info>, std::string> validate_peer(const daemon_context& ctx,
                                                                    const peer_hello& h,
                                                                    bool we_decode,
                                                                    const std::string& address) {
  if (h.version != peer_protocol_version)
    return fmt::format("peer protocol version {} is not supported (this daemon speaks {})",
                       h.version, peer_protocol_version);
  if (we_decode && h.role == "decode")
    return fmt::format("peer {} has role decode; a prepare must name a prefill daemon", h.node);
  if (!we_decode && h.role == "prefill")
    return fmt::format(
        "peer {} has role prefill; only a decode daemon may connect to send prepares", h.node);
  // A peer's config is input like any other: it must pass the same validation as our own
  // before any size or count from it reaches the planner.
  auto parsed = parse_config_text(h.config_yaml);
  if (!parsed) return "peer config could not be read: " + parsed.error->what;
  if (auto e = validate_config(*parsed.config)) return "peer config is invalid: " + e->what;
  auto info = std::make_shared<peer_info>();
  info->address = address;
  info->node = h.node;
  info->instance = h.instance;
  info->pools = parsed.config->pools;
  if (compatibility_hash(info->pools) != h.compat_hash)
    return "peer compatibility hash does not match its own layout (corrupted handshake)";
  // The geometry a peer declares must be consistent with its own config.
  auto parsed_cfg = *parsed.config;
  if (parsed_cfg.tp.size != h.tp_size || parsed_cfg.tp.rank != h.tp_rank ||
      parsed_cfg.pp.size != h.pp_size || parsed_cfg.pp.rank != h.pp_rank)
    return "peer declared a TP/PP position that differs from its config (corrupted handshake)";
  info->schema = schema_of(parsed_cfg);
  const auto mine = schema_of(ctx.config);
  auto plan = we_decode ? make_link_plan(info->schema, mine) : make_link_plan(mine, info->schema);
  if (auto* e = std::get_if<std::string>(&plan)) {
    const auto& src = we_decode ? info->schema : mine;
    const auto& dst = we_decode ? mine : info->schema;
    if (src.tp_size == dst.tp_size && src.pp_size == dst.pp_size)
      return "incompatible layouts: " + *e;
    return fmt::format(
        "incompatible layouts (prefill TP {} rank {} PP {} stage {}, decode TP {} rank {} PP {} "
        "stage {}): {}",
        src.tp_size, src.tp_rank, src.pp_size, src.pp_rank, dst.tp_size, dst.tp_rank, dst.pp_size,
        dst.pp_rank, *e);
  }
  info->link = std::make_shared<link_plan>(std::get<link_plan>(std::move(plan)));
  info->layout = make_layout(info->pools);
  if (h.regions.size() != pool_kind_count)
    return fmt::format("peer sent {} memory regions, expected {}", h.regions.size(),
                       pool_kind_count);
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& r = h.regions[k];
    const auto& p = info->layout.pools[k];
    if (r.present != p.present || (p.present && r.length < p.total_bytes))
      return fmt::format("peer region for pool {} is {} bytes but its layout needs {}",
                         to_string(static_cast<pool_kind>(k)), r.length, p.total_bytes);
  }
  info->regions = h.regions;
  info->staging = h.staging;
  auto handle = ctx.engine->insert_peer(h.fabric_address);
  if (!handle) return "cannot add the peer's fabric address: " + handle.error;
  info->fabric_peer = handle.value;
  return info;
}

void finish(connection_actor* self, const std::string& reason) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  st.failure = reason;
  for (auto& rp : st.waiting) rp.deliver(peer_lookup{nullptr, reason});
  st.waiting.clear();
  st.ctx->log_peer->warn("peer={} connection closed: {}", st.address, reason);
  self->send(st.scheduler,
             peer_down{st.address, caf::actor_cast<caf::actor>(self), reason, st.info != nullptr});
  if (st.info) st.ctx->engine->remove_peer(st.info->fabric_peer);
  self->quit();
}

void become_ready(connection_actor* self, std::shared_ptr<peer_info> info, caf::actor remote) {
  auto& st = self->state;
  st.info = std::move(info);
  st.remote = std::move(remote);
  self->monitor(st.remote);
  st.ctx->log_peer->info("peer={} connected: node {} instance {}; link {}", st.address,
                         st.info->node, st.info->instance, st.info->link->describe());
  for (auto& rp : st.waiting) rp.deliver(peer_lookup{st.info, {}});
  st.waiting.clear();
  self->send(st.scheduler, peer_ready{st.address, st.info, {}});
  for (auto& m : st.queued) self->send(st.remote, std::move(m));
  st.queued.clear();
}

/// Behaviour shared by both directions once constructed.
caf::behavior relay(connection_actor* self, bool outbound) {
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.remote)
      finish(self, "peer went down: " + self->system().render(dm.reason));
  });
  auto inbound = [=](caf::message m) {
    auto& st = self->state;
    if (!st.info) return;  // not from a validated peer
    self->send(st.scheduler,
               peer_inbound{st.info, caf::actor_cast<caf::actor>(self), std::move(m)});
  };
  return {
      [=](info_atom) -> caf::result<peer_lookup> {
        auto& st = self->state;
        if (st.info) return peer_lookup{st.info, {}};
        if (st.done) return peer_lookup{nullptr, st.failure};
        auto rp = self->make_response_promise();
        st.waiting.push_back(rp);
        return caf::delegated<peer_lookup>();
      },
      [=](peer_outbound& o) {
        auto& st = self->state;
        if (st.remote)
          self->send(st.remote, std::move(o.msg));
        else
          st.queued.push_back(std::move(o.msg));
      },
      [=](peer_prepare& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_prepare_ack& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_announce& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_outcome& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_hello& h) {
        auto& st = self->state;
        if (!outbound || st.info) return;  // only the outbound side waits for the answer
        auto v = validate_peer(*st.ctx, h, true, st.address);
        if (auto* e = std::get_if<std::string>(&v)) {
          if (h.connection) self->send(h.connection, peer_refused{*e});
          finish(self, "handshake failed: " + *e);
          return;
        }
        become_ready(self, std::get<0>(std::move(v)), h.connection);
      },
      [=](peer_refused& r) { finish(self, "peer refused the handshake: " + r.reason); },
      [=](deadline_msg& d) {
        if (!self->state.info)
          finish(self, fmt::format("handshake did not complete within {} ms", d.ms));
      },
  };
}

caf::behavior outbound_behavior(connection_actor* self, context_ptr ctx, std::string address,
                                caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.address = address;
  st.scheduler = std::move(scheduler);
  const auto colon = address.rfind(':');
  const auto ms = st.ctx->config.timeouts.handshake_ms;
  self->delayed_send(self, std::chrono::milliseconds(ms), deadline_msg{"handshake", ms});
  int port = 0;
  if (colon != std::string::npos) port = std::atoi(address.c_str() + colon + 1);
  if (colon == std::string::npos || port <= 0 || port > 65535) {
    self->send(self,
               peer_refused{fmt::format("bad peer address '{}': expected host:port", address)});
    return relay(self, true);
  }
  auto host = address.substr(0, colon);
  auto mm = self->system().middleman().actor_handle();
  self->request(mm, std::chrono::milliseconds(ms), caf::connect_atom::value, host,
                static_cast<uint16_t>(port))
      .then(
          [=](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
            if (!ptr) {
              finish(self, fmt::format("no ferryd is published at {}", self->state.address));
              return;
            }
            auto remote_scheduler = caf::actor_cast<caf::actor>(ptr);
            self->send(remote_scheduler,
                       make_hello(*self->state.ctx, caf::actor_cast<caf::actor>(self)));
          },
          [=](caf::error& err) {
            finish(self, fmt::format("cannot connect to {}: {}", self->state.address,
                                     self->system().render(err)));
          });
  return relay(self, true);
}

caf::behavior inbound_behavior(connection_actor* self, context_ptr ctx, peer_hello hello,
                               caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.scheduler = std::move(scheduler);
  st.address = fmt::format("{}/{}", hello.node, hello.instance);
  auto v = validate_peer(*st.ctx, hello, false, st.address);
  if (auto* e = std::get_if<std::string>(&v)) {
    st.ctx->log_peer->warn("peer={} refused: {}", st.address, *e);
    if (hello.connection) self->send(hello.connection, peer_refused{*e});
    st.done = true;
    self->quit();
    return relay(self, false);
  }
  self->send(hello.connection, make_hello(*st.ctx, caf::actor_cast<caf::actor>(self)));
  become_ready(self, std::get<0>(std::move(v)), hello.connection);
  return relay(self, false);
}

}  // namespace

caf::actor spawn_outbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                     std::string address, caf::actor scheduler) {
  return parent->spawn<caf::monitored>(outbound_behavior, std::move(ctx), std::move(address),
                                       std::move(scheduler));
}

caf::actor spawn_inbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                    peer_hello hello, caf::actor scheduler) {
  return parent->spawn<caf::monitored>(inbound_behavior, std::move(ctx), std::move(hello),
                                       std::move(scheduler));
}

}  // namespace ferry
