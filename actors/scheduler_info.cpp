// The Scheduler's `info` answers: status, rooms, peers and pools as JSON documents, so that
// tools and tests read fields instead of parsing text (docs/protocol.md, "Info documents").

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <vector>

#include "actors/client_memory.hpp"
#include "actors/logging.hpp"
#include "actors/scheduler_state.hpp"
#include "core/plan.hpp"
#include "transport/channels/client_gateway.hpp"

namespace ferry::sched {

namespace {

// Keys in the order written: a document reads top-down as `ferryctl status` does.
using json = nlohmann::ordered_json;

json position(uint32_t rank, uint32_t size) { return {{"rank", rank}, {"size", size}}; }

json side_counts(const side_rooms& s) {
  return {{"active", s.active.size()},
          {"succeeded", s.succeeded},
          {"failed", s.failed},
          {"bytes", s.bytes}};
}

/// The log format and every logger's level now (set_log_level changes them).
json log_doc() {
  json levels = json::object();
  for (const auto& [logger, level] : logging::levels()) levels[logger] = level;
  return {{"format", logging::format()}, {"levels", std::move(levels)}};
}

/// Each fabric endpoint: what it has in flight and has posted since start.
json rails_doc(const transport::engine& engine) {
  json out = json::array();
  for (const auto& r : engine.rail_activity())
    out.push_back({{"rail", r.name},
                   {"express", r.express},
                   {"writes_in_flight", r.writes_in_flight},
                   {"bytes_in_flight", r.bytes_in_flight},
                   {"writes_posted", r.writes_posted},
                   {"bytes_posted", r.bytes_posted}});
  return out;
}

json status_doc(scheduler_state& st) {
  const auto& c = st.ctx->config;
  auto* staging = st.ctx->staging.get();
  const auto ready = st.ctx->ready();
  return {{"node", c.node_name},
          {"instance", st.ctx->instance},
          {"role", to_string(c.role)},
          {"provider", st.ctx->engine->provider_name()},
          {"tp", position(c.tp.rank, c.tp.size)},
          {"pp", position(c.pp.rank, c.pp.size)},
          {"listen", {{"control", c.control_listen}, {"client", c.client_listen}}},
          {"clients", st.ctx->gateway->connections()},
          {"polls_answered_at_once", st.ctx->board.answered()},
          {"requests_refused_at_once", st.ctx->refused_at_once.load(std::memory_order_relaxed)},
          {"peers", st.connections.size()},
          {"prefill", side_counts(st.prefill)},
          {"decode", side_counts(st.decode)},
          {"stray_writes", st.stray_writes},
          {"staging",
           {{"bytes", staging ? staging->bytes : 0},
            {"in_use", staging ? staging->in_use() : 0},
            {"waits", staging ? staging->waits() : 0},
            {"packed_bytes", staging ? staging->packed_bytes() : 0},
            {"unpacked_bytes", staging ? staging->unpacked_bytes() : 0}}},
          {"timers", st.ctx->timers ? st.ctx->timers->pending() : 0},
          {"draining", st.draining},
          {"ready", static_cast<bool>(ready)},
          {"not_ready", ready ? std::string() : ready.message},
          {"rails", rails_doc(*st.ctx->engine)},
          {"log", log_doc()}};
}

json rooms_doc(const scheduler_state& st) {
  // By side, then room id: the registry's hash order would change from one answer to the next.
  std::vector<std::tuple<int, uint64_t, const room_entry*>> all;
  for (const auto* side : {&st.prefill, &st.decode})
    for (const auto& [room, e] : side->active) all.emplace_back(side == &st.decode, room, &e);
  std::sort(all.begin(), all.end());
  json out = json::array();
  for (const auto& [decode, room, e] : all)
    out.push_back({{"room", room},
                   {"room_id", std::to_string(room)},  // the id exactly, whatever reads it
                   {"side", decode ? "decode" : "prefill"},
                   {"status", to_string(e->status)},
                   {"peer", e->peer}});
  return out;
}

json peers_doc(const scheduler_state& st) {
  std::vector<const peer_info*> ready;
  std::set<const peer_info*> draining;
  for (const auto& [conn, info] : st.connections)
    if (info) {
      ready.push_back(info.get());
      if (st.draining_peers.count(conn)) draining.insert(info.get());
    }
  std::sort(ready.begin(), ready.end(),
            [](const auto* a, const auto* b) { return a->address < b->address; });
  json out = json::array();
  for (const auto* info : ready) {
    const auto& s = info->schema;
    out.push_back({{"address", info->address},
                   {"node", info->node},
                   {"instance", info->instance},
                   {"tp", position(s.tp_rank, s.tp_size)},
                   {"pp", position(s.pp_rank, s.pp_size)},
                   {"dp", position(s.dp_rank, s.dp_size)},
                   {"link", info->link ? info->link->describe() : ""},
                   {"rails", st.ctx->engine->peer_rails(info->fabric_peer).size()},
                   {"state", draining.count(info) ? "draining" : "connected"}});
  }
  // Outbound connections still in their handshake: only their address is known yet.
  std::vector<std::string> connecting;
  for (const auto& [addr, conn] : st.outbound)
    if (auto it = st.connections.find(conn); it == st.connections.end() || !it->second)
      connecting.push_back(addr);
  std::sort(connecting.begin(), connecting.end());
  for (const auto& addr : connecting) out.push_back({{"address", addr}, {"state", "connecting"}});
  return out;
}

/// Runs of buffers of one shape (K, V, each state tensor, aux), as `ferryctl pools` lists them.
json buffer_groups(const pool_layout& p) {
  json out = json::array();
  const auto& b = p.buffers;
  for (size_t i = 0; i < b.size();) {
    size_t j = i;
    while (j < b.size() && b[j].kind == b[i].kind && b[j].tensor == b[i].tensor &&
           b[j].item_bytes == b[i].item_bytes)
      ++j;
    out.push_back({{"kind", to_string(b[i].kind)},
                   {"tensor", b[i].tensor},
                   {"buffers", j - i},
                   {"items", b[i].items},
                   {"item_bytes", b[i].item_bytes}});
    i = j;
  }
  return out;
}

/// What the pools document and a metrics scrape both say of one present pool.
struct pool_row {
  int kind = 0;
  bool client = false;
  client_pool::state state = client_pool::state::registered;
  uint64_t bytes = 0, items = 0, item_bytes = 0, in_use = 0;
};

std::vector<pool_row> pool_rows(const scheduler_state& st) {
  const auto& ctx = *st.ctx;
  // Items a decode's active rooms hold as destinations (dst_claims). A prefill holds none: its
  // rooms may share source pages (prefix caches), and the engine keeps them until terminal.
  const uint64_t held[pool_kind_count] = {st.claims->pages_held(), st.claims->slots_held(),
                                          st.claims->rows_held()};
  std::vector<pool_row> rows;
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& p = ctx.layout.pools[k];
    if (!p.present) continue;
    pool_row r{k, ctx.client_memory(k)};
    // A daemon pool is registered at start-up, or the daemon does not start.
    if (r.client) r.state = ctx.client_pools[k].now.load();
    r.bytes = p.total_bytes;
    r.items = p.buffers.empty() ? 0 : p.buffers[0].items;
    for (const auto& b : p.buffers) r.item_bytes += b.item_bytes;
    r.in_use = held[k];
    rows.push_back(r);
  }
  return rows;
}

json pools_doc(const scheduler_state& st) {
  const auto& ctx = *st.ctx;
  json out = json::object();
  for (const auto& r : pool_rows(st))
    out[to_string(static_cast<pool_kind>(r.kind))] = {
        {"memory", r.client ? "client" : "daemon"},
        {"registered", r.state == client_pool::state::registered},
        {"state", to_string(r.state)},
        {"shm_name", r.client ? "" : ctx.pools[r.kind].name()},
        {"bytes", r.bytes},
        {"items", r.items},
        {"item_bytes", r.item_bytes},
        {"in_use", r.in_use},
        {"free", r.items - std::min(r.items, r.in_use)},
        {"buffers", buffer_groups(ctx.layout.pools[r.kind])}};
  // What the state pool holds, and so whether its items are slots or pages.
  if (const auto& m = ctx.config.pools.mamba; m && out.contains("state"))
    out["state"]["type"] = to_string(m->type);
  return out;
}

}  // namespace

metrics_snapshot snapshot(scheduler_state& st) {
  metrics_snapshot s;
  for (const auto* side : {&st.prefill, &st.decode})
    for (const auto& [room, e] : side->active)
      ++s.active[side == &st.decode][static_cast<int>(e.status)];
  s.clients = st.ctx->gateway->connections();
  for (const auto& [conn, info] : st.connections) s.peers += info != nullptr;
  s.stray_writes = st.stray_writes;
  for (const auto& r : pool_rows(st))
    s.pools.push_back({to_string(static_cast<pool_kind>(r.kind)), r.client,
                       r.state == client_pool::state::registered, r.bytes, r.items, r.in_use});
  for (const auto& r : st.ctx->engine->rail_activity())
    s.rails.push_back(
        {r.name, r.writes_in_flight, r.bytes_in_flight, r.writes_posted, r.bytes_posted});
  if (auto* staging = st.ctx->staging.get()) {
    s.staging_bytes = staging->bytes;
    s.staging_in_use = staging->in_use();
    s.staging_waits = staging->waits();
    s.staging_packed = staging->packed_bytes();
    s.staging_unpacked = staging->unpacked_bytes();
  }
  return s;
}

void room_moved(scheduler_state& st, bool decode, room_entry& e, room_status to, errc code,
                uint64_t bytes) {
  if (to == e.status) return;
  const auto now = std::chrono::steady_clock::now();
  std::optional<latency_phase> phase;
  switch (e.status) {
    case room_status::bootstrapping:
      phase = latency_phase::bootstrapping;
      break;
    case room_status::waiting_for_input:
      phase = latency_phase::waiting;
      break;
    case room_status::transferring:
      phase = latency_phase::transferring;
      break;
    default:
      break;
  }
  if (phase) st.ctx->metrics->phase(decode, *phase, seconds_since(e.since, now));
  e.since = now;
  if (!is_terminal(to)) return;
  st.ctx->metrics->room_ended(decode, to, code, bytes);
  st.ctx->digest.room_ended(decode, to == room_status::success, code, bytes);
}

std::string info_json(scheduler_state& st, proto::info_topic topic) {
  switch (topic) {
    case proto::info_topic::status:
      return status_doc(st).dump();
    case proto::info_topic::rooms:
      return rooms_doc(st).dump();
    case proto::info_topic::peers:
      return peers_doc(st).dump();
    case proto::info_topic::pools:
      return pools_doc(st).dump();
    case proto::info_topic::timelines:
      return st.ctx->timelines.to_json().dump();
  }
  return "null";
}

}  // namespace ferry::sched
