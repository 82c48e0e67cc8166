// Scheduler: one per daemon; peers reach it through the peer gate (actors/peer_gate.hpp).
//
// Owns the room registry (active rooms and a bounded history of finished ones for poll),
// validates every client request before any room actor sees it, spawns Senders, Receivers and
// Connections, routes peer messages and arrived immediates to rooms, and pushes status events to
// subscribed clients.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <deque>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "actors/actors.hpp"
#include "actors/client_gateway.hpp"
#include "actors/client_memory.hpp"
#include "core/dst_claims.hpp"
#include "core/plan.hpp"

namespace ferry {
namespace {

constexpr size_t history_limit = 65536;

struct room_entry {
  caf::actor actor;
  std::vector<caf::actor> connections;  // the peers the room exchanges messages with
  room_status status = room_status::bootstrapping;
  uint32_t prefix_tokens = 0;  // prefill: the decode's prefix (room_update)
  std::string peer;
  uint64_t token = 0;   // decode: first token of the room's links (one per named peer)
  uint32_t tokens = 0;  // decode: how many
  std::vector<uint64_t> subscribers;  // client connections
  std::optional<uint64_t> owner;      // client connection whose close cancels the room
  // decode: the destination indices it claimed (released at its terminal state)
  std::vector<uint32_t> dst_pages;
  uint32_t dst_slot = no_index, dst_row = no_index;
  // decode: the room's actor ended abnormally; the room fails once these links are fenced
  std::vector<caf::actor> awaiting_fence;
  std::string orphan_reason;
};

struct finished_room {
  room_status status;
  std::string reason;
  errc code = errc::ok;
  uint32_t prefix_tokens = 0;
};

/// Rooms of one side. A room id may be reused after its terminal state: lookups check `active`
/// first, and the new incarnation's outcome overwrites the old one in `finished`.
struct side_rooms {
  std::unordered_map<uint64_t, room_entry> active;
  std::unordered_map<uint64_t, finished_room> finished;
  std::deque<uint64_t> finished_order;
  uint64_t succeeded = 0, failed = 0, bytes = 0;

  void finish(uint64_t room, room_status s, std::string reason, errc code,
              uint32_t prefix_tokens = 0) {
    active.erase(room);
    if (finished.insert_or_assign(room, finished_room{s, std::move(reason), code, prefix_tokens})
            .second)
      finished_order.push_back(room);
    while (finished_order.size() > history_limit) {
      finished.erase(finished_order.front());
      finished_order.pop_front();
    }
  }
};

struct scheduler_state {
  static inline const char* name = "ferry.scheduler";
  context_ptr ctx;
  caf::actor basp;  // CAF's BASP broker, for outbound Connections (actors/peer_gate.hpp)
  side_rooms prefill, decode;
  std::optional<dst_claims> claims;  // decode: which active room holds each destination index
  /// Decode: token (immediate value and epoch of one link of one room incarnation) -> room.
  /// Tokens are never reused in a daemon's life, so a late message or write of an ended room
  /// finds nothing here.
  std::unordered_map<uint64_t, uint64_t> token_room;
  /// Prefill, v4: rooms polled before anything of them arrived, and when first polled (bounded
  /// by history_limit, oldest forgotten first).
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> polled_unknown;
  std::deque<uint64_t> polled_unknown_order;
  uint64_t next_token = 1;
  std::unordered_map<std::string, caf::actor> outbound;       // by control address
  std::unordered_map<caf::actor, peer_info_ptr> connections;  // every live connection
  /// The registrations each ready connection's peer may write into, to fence them should the
  /// Connection end abnormally (normally it fences them itself).
  std::unordered_map<caf::actor, std::vector<transport::region_id>> fences;
  uint64_t stray_writes = 0;  // immediates of unknown rooms
  /// Tokens of recently ended decode rooms (bounded), so a write that lands after its room's
  /// terminal state (which should never happen; see docs/reliability.md §4 for the one known
  /// case) is reported naming the room and peer, not just counted.
  std::unordered_map<uint64_t, std::string> ended_tokens;
  std::deque<uint64_t> ended_order;
  std::unordered_set<uint64_t> owning_clients;  // said hello with cancel_on_disconnect
  std::unordered_set<uint64_t> clients;         // said hello, still connected
  /// Client pools being released: whether their peers were told to fence, and whether the
  /// unmapping is under way.
  std::array<bool, pool_kind_count> release_fenced{}, release_unmapping{};
  /// Outbound peers declared unresponsive: why, and until when new rooms fail at once.
  std::unordered_map<std::string, std::pair<std::string, std::chrono::steady_clock::time_point>>
      unresponsive;
};

/// The connection that created a room owns it if its hello asked for that.
std::optional<uint64_t> owner_of(const scheduler_state& st, const client_request& r) {
  if (st.owning_clients.count(r.conn)) return r.conn;
  return std::nullopt;
}

using scheduler_actor = caf::stateful_actor<scheduler_state>;

void reply_error(scheduler_actor* self, const client_request& r, errc code, std::string text) {
  // Request-related lines carry room= and peer= (the prefill peer a prepare names, else "-").
  std::string room = "-", peer = "-";
  std::visit(
      [&](const auto& m) {
        if constexpr (requires { m.room; }) room = std::to_string(m.room);
        if constexpr (requires { m.prefill_peers; })
          peer = fmt::format("{}", fmt::join(m.prefill_peers, ","));
      },
      r.msg);
  self->state.ctx->log_sched->info("room={} peer={} client conn={} {} rejected: {}", room, peer,
                                   r.conn, proto::to_string(proto::type_of(r.msg)), text);
  self->state.ctx->gateway->reply(r.conn, r.seq, proto::error{code, std::move(text)});
}

/// Checks shared by prepare and the last send: exactly one state slot and one aux row when the
/// pools exist, none when they do not.
std::optional<std::string> check_slot_and_row(const daemon_context& ctx, uint64_t room,
                                              const char* side, uint32_t slot, uint32_t row) {
  const auto& l = ctx.layout;
  if (l[pool_kind::state].present) {
    const auto slots = ctx.config.pools.mamba->slots;
    if (slot == no_index)
      return fmt::format(
          "mamba requires single state index: room {} got {}=none (exactly one {} state slot is "
          "required)",
          room, side, side);
    if (slot >= slots)
      return fmt::format("room {}: {} state slot {} is outside the pool of {} slots", room, side,
                         slot, slots);
  } else if (slot != no_index) {
    return fmt::format("room {}: {} state slot {} given but this daemon has no mamba pool", room,
                       side, slot);
  }
  if (l[pool_kind::aux].present) {
    const auto rows = ctx.config.pools.aux->rows;
    if (row == no_index)
      return fmt::format("room {}: exactly one {} aux row is required", room, side);
    if (row >= rows)
      return fmt::format("room {}: {} aux row {} is outside the pool of {} rows", room, side, row,
                         rows);
  } else if (row != no_index) {
    return fmt::format("room {}: {} aux row {} given but this daemon has no aux pool", room, side,
                       row);
  }
  return std::nullopt;
}

std::optional<std::string> check_pages(const daemon_context& ctx, uint64_t room,
                                       const std::vector<uint32_t>& pages, const char* what) {
  if (pages.empty()) return std::nullopt;
  if (!ctx.config.pools.kv)
    return fmt::format("room {}: {}s given but this daemon has no kv pool", room, what);
  if (auto e = check_indices(pages, ctx.config.pools.kv->pages, what, "pages"))
    return fmt::format("room {}: {}", room, *e);
  return std::nullopt;
}

/// Admission: a bounded number of non-terminal rooms per side, so one runaway client cannot
/// exhaust the daemon for everyone else.
std::optional<std::string> admission(const scheduler_state& st, const side_rooms& side,
                                     const char* name) {
  if (auto why = st.ctx->pools_unusable(); !why.empty()) return why;
  const auto limit = st.ctx->config.limits.max_active_rooms;
  if (side.active.size() < limit) return std::nullopt;
  return fmt::format(
      "admission refused: {} rooms already active on the {} side (limits.max_active_rooms = {})",
      side.active.size(), name, limit);
}

void notify_subscribers(scheduler_actor* self, const room_entry& e, uint64_t room, room_status s,
                        const std::string& reason, errc code) {
  for (auto c : e.subscribers)
    self->state.ctx->gateway->push(c, proto::event{room, s, reason, code, e.prefix_tokens});
}

void try_release(scheduler_actor* self);

/// A room whose actor ended without a terminal status: Failed, its claims released.
void fail_orphan(scheduler_actor* self, side_rooms& side, uint64_t room, std::string reason) {
  auto& st = self->state;
  auto it = side.active.find(room);
  if (it == side.active.end()) return;
  room_entry& e = it->second;
  notify_subscribers(self, e, room, room_status::failed, reason, errc::internal);
  if (&side == &st.decode) {
    for (uint32_t i = 0; i < e.tokens; ++i) st.token_room.erase(e.token + i);
    st.claims->release(room, e.dst_pages, e.dst_slot, e.dst_row);
  }
  st.ctx->log_sched->info("room={} side={} Failed: {}", room,
                          &side == &st.decode ? "decode" : "prefill", reason);
  ++side.failed;
  side.finish(room, room_status::failed, std::move(reason), errc::internal);
  try_release(self);
}

caf::actor connection_for(scheduler_actor* self, const std::string& address) {
  auto& st = self->state;
  auto it = st.outbound.find(address);
  if (it != st.outbound.end()) return it->second;
  std::string known_down;
  if (auto u = st.unresponsive.find(address); u != st.unresponsive.end()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        u->second.second - std::chrono::steady_clock::now());
    if (left.count() > 0)
      known_down = fmt::format("{} (not retried for another {} ms)", u->second.first, left.count());
    else
      st.unresponsive.erase(u);
  }
  auto conn = spawn_outbound_connection(self, st.ctx, st.basp, address,
                                        caf::actor_cast<caf::actor>(self), std::move(known_down));
  st.outbound.emplace(address, conn);
  st.connections.emplace(conn, nullptr);
  return conn;
}

void on_prepare(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  auto& p = std::get<proto::prepare>(r.msg);
  if (!st.ctx->serves_decode())
    return reply_error(
        self, r, errc::wrong_role,
        fmt::format("room {}: prepare is a decode operation; this daemon's role is prefill",
                    p.room));
  if (st.decode.active.count(p.room))
    return reply_error(
        self, r, errc::duplicate_room,
        fmt::format("duplicate room {}: it is already active on this decode daemon", p.room));
  if (auto e = admission(st, st.decode, "decode"))
    return reply_error(self, r, errc::invalid_request, fmt::format("room {}: {}", p.room, *e));
  if (p.prefill_peers.empty())
    return reply_error(self, r, errc::invalid_request,
                       fmt::format("room {}: no prefill peer named", p.room));
  if (const uint32_t page = st.ctx->config.pools.kv ? st.ctx->config.pools.kv->page_tokens : 0;
      p.prefix_tokens && (page == 0 || p.prefix_tokens % page != 0))
    return reply_error(self, r, errc::invalid_request,
                       page == 0 ? fmt::format("room {}: prefix_tokens {} named, but this daemon "
                                               "has no kv pool",
                                               p.room, p.prefix_tokens)
                                 : fmt::format("room {}: prefix_tokens {} is not a multiple of "
                                               "the page size {} (pools.kv.page_tokens)",
                                               p.room, p.prefix_tokens, page));
  for (size_t i = 0; i < p.prefill_peers.size(); ++i) {
    if (p.prefill_peers[i].empty())
      return reply_error(self, r, errc::invalid_request,
                         fmt::format("room {}: prefill peer {} is empty", p.room, i));
    if (!valid_host_port(p.prefill_peers[i]))
      return reply_error(self, r, errc::invalid_request,
                         fmt::format("room {}: prefill peer {} '{}' is not host:port (a port in "
                                     "1..65535)",
                                     p.room, i, p.prefill_peers[i]));
    for (size_t j = 0; j < i; ++j)
      if (p.prefill_peers[j] == p.prefill_peers[i])
        return reply_error(
            self, r, errc::invalid_request,
            fmt::format("room {}: prefill peer {} is named twice", p.room, p.prefill_peers[i]));
  }
  if (auto e = check_pages(*st.ctx, p.room, p.dst_pages, "dst page"))
    return reply_error(self, r, errc::invalid_request, *e);
  if (auto e = check_slot_and_row(*st.ctx, p.room, "dst", p.state_slot, p.aux_row))
    return reply_error(self, r, errc::invalid_request, *e);
  if (auto e = st.claims->claim(p.room, p.dst_pages, p.state_slot, p.aux_row))
    return reply_error(self, r, errc::invalid_request, *e);
  auto dst_pages = p.dst_pages;
  const auto dst_slot = p.state_slot, dst_row = p.aux_row;
  const uint64_t token = st.next_token;
  const auto tokens = static_cast<uint32_t>(p.prefill_peers.size());
  st.next_token += tokens;
  std::vector<caf::actor> conns;
  for (const auto& addr : p.prefill_peers) conns.push_back(connection_for(self, addr));
  auto room = p.room;
  auto peer = fmt::format("{}", fmt::join(p.prefill_peers, ","));
  st.ctx->log_sched->debug("room={} peer={} prepare: {} pages", room, peer, p.dst_pages.size());
  auto actor =
      spawn_receiver(self, st.ctx, std::move(p), token, conns, caf::actor_cast<caf::actor>(self));
  room_entry& e = (st.decode.active[room] = room_entry{});
  e.actor = actor;
  e.connections = conns;
  e.peer = peer;
  e.token = token;
  e.tokens = tokens;
  e.owner = owner_of(st, r);
  e.dst_pages = std::move(dst_pages);
  e.dst_slot = dst_slot;
  e.dst_row = dst_row;
  for (uint32_t i = 0; i < tokens; ++i) st.token_room[token + i] = room;
  st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
}

/// Why a send for `room` is refused because that room already finished, or nullopt.
std::optional<std::string> finished_send(const scheduler_state& st, uint64_t room) {
  auto done = st.prefill.finished.find(room);
  if (done == st.prefill.finished.end()) return std::nullopt;
  const auto* status = to_string(done->second.status);
  return fmt::format("room {} already finished ({}); send after {} is rejected", room, status,
                     status);
}

void on_send(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  const auto& s = std::get<proto::send>(r.msg);
  const auto& ctx = *st.ctx;
  if (!ctx.serves_prefill())
    return reply_error(
        self, r, errc::wrong_role,
        fmt::format("room {}: send is a prefill operation; this daemon's role is decode", s.room));
  if (auto why = ctx.pools_unusable(); !why.empty())  // before any look at the pools' memory
    return reply_error(self, r, errc::invalid_request, fmt::format("room {}: {}", s.room, why));
  if (auto e = check_pages(ctx, s.room, s.src_pages, "src page"))
    return reply_error(self, r, errc::invalid_request, *e);
  if (s.last) {
    if (auto e = check_slot_and_row(ctx, s.room, "src", s.state_slot, s.aux_row))
      return reply_error(self, r, errc::invalid_request, *e);
    if (ctx.layout[pool_kind::aux].present) {
      // The aux row carries the room id: a wrong row would deliver another request's metadata.
      uint64_t stored = 0;
      std::memcpy(&stored,
                  ctx.base(space::aux) + ctx.layout[pool_kind::aux].buffers[0].offset +
                      uint64_t{s.aux_row} * ctx.config.pools.aux->row_bytes,
                  sizeof(stored));
      if (stored != s.room)
        return reply_error(self, r, errc::invalid_request,
                           fmt::format("room {}: src aux row {} carries room id {}, expected {}",
                                       s.room, s.aux_row, stored, s.room));
    }
  } else if (s.state_slot != no_index || s.aux_row != no_index) {
    return reply_error(
        self, r, errc::invalid_request,
        fmt::format("room {}: state slot and aux row go only with the last chunk", s.room));
  }
  auto it = st.prefill.active.find(s.room);
  if (it == st.prefill.active.end()) {
    if (auto e = finished_send(st, s.room)) return reply_error(self, r, errc::room_finished, *e);
    if (auto e = admission(st, st.prefill, "prefill"))
      return reply_error(self, r, errc::invalid_request, fmt::format("room {}: {}", s.room, *e));
    auto actor = spawn_sender(self, st.ctx, s.room, caf::actor_cast<caf::actor>(self));
    it = st.prefill.active.emplace(s.room, room_entry{}).first;
    it->second.actor = actor;
  }
  if (!it->second.owner) it->second.owner = owner_of(st, r);
  // The Sender answers the chunk. As a request, a chunk that reaches it after it ended (its
  // room turned terminal while the chunk was on its way) bounces back here and is answered,
  // so every send gets exactly one reply.
  const uint64_t room = s.room;
  const client_request head{
      r.conn, r.seq, proto::send{room, {}, false, no_index, no_index}, r.version, {}};
  self->request(it->second.actor, caf::infinite, std::move(r))
      .then([] {},
            [=](caf::error&) {
              auto& st = self->state;
              auto why = finished_send(st, room);
              reply_error(
                  self, head, errc::room_finished,
                  why ? *why : fmt::format("room {} ended before this chunk reached it", room));
            });
}

/// What a poll of `room` answers, or nothing for a room unknown here. On a prefill daemon in
/// protocol v4 an unknown room is Bootstrapping (the decode's prepare and the engine's first
/// send may not have arrived yet) until timeouts.bootstrapping_ms after its first such poll.
std::optional<proto::poll_reply> room_poll(scheduler_state& st, uint64_t room, uint16_t version) {
  for (auto* side : {&st.decode, &st.prefill})
    if (auto it = side->active.find(room); it != side->active.end()) {
      st.polled_unknown.erase(room);
      return proto::poll_reply{room, it->second.status, {}, errc::ok, it->second.prefix_tokens};
    }
  for (auto* side : {&st.decode, &st.prefill})
    if (auto it = side->finished.find(room); it != side->finished.end()) {
      st.polled_unknown.erase(room);
      return proto::poll_reply{room, it->second.status, it->second.reason, it->second.code,
                               it->second.prefix_tokens};
    }
  if (version < 4 || !st.ctx->serves_prefill()) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  auto [it, fresh] = st.polled_unknown.try_emplace(room, now);
  if (fresh) {
    st.polled_unknown_order.push_back(room);
    while (st.polled_unknown_order.size() > history_limit) {
      st.polled_unknown.erase(st.polled_unknown_order.front());
      st.polled_unknown_order.pop_front();
    }
  }
  const auto ms = st.ctx->config.timeouts.bootstrapping_ms;
  if (now - it->second < std::chrono::milliseconds(ms))
    return proto::poll_reply{room, room_status::bootstrapping, {}, errc::ok};
  return proto::poll_reply{
      room, room_status::failed,
      fmt::format("timed out in Bootstrapping after {} ms: no prepare from a decode and no send "
                  "arrived (timeouts.bootstrapping_ms)",
                  ms),
      errc::timed_out};
}

void on_poll(scheduler_actor* self, client_request& r, uint64_t room) {
  auto& st = self->state;
  if (auto p = room_poll(st, room, r.version)) return st.ctx->gateway->reply(r.conn, r.seq, *p);
  reply_error(self, r, errc::unknown_room, fmt::format("unknown room {}", room));
}

void on_poll_many(scheduler_actor* self, client_request& r, const std::vector<uint64_t>& rooms) {
  auto& st = self->state;
  proto::poll_many_reply out;
  out.rooms.reserve(rooms.size());
  for (auto room : rooms) {
    auto p = room_poll(st, room, r.version);
    if (!p)
      p = proto::poll_reply{room, room_status::failed, fmt::format("unknown room {}", room),
                            errc::unknown_room};
    if (p->reason.size() > proto::poll_many_reason_bytes)
      p->reason.resize(proto::poll_many_reason_bytes);
    out.rooms.push_back(std::move(*p));
  }
  st.ctx->gateway->reply(r.conn, r.seq, out);
}

room_entry* find_active(scheduler_state& st, uint64_t room) {
  if (auto it = st.decode.active.find(room); it != st.decode.active.end()) return &it->second;
  if (auto it = st.prefill.active.find(room); it != st.prefill.active.end()) return &it->second;
  return nullptr;
}

std::string info_text(scheduler_state& st, proto::info_topic topic) {
  const auto& c = st.ctx->config;
  std::ostringstream o;
  switch (topic) {
    case proto::info_topic::status:
      o << "node: " << c.node_name << "\ninstance: " << st.ctx->instance
        << "\nrole: " << to_string(c.role) << "\nprovider: " << st.ctx->engine->provider_name()
        << "\ncontrol: " << c.control_listen << "\nclient: " << c.client_listen
        << "\nclients: " << st.ctx->gateway->connections() << "\npeers: " << st.connections.size()
        << "\nprefill_rooms_active: " << st.prefill.active.size()
        << "\nprefill_rooms_succeeded: " << st.prefill.succeeded
        << "\nprefill_rooms_failed: " << st.prefill.failed
        << "\nprefill_bytes_sent: " << st.prefill.bytes
        << "\ndecode_rooms_active: " << st.decode.active.size()
        << "\ndecode_rooms_succeeded: " << st.decode.succeeded
        << "\ndecode_rooms_failed: " << st.decode.failed
        << "\ndecode_bytes_received: " << st.decode.bytes << "\nstray_writes: " << st.stray_writes
        << "\nstaging_bytes: " << (st.ctx->staging ? st.ctx->staging->bytes : 0)
        << "\nstaging_in_use: " << (st.ctx->staging ? st.ctx->staging->in_use() : 0)
        << "\nstaging_waits: " << (st.ctx->staging ? st.ctx->staging->waits() : 0) << "\n";
      break;
    case proto::info_topic::rooms:
      if (st.prefill.active.empty() && st.decode.active.empty()) o << "no active rooms\n";
      for (auto* side : {&st.prefill, &st.decode})
        for (const auto& [room, e] : side->active)
          o << "room=" << room << " side=" << (side == &st.decode ? "decode" : "prefill")
            << " status=" << to_string(e.status) << " peer=" << (e.peer.empty() ? "-" : e.peer)
            << "\n";
      break;
    case proto::info_topic::peers:
      if (st.connections.empty() && st.outbound.empty()) o << "no peers\n";
      for (const auto& [conn, info] : st.connections)
        if (info)
          o << "peer=" << info->address << " node=" << info->node << " instance=" << info->instance
            << " tp=" << info->schema.tp_rank << "/" << info->schema.tp_size
            << " pp=" << info->schema.pp_rank << "/" << info->schema.pp_size
            << " link: " << info->link->describe() << "\n";
      for (const auto& [addr, conn] : st.outbound)
        if (!st.connections.count(conn) || !st.connections[conn])
          o << "peer=" << addr << " connecting\n";
      break;
  }
  return o.str();
}

/// register_memory: check the table and descriptors, then map and register off the actor
/// workers (memory_mapped answers the request).
void on_register_memory(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  const auto& m = std::get<proto::register_memory>(r.msg);
  if (auto e = check_registration(*st.ctx, m, r.fds); !e.empty()) {
    for (int fd : r.fds) close(fd);
    st.ctx->log_sched->warn("client conn={} register_memory refused: {}", r.conn, e);
    return reply_error(self, r, errc::invalid_request, e);
  }
  const int k = static_cast<int>(m.pool);
  st.ctx->client_pools[k].now = client_pool::state::registering;
  st.ctx->client_pools[k].owner = r.conn;
  auto me = caf::actor_cast<caf::actor>(self);
  self->spawn<caf::detached>(
      [ctx = st.ctx, me, req = m, fds = std::move(r.fds), conn = r.conn, seq = r.seq](
          caf::blocking_actor*, int k) {
        auto err = map_client_pool(*ctx, req, fds);
        for (int fd : fds) close(fd);  // the mappings keep the memory
        caf::anon_send(me, memory_mapped{k, conn, seq, std::move(err)});
      },
      k);  // an argument: CAF 0.17 binds a null tuple for a function spawned without one (UBSan)
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

proto::discovered_rank rank_at(const std::string& address) {
  proto::discovered_rank r;
  r.address = address;
  return r;
}

/// discover: handshake with the daemon at the address (the connection stays for the rooms
/// that follow), then with every rank its config lists (discovery.instance_ranks), and answer
/// each rank's position or why it cannot be used. Each lookup is bounded by the handshake
/// deadline, and the ranks are asked at once: a rank that is down costs no more than one.
void on_discover(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  const auto address = std::get<proto::discover>(r.msg).address;
  if (!valid_host_port(address))
    return reply_error(
        self, r, errc::invalid_request,
        fmt::format("discover: '{}' is not host:port (a port in 1..65535)", address));
  const auto limit = std::chrono::milliseconds(st.ctx->config.timeouts.handshake_ms + 1000);
  struct gather {
    uint64_t conn;
    uint32_t seq;
    proto::discover_reply out;
    size_t pending = 0;
  };
  auto lookup = [self, limit](std::shared_ptr<gather> g, size_t i) {
    auto& rank = g->out.ranks[i];
    auto done = [self, g] {
      if (--g->pending == 0) self->state.ctx->gateway->reply(g->conn, g->seq, g->out);
    };
    self->request(connection_for(self, rank.address), limit, info_atom::value)
        .then(
            [g, i, done](peer_lookup& l) {
              auto& x = g->out.ranks[i];
              if (l.info) {
                x.up = true;
                x.node = l.info->node;
                x.tp_size = l.info->schema.tp_size;
                x.tp_rank = l.info->schema.tp_rank;
                x.pp_size = l.info->schema.pp_size;
                x.pp_rank = l.info->schema.pp_rank;
                x.dp_size = l.info->schema.dp_size;
                x.dp_rank = l.info->schema.dp_rank;
              } else {
                x.reason = l.error;
              }
              done();
            },
            [self, g, i, done](caf::error& e) {
              g->out.ranks[i].reason = "no answer: " + self->system().render(e);
              done();
            });
  };
  // First the named daemon, which says who the other ranks are.
  auto first = std::make_shared<gather>(gather{r.conn, r.seq, {}, 1});
  first->out.ranks.push_back(rank_at(address));
  self->request(connection_for(self, address), limit, info_atom::value)
      .then(
          [self, first, lookup, address](peer_lookup& l) {
            if (!l.info) {
              first->out.ranks[0].reason = l.error;
              return self->state.ctx->gateway->reply(first->conn, first->seq, first->out);
            }
            auto g = std::make_shared<gather>(gather{first->conn, first->seq, {}, 0});
            g->out.ranks.push_back(rank_at(address));
            for (const auto& a : l.info->instance_ranks)
              if (a != address) g->out.ranks.push_back(rank_at(a));
            g->pending = g->out.ranks.size();
            for (size_t i = 0; i < g->out.ranks.size(); ++i) lookup(g, i);
          },
          [self, first](caf::error& e) {
            first->out.ranks[0].reason = "no answer: " + self->system().render(e);
            self->state.ctx->gateway->reply(first->conn, first->seq, first->out);
          });
}

void on_client(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  std::visit(
      [&](auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, proto::hello>) {
          // The gateway let this hello through: the first of its connection, in our version.
          if (m.cancel_on_disconnect) st.owning_clients.insert(r.conn);
          st.clients.insert(r.conn);
          proto::hello_reply h;
          h.node = st.ctx->config.node_name;
          h.instance = st.ctx->instance;
          h.role = to_string(st.ctx->config.role);
          h.control = st.ctx->config.control_listen;
          h.tp_size = st.ctx->config.tp.size;
          h.tp_rank = st.ctx->config.tp.rank;
          h.page_tokens = st.ctx->config.pools.kv ? st.ctx->config.pools.kv->page_tokens : 0;
          h.config_yaml = st.ctx->config_yaml;
          for (int k = 0; k < pool_kind_count; ++k) {
            h.pools[k].present = st.ctx->layout.pools[k].present;
            h.pools[k].shm_name = st.ctx->pools[k].name();
            h.pools[k].layout = st.ctx->layout.pools[k];
          }
          st.ctx->gateway->reply(r.conn, r.seq, h);
        } else if constexpr (std::is_same_v<T, proto::prepare>) {
          on_prepare(self, r);
        } else if constexpr (std::is_same_v<T, proto::send>) {
          on_send(self, r);
        } else if constexpr (std::is_same_v<T, proto::poll>) {
          on_poll(self, r, m.room);
        } else if constexpr (std::is_same_v<T, proto::poll_many>) {
          on_poll_many(self, r, m.rooms);
        } else if constexpr (std::is_same_v<T, proto::register_memory>) {
          on_register_memory(self, r);
        } else if constexpr (std::is_same_v<T, proto::discover>) {
          on_discover(self, r);
        } else if constexpr (std::is_same_v<T, proto::cancel>) {
          auto* e = find_active(st, m.room);
          if (!e) {
            if (st.decode.finished.count(m.room) || st.prefill.finished.count(m.room))
              return reply_error(self, r, errc::room_finished,
                                 fmt::format("room {} already finished", m.room));
            return reply_error(self, r, errc::unknown_room, fmt::format("unknown room {}", m.room));
          }
          self->send(e->actor, cancel_atom::value, std::string("cancelled by client"));
          st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
        } else if constexpr (std::is_same_v<T, proto::subscribe>) {
          if (auto* e = find_active(st, m.room)) {
            e->subscribers.push_back(r.conn);
            st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
            st.ctx->gateway->push(r.conn, proto::event{m.room, e->status, {}});
            return;
          }
          for (auto* side : {&st.decode, &st.prefill})
            if (auto it = side->finished.find(m.room); it != side->finished.end()) {
              st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
              st.ctx->gateway->push(r.conn, proto::event{m.room, it->second.status,
                                                         it->second.reason, it->second.code});
              return;
            }
          reply_error(self, r, errc::unknown_room, fmt::format("unknown room {}", m.room));
        } else if constexpr (std::is_same_v<T, proto::info>) {
          st.ctx->gateway->reply(r.conn, r.seq, proto::info_reply{info_text(st, m.topic)});
        } else {
          reply_error(self, r, errc::malformed_frame,
                      fmt::format("{} is a reply type; clients may not send it",
                                  proto::to_string(proto::type_of(r.msg))));
        }
      },
      r.msg);
}

void on_peer_inbound(scheduler_actor* self, peer_inbound& in) {
  auto& st = self->state;
  // Room messages go to the room actor with the connection they came from, so a room fed by
  // several peers knows which one spoke.
  auto forward = [&](side_rooms& side, uint64_t room) {
    if (auto it = side.active.find(room); it != side.active.end())
      self->send(it->second.actor, std::move(in));
  };
  // Decode rooms are found by token: it names the room incarnation, not just its id.
  auto to_decode = [&](uint64_t token) {
    if (auto t = st.token_room.find(token); t != st.token_room.end()) forward(st.decode, t->second);
  };
  in.msg.apply({
      [&](peer_prepare& p) {
        auto refuse = [&](std::string why) {
          self->send(
              in.connection,
              peer_outbound{caf::make_message(peer_prepare_ack{p.room, p.token, false, why})});
        };
        auto it = st.prefill.active.find(p.room);
        if (it == st.prefill.active.end()) {
          if (!st.ctx->serves_prefill())
            return refuse("this daemon does not serve the prefill role");
          if (auto e = admission(st, st.prefill, "prefill")) return refuse(*e);
          auto actor = spawn_sender(self, st.ctx, p.room, caf::actor_cast<caf::actor>(self));
          it = st.prefill.active.emplace(p.room, room_entry{}).first;
          it->second.actor = actor;
        }
        auto& e = it->second;
        if (std::find(e.connections.begin(), e.connections.end(), in.connection) ==
            e.connections.end()) {
          e.connections.push_back(in.connection);
          e.peer += (e.peer.empty() ? "" : ",") + in.from->address;
        }
        self->send(e.actor, std::move(in));
      },
      [&](peer_prepare_ack& a) { to_decode(a.token); },
      [&](peer_announce& a) { to_decode(a.token); },
      [&](peer_drained& d) { to_decode(d.token); },
      [&](peer_outcome& o) {
        if (o.to_decode)
          to_decode(o.token);
        else
          forward(st.prefill, o.room);
      },
  });
}

caf::behavior scheduler_behavior(scheduler_actor* self, context_ptr ctx, caf::actor basp) {
  self->state.ctx = std::move(ctx);
  self->state.basp = std::move(basp);
  const auto& pools = self->state.ctx->config.pools;
  self->state.claims.emplace(pools.kv ? pools.kv->pages : 0, pools.mamba ? pools.mamba->slots : 0,
                             pools.aux ? pools.aux->rows : 0);
  self->set_down_handler([=](caf::down_msg& dm) {
    auto& st = self->state;
    auto who = caf::actor_cast<caf::actor>(dm.source);
    if (auto c = st.connections.find(who); c != st.connections.end()) {
      // Normally a Connection fences its peer and reports peer_down before it ends (and is
      // erased then); reaching here means it ended abnormally. Fence its peer here, then fail
      // its rooms (the peer_down below) rather than let them wait for their deadlines.
      std::optional<transport::peer_handle> handle;
      if (c->second) handle = c->second->fabric_peer;
      auto regions = std::move(st.fences[who]);
      st.fences.erase(who);
      const auto address = c->second ? c->second->address : std::string("?");
      const auto reason = "connection actor ended: " + self->system().render(dm.reason);
      auto me = caf::actor_cast<caf::actor>(self);
      st.ctx->engine->fence_peer(handle, std::move(regions), [me, address, who, reason] {
        caf::anon_send(me, peer_down{address, who, reason, true, true, false, true});
      });
      return;
    }
    // A room actor that ended without reporting a terminal status (e.g. an exception) fails its
    // room here so no client waits forever. A decode room's pages may still be written by its
    // prefill ranks, and nobody is left to drain them: fence those links first (their
    // connections end, closing their keys and cutting them; other rooms on them fail too), and
    // report Failed, handing the pages back, only once every fence has happened (peer_down).
    for (auto* side : {&st.prefill, &st.decode})
      for (auto& [room, e] : side->active)
        if (e.actor == who) {
          auto reason = "internal error: room actor ended: " + self->system().render(dm.reason);
          const uint64_t id = room;
          if (side == &st.decode) {
            for (const auto& c : e.connections)
              if (st.connections.count(c)) e.awaiting_fence.push_back(c);
            if (!e.awaiting_fence.empty()) {
              st.ctx->log_sched->error("room={} {}; fencing its {} prefill link(s) before it fails",
                                       id, reason, e.awaiting_fence.size());
              e.orphan_reason = reason + "; its prefill links were fenced";
              for (const auto& c : e.awaiting_fence)
                self->send(c, fence_atom::value,
                           fmt::format("fenced: room {} ended abnormally at this decode", id));
              return;
            }
          }
          fail_orphan(self, *side, id, reason);
          return;
        }
  });
  self->set_exit_handler([=](caf::exit_msg& em) {
    for (auto* side : {&self->state.prefill, &self->state.decode})
      for (auto& [room, e] : side->active) self->send_exit(e.actor, em.reason);
    for (auto& [conn, info] : self->state.connections) self->send_exit(conn, em.reason);
    self->quit(em.reason);
  });
  return {
      [=](client_request& r) { on_client(self, r); },
      [=](client_gone& g) {
        auto& st = self->state;
        st.owning_clients.erase(g.conn);
        st.clients.erase(g.conn);
        for (int k = 0; k < pool_kind_count; ++k)
          if (st.ctx->client_pools[k].owner == g.conn &&
              st.ctx->client_pools[k].now.load() == client_pool::state::registered)
            start_release(
                self, k, fmt::format("the connection that registered it (conn={}) closed", g.conn));
        for (auto* side : {&st.prefill, &st.decode})
          for (auto& [room, e] : side->active) {
            std::erase(e.subscribers, g.conn);
            if (e.owner == g.conn) {
              st.ctx->log_sched->info(
                  "room={} peer={} its client (conn={}) disconnected; "
                  "cancelling it",
                  room, e.peer.empty() ? "-" : e.peer, g.conn);
              self->send(e.actor, cancel_atom::value,
                         std::string("cancelled: its client disconnected"));
              e.owner.reset();
            }
          }
      },
      [=](immediates_msg& m) {
        auto& st = self->state;
        for (auto [token, count] : m.counts) {
          auto t = st.token_room.find(token);
          auto r =
              t == st.token_room.end() ? st.decode.active.end() : st.decode.active.find(t->second);
          if (r == st.decode.active.end()) {
            st.stray_writes += count;  // a late write of a room that already ended
            if (auto e = st.ended_tokens.find(token); e != st.ended_tokens.end())
              st.ctx->log_sched->error(
                  "{} late write(s) of {} landed after the room ended: its pages, slot or row "
                  "may have been given to a new request",
                  count, e->second);
            continue;
          }
          self->send(r->second.actor, landed_msg{token, count});
        }
        st.ctx->engine->return_immediate_credit();
      },
      [=](room_update& u) {
        auto& st = self->state;
        auto& side = u.decode_side ? st.decode : st.prefill;
        auto it = side.active.find(u.room);
        if (it == side.active.end()) return;
        it->second.status = u.status;
        if (u.prefix_tokens) it->second.prefix_tokens = u.prefix_tokens;
        notify_subscribers(self, it->second, u.room, u.status, u.reason, u.code);
        if (!is_terminal(u.status)) return;
        st.ctx->log_sched->info("room={} peer={} side={} {}{}{}", u.room, it->second.peer,
                                u.decode_side ? "decode" : "prefill", to_string(u.status),
                                u.reason.empty() ? "" : ": ", u.reason);
        if (u.status == room_status::success) {
          ++side.succeeded;
          side.bytes += u.bytes;
        } else {
          ++side.failed;
        }
        if (u.decode_side)
          st.claims->release(u.room, it->second.dst_pages, it->second.dst_slot, it->second.dst_row);
        if (u.decode_side)
          for (uint32_t i = 0; i < it->second.tokens; ++i) {
            const uint64_t t = it->second.token + i;
            st.token_room.erase(t);
            st.ended_tokens[t] =
                fmt::format("room={} peer={} ({})", u.room, it->second.peer, to_string(u.status));
            st.ended_order.push_back(t);
            if (st.ended_order.size() > history_limit) {
              st.ended_tokens.erase(st.ended_order.front());
              st.ended_order.pop_front();
            }
          }
        self->demonitor(it->second.actor);
        side.finish(u.room, u.status, u.reason, u.code, it->second.prefix_tokens);
        try_release(self);
      },
      [=](memory_mapped& m) {
        auto& st = self->state;
        auto& pool = st.ctx->client_pools[m.pool];
        const auto name = to_string(static_cast<pool_kind>(m.pool));
        if (!m.error.empty()) {
          pool.now = client_pool::state::unregistered;
          st.ctx->log_sched->warn("client conn={} register_memory failed: {}", m.conn, m.error);
          st.ctx->gateway->reply(m.conn, m.seq, proto::error{errc::invalid_request, m.error});
          return;
        }
        pool.now = client_pool::state::registered;
        st.ctx->log_sched->info("pool {}: registered the memory of client conn={} ({} bytes)", name,
                                m.conn, st.ctx->layout.pools[m.pool].total_bytes);
        st.ctx->gateway->reply(m.conn, m.seq, proto::ok{});
        if (!st.clients.count(m.conn))
          start_release(self, m.pool, "its connection closed during the registration");
      },
      [=](memory_released& m) {
        auto& st = self->state;
        st.ctx->client_pools[m.pool].now = client_pool::state::unregistered;
        st.release_unmapping[m.pool] = false;
        const auto name = to_string(static_cast<pool_kind>(m.pool));
        if (m.error.empty())
          st.ctx->log_sched->info("pool {}: released; it can be registered again", name);
        else
          st.ctx->log_sched->error("pool {}: released with an error: {}", name, m.error);
      },
      [=](peer_hello& h) {
        auto conn = spawn_inbound_connection(self, self->state.ctx, std::move(h),
                                             caf::actor_cast<caf::actor>(self));
        self->state.connections.emplace(conn, nullptr);
      },
      [=](peer_ready& p) {
        auto& st = self->state;
        auto conn = caf::actor_cast<caf::actor>(self->current_sender());
        st.connections[conn] = p.info;
        st.fences[conn] = p.fence;
        // The same node as a new instance: any connection to its old instance belongs to a
        // process that is gone (restarted while its connection still looked open). End it, so
        // its rooms fail now and its registrations are fenced.
        for (auto& [other, info] : st.connections)
          if (other != conn && info && info->node == p.info->node &&
              info->instance != p.info->instance)
            self->send(other, replaced_atom::value, p.info->instance);
      },
      [=](peer_inbound& in) { on_peer_inbound(self, in); },
      [=](peer_down& d) {
        auto& st = self->state;
        for (auto* side : {&st.prefill, &st.decode})
          for (auto& [room, e] : side->active)
            if (std::count(e.connections.begin(), e.connections.end(), d.connection))
              self->send(e.actor, d);
        std::vector<uint64_t> fenced_orphans;
        for (auto& [room, e] : st.decode.active)
          if (!e.awaiting_fence.empty() && std::erase(e.awaiting_fence, d.connection) > 0 &&
              e.awaiting_fence.empty())
            fenced_orphans.push_back(room);
        for (auto room : fenced_orphans)
          fail_orphan(self, st.decode, room, st.decode.active[room].orphan_reason);
        // A Connection the peer could write into fenced it (and cut it) before this message;
        // otherwise remove the peer now that the rooms know why.
        if (!d.cut)
          if (auto it = st.connections.find(d.connection); it != st.connections.end() && it->second)
            st.ctx->engine->remove_peer(it->second->fabric_peer);
        st.fences.erase(d.connection);
        if (d.unresponsive) {
          const auto& t = st.ctx->config.timeouts;
          st.unresponsive[d.address] = {
              d.reason,
              std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(uint64_t{t.heartbeat_ms} * t.heartbeat_misses)};
        }
        st.connections.erase(d.connection);
        for (auto it = st.outbound.begin(); it != st.outbound.end();)
          it = it->second == d.connection ? st.outbound.erase(it) : std::next(it);
        try_release(self);
      },
  };
}

}  // namespace

caf::actor spawn_scheduler(caf::actor_system& sys, context_ptr ctx, caf::actor basp) {
  return sys.spawn(scheduler_behavior, std::move(ctx), std::move(basp));
}

}  // namespace ferry
