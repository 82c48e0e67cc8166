// Scheduler: one per daemon; peers reach it through the peer gate
// (transport/channels/peer_gate.hpp).
//
// Owns the room registry (active rooms and a bounded history of finished ones for poll),
// validates every client request before any room actor sees it, spawns Senders, Receivers and
// Connections, routes peer messages and arrived immediates to rooms, and pushes status events to
// subscribed clients.

#include <fmt/format.h>

#include <algorithm>

#include "actors/client_memory.hpp"
#include "actors/logging.hpp"
#include "actors/scheduler_state.hpp"
#include "core/plan.hpp"
#include "transport/channels/client_gateway.hpp"

namespace ferry {
namespace {

using namespace sched;

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
            h.pools[k].registered = registered_pool(*st.ctx, k);
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
            if (st.decode.finished.contains(m.room) || st.prefill.finished.contains(m.room))
              return reply_error(self, r, errc::room_finished,
                                 fmt::format("room {} already finished", m.room));
            if (!st.ctx->serves_prefill())
              return reply_error(self, r, errc::unknown_room,
                                 fmt::format("unknown room {}", m.room));
            return cancel_unknown(self, r, m.room);
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
            if (const auto* f = side->finished.find(m.room)) {
              st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
              st.ctx->gateway->push(r.conn, proto::event{m.room, f->status, f->reason, f->code});
              return;
            }
          reply_error(self, r, errc::unknown_room, fmt::format("unknown room {}", m.room));
        } else if constexpr (std::is_same_v<T, proto::drain>) {
          if (!st.ctx->drain_on_request)
            return reply_error(self, r, errc::invalid_request,
                               "this ferryd runs inside another program, which stops it: it "
                               "cannot drain on a client's request");
          if (request_drain(*st.ctx))
            st.ctx->log_sched->info("client conn={} asked for a drain", r.conn);
          st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
        } else if constexpr (std::is_same_v<T, proto::set_log_level>) {
          if (auto set = logging::set_level(m.logger, m.level); !set)
            return reply_error(self, r, set.error());
          st.ctx->log_sched->info("client conn={} set the log level of {} to {}", r.conn,
                                  m.logger.empty() ? "every logger" : m.logger, m.level);
          st.ctx->gateway->reply(r.conn, r.seq, proto::ok{});
        } else if constexpr (std::is_same_v<T, proto::info>) {
          st.ctx->gateway->reply(r.conn, r.seq, proto::info_reply{info_json(st, m.topic)});
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
  auto on_prepare = [&](peer_prepare& p) {
    auto refuse = [&](std::string why, errc code = errc::ok) {
      self->send(in.connection, peer_outbound{peer_prepare_ack{p.room, p.token, false, why,
                                                               static_cast<uint16_t>(code)}});
    };
    auto it = st.prefill.active.find(p.room);
    if (it == st.prefill.active.end()) {
      if (!st.ctx->serves_prefill()) return refuse("this daemon does not serve the prefill role");
      if (auto late = late_prepare(st.prefill.finished, p.room); !late)
        return refuse(late.message, late.code);
      const auto now = std::chrono::steady_clock::now();
      if (auto c = st.cancelled_unknown.prepare_allowed(p.room, now); !c)
        return refuse(c.message, c.code);
      if (auto e = admission(st, st.prefill, "prefill"); !e) return refuse(e.message, e.code);
      open_room(st, st.prefill, p.room,
                spawn_sender(self, st.ctx, p.room, caf::actor_cast<caf::actor>(self)));
      it = st.prefill.active.find(p.room);
    }
    auto& e = it->second;
    if (std::find(e.connections.begin(), e.connections.end(), in.connection) ==
        e.connections.end()) {
      e.connections.push_back(in.connection);
      e.peer += (e.peer.empty() ? "" : ",") + in.from->address;
    }
    e.prepares.emplace_back(in.connection, p.token);
    self->send(e.actor, std::move(in));
  };
  in.msg.apply({
      [&](peer_prepare& p) { on_prepare(p); },
      [&](peer_prepare_paged& p) { on_prepare(p.prepare); },
      [&](peer_prepare_checked& p) { on_prepare(p.prepare); },
      [&](peer_prepare_ack& a) { to_decode(a.token); },
      [&](peer_announce_checked& a) { to_decode(a.announce.token); },
      [&](peer_announce& a) { to_decode(a.token); },
      [&](peer_drained& d) { to_decode(d.token); },
      [&](peer_staging_request& q) { to_decode(q.token); },
      [&](peer_staging_grant& g) { forward(st.prefill, g.room); },
      [&](peer_outcome& o) {
        if (o.to_decode)
          to_decode(o.token);
        else
          forward(st.prefill, o.room);
      },
  });
}

caf::behavior scheduler_behavior(scheduler_actor* self, context_ptr ctx) {
  self->state.ctx = std::move(ctx);
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
      if (c->second)
        handle = c->second->fabric_peer;
      else if (auto h = st.handles.find(who); h != st.handles.end())
        handle = h->second;
      st.handles.erase(who);
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
    auto ra = st.room_actors.find(dm.source.id());
    if (ra == st.room_actors.end()) return;  // a room that ended normally, or not a room's actor
    auto* side = ra->second.first ? &st.decode : &st.prefill;
    auto a = side->active.find(ra->second.second);
    if (a == side->active.end() || a->second.actor != who) return;
    auto& e = a->second;
    auto reason = "internal error: room actor ended: " + self->system().render(dm.reason);
    const uint64_t id = a->first;
    if (side == &st.decode) {
      std::vector<caf::actor> open;
      for (const auto& c : e.connections)
        if (st.connections.count(c)) open.push_back(c);
      const auto fence = e.orphan.ended(std::move(open), reason);
      if (!fence.empty()) {
        st.ctx->log_sched->error("room={} {}; fencing its {} prefill link(s) before it fails", id,
                                 reason, fence.size());
        for (const auto& c : fence)
          self->send(c, fence_atom::value,
                     fmt::format("fenced: room {} ended abnormally at this decode", id));
        return;
      }
    }
    fail_orphan(self, *side, id, reason);
  });
  self->set_exit_handler([=](caf::exit_msg& em) {
    for (auto* side : {&self->state.prefill, &self->state.decode})
      for (auto& [room, e] : side->active) self->send_exit(e.actor, em.reason);
    for (auto& [conn, info] : self->state.connections) self->send_exit(conn, em.reason);
    self->quit(em.reason);
  });
  return {
      [=](client_request& r) { on_client(self, r); },
      [=](metrics_atom) { return snapshot(self->state); },
      [=](drain_msg& m) { start_drain(self, std::move(m.done)); },
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
              if (st.ctx->digest.allow(logging::flood::disconnected, st.ctx->log_sched,
                                       spdlog::level::info))
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
            if (const auto* e = st.ended_tokens.find(token))
              st.ctx->log_sched->error(
                  "{} late write(s) of {} landed after the room ended: its pages, slot or row "
                  "may have been given to a new request",
                  count, *e);
            continue;
          }
          self->send(r->second.actor, landed_msg{token, count});
          st.ctx->metrics->writes_landed(count);
        }
        st.ctx->engine->return_immediate_credit();
      },
      [=](room_update& u) {
        auto& st = self->state;
        auto& side = u.decode_side ? st.decode : st.prefill;
        auto it = side.active.find(u.room);
        if (it == side.active.end()) return;
        if (u.status == it->second.status && !is_terminal(u.status)) {
          // Why the room waits where it is (a poll's reason), or that it no longer does.
          it->second.note = std::move(u.reason);
          st.ctx->board.set(u.room, u.decode_side, u.status, it->second.prefix_tokens,
                            it->second.note);
          notify_subscribers(self, it->second, u.room, u.status, it->second.note, errc::ok);
          return;
        }
        it->second.note.clear();
        room_moved(st, u.decode_side, it->second, u.status, u.code, u.bytes);
        it->second.status = u.status;
        if (u.prefix_tokens) it->second.prefix_tokens = u.prefix_tokens;
        st.ctx->board.set(u.room, u.decode_side, u.status, it->second.prefix_tokens);
        notify_subscribers(self, it->second, u.room, u.status, u.reason, u.code);
        if (!is_terminal(u.status)) return;
        // One line per room per side; `code=` only when it failed (a JSON log's "code"). A
        // success at debug (the periodic summary counts it), a failure at info, limited.
        const auto level =
            u.status == room_status::success ? spdlog::level::debug : spdlog::level::info;
        if (level == spdlog::level::debug
                ? st.ctx->log_sched->should_log(level)
                : st.ctx->digest.allow(logging::flood::room_failed, st.ctx->log_sched, level))
          st.ctx->log_sched->log(
              level, "room={} peer={} side={} {}{}{}{}{}", u.room, it->second.peer,
              u.decode_side ? "decode" : "prefill", to_string(u.status),
              u.code == errc::ok ? "" : " code=", u.code == errc::ok ? "" : to_string(u.code),
              u.reason.empty() ? "" : ": ", u.reason);
        if (u.decode_side)
          st.claims->release(u.room, it->second.dst_pages, it->second.dst_slot, it->second.dst_row,
                             it->second.dst_state_pages);
        if (u.decode_side)
          for (uint32_t i = 0; i < it->second.tokens; ++i) {
            const uint64_t t = it->second.token + i;
            st.token_room.erase(t);
            st.ended_tokens.put(t, fmt::format("room={} peer={} ({})", u.room, it->second.peer,
                                               to_string(u.status)));
          }
        // A prepare forwarded after the room's actor ended found no one to answer it: refuse
        // it here, or its decode rank would wait for a drain report that never comes.
        const auto& forwarded = it->second.prepares;
        for (size_t i = u.prepares; i < forwarded.size(); ++i) {
          const auto no = ended_before_prepare(u.room, u.status, u.reason, u.code);
          st.ctx->log_sched->debug("room={} refusing a prepare its actor did not take: {}", u.room,
                                   no.message);
          self->send(forwarded[i].first,
                     peer_outbound{peer_prepare_ack{u.room, forwarded[i].second, false, no.message,
                                                    static_cast<uint16_t>(no.code)}});
        }
        self->demonitor(it->second.actor);
        finish_room(st, side, u.room, u.status, u.reason, u.code, it->second.prefix_tokens, u.bytes,
                    !u.decode_side && it->second.connections.empty());
        try_release(self);
        check_drained(self);
      },
      [=](memory_mapped& m) {
        auto& st = self->state;
        auto& pool = st.ctx->client_pools[m.pool];
        const auto name = to_string(static_cast<pool_kind>(m.pool));
        if (!m.outcome) {
          pool.now = client_pool::state::unregistered;
          st.ctx->log_sched->warn("client conn={} register_memory failed: {}", m.conn,
                                  m.outcome.message);
          st.ctx->gateway->reply(m.conn, m.seq, std::move(m.outcome).error());
          return;
        }
        if (m.described) publish_description(self, m.pool, *m.described);
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
        if (m.outcome)
          st.ctx->log_sched->info("pool {}: released; it can be registered again", name);
        else
          st.ctx->log_sched->error("pool {}: released with an error: {}", name, m.outcome.message);
      },
      [=](peer_link_first& f) {
        auto& st = self->state;
        auto* h = std::get_if<peer_hello>(&f.msg);
        if (!h) {
          st.ctx->log_peer->warn("peer port: {} ({}) sent {} before its hello; closed",
                                 f.link->source(), f.link->peer_node(),
                                 peer_wire::name(peer_wire::kind_of(f.msg)));
          return f.link->close("a peer must say hello first");
        }
        if (auto why = undescribed_pool(*st.ctx)) {  // nothing to tell the peer yet
          f.link->send(peer_refused{*why});
          return f.link->close(*why);
        }
        auto conn = spawn_inbound_connection(self, st.ctx, f.link, std::move(*h),
                                             caf::actor_cast<caf::actor>(self));
        st.connections.emplace(conn, nullptr);
      },
      [=](peer_resources& r) {
        auto& st = self->state;
        auto conn = caf::actor_cast<caf::actor>(self->current_sender());
        if (!st.connections.count(conn)) return;  // ended meanwhile
        st.fences[conn] = std::move(r.fence);
        if (r.handle)
          st.handles[conn] = *r.handle;
        else
          st.handles.erase(conn);
      },
      [=](peer_ready& p) {
        auto& st = self->state;
        auto conn = caf::actor_cast<caf::actor>(self->current_sender());
        st.connections[conn] = p.info;
        st.fences[conn] = p.fence;
        if (st.draining) self->send(conn, leaving_atom::value);
        // The same node as a new instance: any connection to its old instance belongs to a
        // process that is gone (restarted while its connection still looked open). End it, so
        // its rooms fail now and its registrations are fenced.
        for (auto& [other, info] : st.connections)
          if (other != conn && info && info->node == p.info->node &&
              info->instance != p.info->instance)
            self->send(other, replaced_atom::value, p.info->instance);
      },
      [=](peer_inbound& in) { on_peer_inbound(self, in); },
      [=](leaving_atom, const std::string&) {  // a Connection's peer said it drains
        self->state.draining_peers.insert(caf::actor_cast<caf::actor>(self->current_sender()));
      },
      [=](goodbye_atom) {  // a peer has this daemon's goodbye (or cannot get it)
        self->state.goodbyes.erase(caf::actor_cast<caf::actor>(self->current_sender()));
        check_drained(self);
      },
      [=](peer_down& d) {
        auto& st = self->state;
        for (auto* side : {&st.prefill, &st.decode})
          for (auto& [room, e] : side->active)
            if (std::count(e.connections.begin(), e.connections.end(), d.connection))
              self->send(e.actor, d);
        std::vector<uint64_t> fenced_orphans;
        for (auto& [room, e] : st.decode.active)
          if (e.orphan.fenced(d.connection)) fenced_orphans.push_back(room);
        for (auto room : fenced_orphans)
          fail_orphan(self, st.decode, room, st.decode.active[room].orphan.reason());
        // A Connection the peer could write into fenced it (and cut it) before this message;
        // otherwise remove the peer now that the rooms know why.
        if (!d.cut)
          if (auto it = st.connections.find(d.connection); it != st.connections.end() && it->second)
            st.ctx->engine->remove_peer(it->second->fabric_peer);
        st.fences.erase(d.connection);
        st.handles.erase(d.connection);
        if (d.unresponsive) {
          const auto& t = st.ctx->config.timeouts;
          st.unresponsive.mark(
              d.address, d.reason,
              std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(uint64_t{t.heartbeat_ms} * t.heartbeat_misses));
        }
        st.connections.erase(d.connection);
        st.draining_peers.erase(d.connection);
        if (st.goodbyes.erase(d.connection)) check_drained(self);
        for (auto it = st.outbound.begin(); it != st.outbound.end();)
          it = it->second == d.connection ? st.outbound.erase(it) : std::next(it);
        try_release(self);
      },
  };
}

}  // namespace

caf::actor spawn_scheduler(caf::actor_system& sys, context_ptr ctx) {
  return sys.spawn(scheduler_behavior, std::move(ctx));
}

}  // namespace ferry
