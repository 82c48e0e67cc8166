// The Scheduler's room registry: admission, the checks every prepare and send pass before a
// room actor sees them, and the answers of poll.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "actors/client_memory.hpp"
#include "actors/scheduler_state.hpp"
#include "core/plan.hpp"
#include "core/request_checks.hpp"
#include "transport/channels/client_gateway.hpp"

namespace ferry::sched {

/// The connection that created a room owns it if its hello asked for that.
std::optional<uint64_t> owner_of(const scheduler_state& st, const client_request& r) {
  if (st.owning_clients.count(r.conn)) return r.conn;
  return std::nullopt;
}

void reply_error(scheduler_actor* self, const client_request& r, error e) {
  reply_error(self, r, e.code, std::move(e.message));
}

namespace {

/// One line per refused request (limited): room= and peer= (the prefill peer a prepare names,
/// else "-").
void log_refusal(daemon_context& ctx, const proto::message& msg, uint64_t conn,
                 const std::string& text) {
  if (!ctx.digest.allow(logging::flood::refused, ctx.log_sched, spdlog::level::info)) return;
  std::string room = "-", peer = "-";
  std::visit(
      [&](const auto& m) {
        if constexpr (requires { m.room; }) room = std::to_string(m.room);
        if constexpr (requires { m.prefill_peers; })
          peer = fmt::format("{}", fmt::join(m.prefill_peers, ","));
      },
      msg);
  ctx.log_sched->info("room={} peer={} client conn={} {} rejected: {}", room, peer, conn,
                      proto::to_string(proto::type_of(msg)), text);
}

std::string wrong_role(uint64_t room, const char* op, bool decode_op, const daemon_context& ctx) {
  return fmt::format("room {}: {} is a {} operation; this daemon's role is {}", room, op,
                     decode_op ? "decode" : "prefill", to_string(ctx.config.role));
}

}  // namespace

void reply_error(scheduler_actor* self, const client_request& r, errc code, std::string text) {
  log_refusal(*self->state.ctx, r.msg, r.conn, text);
  self->state.ctx->gateway->reply(r.conn, r.seq, proto::error{code, std::move(text)});
}

/// Admission: a bounded number of non-terminal rooms per side, so one runaway client cannot
/// exhaust the daemon for everyone else.
result<> admission(const scheduler_state& st, const side_rooms& side, const char* name) {
  if (st.draining)
    return error{errc::draining,
                 fmt::format("ferryd is draining: it finishes the {} rooms it accepted and takes "
                             "no new one",
                             st.prefill.active.size() + st.decode.active.size())};
  // A room of this client's own daemon: its request, not a peer, is what cannot be served.
  if (auto usable = st.ctx->pools_usable(); !usable)
    return error{errc::invalid_request, usable.message};
  return admit(side.active.size(), st.ctx->config.limits.max_active_rooms, name);
}

void notify_subscribers(scheduler_actor* self, const room_entry& e, uint64_t room, room_status s,
                        const std::string& reason, errc code) {
  for (auto c : e.subscribers)
    self->state.ctx->gateway->push(c, proto::event{room, s, reason, code, e.prefix_tokens});
}

/// A room whose actor ended without a terminal status: Failed, its claims released.
void fail_orphan(scheduler_actor* self, side_rooms& side, uint64_t room, std::string reason) {
  auto& st = self->state;
  auto it = side.active.find(room);
  if (it == side.active.end()) return;
  room_entry& e = it->second;
  notify_subscribers(self, e, room, room_status::failed, reason, errc::internal);
  room_moved(st, &side == &st.decode, e, room_status::failed, errc::internal, 0);
  if (&side == &st.decode) {
    for (uint32_t i = 0; i < e.tokens; ++i) st.token_room.erase(e.token + i);
    st.claims->release(room, e.dst_pages, e.dst_slot, e.dst_row, e.dst_state_pages);
  }
  st.ctx->log_sched->info("room={} side={} Failed: {}", room,
                          &side == &st.decode ? "decode" : "prefill", reason);
  finish_room(st, side, room, room_status::failed, std::move(reason), errc::internal, 0, 0,
              &side == &st.prefill && e.connections.empty());
  try_release(self);
  check_drained(self);
}

void start_drain(scheduler_actor* self, std::shared_ptr<stop_notice> done) {
  auto& st = self->state;
  st.draining = true;
  st.drained = std::move(done);
  st.ctx->log_sched->info(
      "draining: {} prefill and {} decode rooms accepted before the stop may finish within "
      "timeouts.stop_ms {} ms; new rooms are refused (407 draining), and peers are told",
      st.prefill.active.size(), st.decode.active.size(), st.ctx->config.timeouts.stop_ms);
  for (auto& [conn, info] : st.connections)
    if (info) {
      st.goodbyes.insert(conn);
      self->send(conn, leaving_atom::value);
    }
  check_drained(self);
}

void check_drained(scheduler_actor* self) {
  auto& st = self->state;
  if (!st.drained || !st.prefill.active.empty() || !st.decode.active.empty() ||
      !st.goodbyes.empty())
    return;
  st.ctx->log_sched->info("drained: every room accepted before the stop has finished");
  st.drained->notify();
  st.drained.reset();
}

caf::actor connection_for(scheduler_actor* self, const std::string& address) {
  auto& st = self->state;
  auto it = st.outbound.find(address);
  if (it != st.outbound.end()) return it->second;
  std::string known_down = undescribed_pool(*st.ctx).value_or(
      st.unresponsive.known_down(address, std::chrono::steady_clock::now()).value_or(""));
  auto conn = spawn_outbound_connection(self, st.ctx, address, caf::actor_cast<caf::actor>(self),
                                        std::move(known_down));
  st.outbound.emplace(address, conn);
  st.connections.emplace(conn, nullptr);
  return conn;
}

void on_prepare(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  auto& p = std::get<proto::prepare>(r.msg);
  if (!st.ctx->serves_decode())
    return reply_error(self, r, errc::wrong_role, wrong_role(p.room, "prepare", true, *st.ctx));
  if (st.decode.active.count(p.room))
    return reply_error(
        self, r, errc::duplicate_room,
        fmt::format("duplicate room {}: it is already active on this decode daemon", p.room));
  if (auto e = admission(st, st.decode, "decode"); !e)
    return reply_error(self, r, e.code, fmt::format("room {}: {}", p.room, e.message));
  if (auto e = r.fields_checked ? result<>{} : check_prepare(st.ctx->config, st.ctx->layout, p); !e)
    return reply_error(self, r, std::move(e).error());
  if (auto e = st.claims->claim(p.room, p.dst_pages, p.state_slot, p.aux_row, p.state_pages); !e)
    return reply_error(self, r, std::move(e).error());
  auto dst_pages = p.dst_pages;
  auto dst_state_pages = p.state_pages;
  const auto dst_slot = p.state_slot, dst_row = p.aux_row;
  const uint64_t token = st.next_token;
  const auto tokens = static_cast<uint32_t>(p.prefill_peers.size());
  st.next_token += tokens;
  std::vector<caf::actor> conns;
  std::vector<peer_info_ptr> known;  // peers ready and not draining: the room need not ask
  for (const auto& addr : p.prefill_peers) {
    conns.push_back(connection_for(self, addr));
    auto c = st.connections.find(conns.back());
    known.push_back(c != st.connections.end() && !st.draining_peers.count(conns.back()) ? c->second
                                                                                        : nullptr);
  }
  auto room = p.room;
  auto peer = fmt::format("{}", fmt::join(p.prefill_peers, ","));
  st.ctx->log_sched->debug("room={} peer={} prepare: {} pages", room, peer, p.dst_pages.size());
  auto actor = spawn_receiver(self, st.ctx, std::move(p), token, conns, std::move(known),
                              caf::actor_cast<caf::actor>(self));
  room_entry& e = open_room(st, st.decode, room, actor);
  e.connections = conns;
  e.peer = peer;
  e.token = token;
  e.tokens = tokens;
  e.owner = owner_of(st, r);
  e.dst_pages = std::move(dst_pages);
  e.dst_slot = dst_slot;
  e.dst_state_pages = std::move(dst_state_pages);
  e.dst_row = dst_row;
  for (uint32_t i = 0; i < tokens; ++i) st.token_room[token + i] = room;
  st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
}

void on_send(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  const auto& s = std::get<proto::send>(r.msg);
  const auto& ctx = *st.ctx;
  if (!ctx.serves_prefill())
    return reply_error(self, r, errc::wrong_role, wrong_role(s.room, "send", false, ctx));
  if (auto usable = ctx.pools_usable(); !usable)  // before any look at the pools' memory
    return reply_error(self, r, errc::invalid_request,
                       fmt::format("room {}: {}", s.room, usable.message));
  if (auto e = r.fields_checked ? result<>{} : check_send(ctx.config, ctx.layout, s); !e)
    return reply_error(self, r, std::move(e).error());
  // The checks above ran on the fields; this one reads the aux row the engine filled.
  if (auto e = check_aux_room_id(ctx.config, ctx.layout, ctx.base(space::aux), s); !e)
    return reply_error(self, r, std::move(e).error());
  auto it = st.prefill.active.find(s.room);
  if (it == st.prefill.active.end()) {
    if (auto open = send_still_open(st.prefill.finished, s.room); !open)
      return reply_error(self, r, std::move(open).error());
    if (auto e = admission(st, st.prefill, "prefill"); !e)
      return reply_error(self, r, e.code, fmt::format("room {}: {}", s.room, e.message));
    st.cancelled_unknown.forget(s.room);  // the engine sends it again: a new incarnation
    open_room(st, st.prefill, s.room,
              spawn_sender(self, st.ctx, s.room, caf::actor_cast<caf::actor>(self)));
    it = st.prefill.active.find(s.room);
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
              auto open = send_still_open(st.prefill.finished, room);
              reply_error(self, head, errc::room_finished,
                          open ? fmt::format("room {} ended before this chunk reached it", room)
                               : open.message);
            });
}

namespace {

/// What a poll of `room` answers, or nothing for a room unknown here. On a prefill daemon in
/// protocol v4 an unknown room is Bootstrapping (the decode's prepare and the engine's first
/// send may not have arrived yet) until timeouts.bootstrapping_ms after its first such poll.
std::optional<proto::poll_reply> room_poll(scheduler_state& st, uint64_t room, uint16_t version) {
  st.cancelled_unknown.forget(room);  // the engine polls it again: a new incarnation
  // Active rooms first: a daemon of both roles may hold a live room and a finished one of the
  // same id.
  for (const auto* side : {&st.decode, &st.prefill})
    if (auto p = active_poll(*side, room)) {
      st.polled_unknown.forget(room);
      return p;
    }
  for (const auto* side : {&st.decode, &st.prefill})
    if (auto p = finished_poll(*side, room)) {
      st.polled_unknown.forget(room);
      return p;
    }
  if (version < 4 || !st.ctx->serves_prefill()) return std::nullopt;
  return st.polled_unknown.poll(room, std::chrono::steady_clock::now(),
                                st.ctx->config.timeouts.bootstrapping_ms);
}

}  // namespace

void cancel_unknown(scheduler_actor* self, const client_request& r, uint64_t room) {
  auto& st = self->state;
  const auto& t = st.ctx->config.timeouts;
  const auto keep_ms = longest_room_deadline_ms(t);
  st.cancelled_unknown.cancel(
      room, std::chrono::steady_clock::now() + std::chrono::milliseconds(keep_ms));
  st.polled_unknown.forget(room);  // a new incarnation gets its own Bootstrapping window
  st.ctx->log_sched->debug(
      "room={} cancelled by client conn={} before anything of it arrived: a decode's prepare "
      "of it in the next {} ms is refused",
      room, r.conn, keep_ms);
  // Not an error for the engine: nothing of the room is in flight, so its memory may be reused
  // at once. unknown_room says exactly that, and a client that waits for a cancelled room to
  // end (the SGLang adapter) must not poll it: a poll is the engine starting it anew.
  st.ctx->gateway->reply(
      r.conn, r.seq,
      proto::error{errc::unknown_room,
                   fmt::format("unknown room {}: nothing of it is in flight here; a decode's "
                               "prepare of it is refused for the next {} ms",
                               room, keep_ms)});
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

room_entry& open_room(scheduler_state& st, side_rooms& side, uint64_t room, caf::actor actor) {
  st.room_actors[actor.id()] = {&side == &st.decode, room};
  room_entry& e = (side.active[room] = room_entry{});
  e.actor = std::move(actor);
  st.polled_unknown.forget(room);  // known now: a poll before it no longer matters
  st.ctx->board.set(room, &side == &st.decode, e.status, 0);
  return e;
}

void finish_room(scheduler_state& st, side_rooms& side, uint64_t room, room_status s,
                 std::string reason, errc code, uint32_t prefix_tokens, uint64_t bytes,
                 bool without_decode) {
  if (auto it = side.active.find(room); it != side.active.end()) {
    const auto& e = it->second;
    st.room_actors.erase(e.actor.id());
    st.ctx->board.erase(room, &side == &st.decode);
    if (&side == &st.decode)
      st.ctx->routes.remove_decode(e.token, e.tokens, e.actor);
    else
      st.ctx->routes.remove_prefill(room, e.actor);
  }
  side.finish(room, s, std::move(reason), code, prefix_tokens, bytes, without_decode);
}

room_entry* find_active(scheduler_state& st, uint64_t room) {
  if (auto it = st.decode.active.find(room); it != st.decode.active.end()) return &it->second;
  if (auto it = st.prefill.active.find(room); it != st.prefill.active.end()) return &it->second;
  return nullptr;
}

}  // namespace ferry::sched

namespace ferry {

std::optional<proto::error> refuse_at_once(daemon_context& ctx, const proto::message& m,
                                           uint64_t conn) {
  result<> e;
  if (const auto* p = std::get_if<proto::prepare>(&m))
    e = !ctx.serves_decode()
            ? result<>(error{errc::wrong_role, sched::wrong_role(p->room, "prepare", true, ctx)})
            : check_prepare(ctx.config, ctx.layout, *p);
  else if (const auto* s = std::get_if<proto::send>(&m))
    e = !ctx.serves_prefill()
            ? result<>(error{errc::wrong_role, sched::wrong_role(s->room, "send", false, ctx)})
            : check_send(ctx.config, ctx.layout, *s);
  if (e) return std::nullopt;
  ctx.refused_at_once.fetch_add(1, std::memory_order_relaxed);
  sched::log_refusal(ctx, m, conn, e.message);
  return proto::error{e.code, e.message};
}

}  // namespace ferry
