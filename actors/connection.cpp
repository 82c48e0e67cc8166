// Connection: one per peer daemon.
//
// The handshake and the end of a connection are the pure state machine of
// core/peer_handshake.hpp; this actor turns messages into its events and carries out its effects.
//
// Outbound (decode side, created for a prepare naming a prefill address): dial the peer through
// the peer gate, which runs Ferry's preamble (core/peer_preamble.hpp) without blocking a worker
// and gives back a link of Ferry's peer channel (transport/channels/peer_link.hpp), and send our
// `peer_hello` on it; the peer's Scheduler gets it as the link's first message and spawns an
// inbound Connection that validates it and answers with its own `peer_hello` (or
// `peer_refused`). Both sides then check version, roles, compatibility of the layouts and the
// memory regions, and insert the fabric address. The link's end is the peer's end.
//
// Once ready, room messages from local rooms (`peer_outbound`) go out on the link, and room
// messages from the peer go to the local Scheduler for routing. Messages from rooms that arrive
// before the handshake completes are queued.
//
// Authentication: with a cluster secret (security.cluster_secret_file) the hellos carry nonces,
// the accepting side's hello carries its proof, and the connecting side answers `peer_auth`
// with its own; the accepting side becomes ready only then (core/auth.hpp). Each side proves
// with its own secret and accepts a proof made with any of its accepted ones (a second one while
// the cluster rotates), and logs and counts which file's secret the peer proved.
//
// Fencing: a daemon that receives writes registers its pools and staging anew for each peer
// connection (its own remote keys). When the connection ends, it closes those registrations and
// cuts the peer's fabric connection in one step (engine::fence_peer), and only then tells the
// rooms, so a peer declared dead, hung or restarted can never land a late write afterwards --
// on tcp not even the rest of a write it had begun to send. A room whose drain deadline passes
// asks for the same (fence_atom).
//
// Rails (version 7, actors/connection_rails.cpp): once ready, the prefill side sends its fabric
// endpoints (`peer_rails`); the decode side makes them known on its own rails
// (engine::add_peer_rails, so its fence cuts them too) and only then answers with its own,
// which the prefill adds in turn: from then on its batches to this peer are striped across the
// rails both have. A version 5 or 6 peer gets no `peer_rails` (it could not read one) and the
// pair keeps one endpoint each.
//
// Liveness: both sides send a heartbeat every timeouts.heartbeat_ms; a peer from which nothing
// arrived for heartbeat_ms x heartbeat_misses is declared dead (a SIGSTOPped or partitioned
// peer, whose TCP connection still looks open). A peer process that dies closes its socket,
// which ends the link at once.

#include <fmt/format.h>

#include "actors/actors.hpp"
#include "actors/connection_state.hpp"
#include "actors/peer_hello.hpp"
#include "core/auth.hpp"
#include "core/peer_handshake.hpp"
#include "transport/channels/peer_gate.hpp"

namespace ferry {
namespace conn {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void heard(connection_state& st) {
  st.last_heard = now_ms();
  if (st.health) st.health->last_heard_ms = st.last_heard;
}

void send(connection_state& st, const peer_wire::message& m) {
  if (st.link) st.link->send(m);
}

/// Make this actor the link's owner: each inbound message is posted to it as its own type, and
/// the link's end as `link_closed`. Once the peer is ready (`routes`), room messages skip this
/// actor: one with a route (actors/room_routes.hpp) goes from the link's thread straight to its
/// room's actor, any other (a prepare, a message of a room that ended) to the Scheduler, in the
/// order read. Bound again without `routes` when the peer is no longer ready (bind and
/// delivery share the link's lock).
void bind_link(const caf::actor& me, const peer_link_ptr& link, peer_info_ptr peer = nullptr,
               const room_routes* routes = nullptr, caf::actor scheduler = {}) {
  link->bind(
      [me, peer = std::move(peer), routes, scheduler](peer_wire::message&& m) {
        std::visit(
            [&](auto& x) {
              if constexpr (is_room_message<std::decay_t<decltype(x)>>) {
                if (routes) {
                  auto to = routes->of(x, me.id());
                  caf::anon_send(to ? to : scheduler,
                                 peer_inbound{peer, me, caf::make_message(std::move(x))});
                  return;
                }
              }
              caf::anon_send(me, std::move(x));
            },
            m);
      },
      [me](const std::string& why) { caf::anon_send(me, link_closed{why}); });
}

/// Ask for the registrations this peer is described: a daemon that receives writes registers
/// its pools and staging for this peer alone (remote-writable, fresh keys); otherwise the
/// daemon's own local-only registrations are described. The outcome always arrives as
/// `regions_registered`.
void request_registration(connection_actor* self) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  // A client pool without its client's memory cannot be described; the handshake fails and the
  // peer retries with its next room.
  if (auto usable = ctx.pools_usable(); !usable) {
    self->send(self, regions_registered{error{usable.code, usable.message}, false});
    return;
  }
  if (!ctx.serves_decode()) {
    self->send(self, regions_registered{});
    return;
  }
  std::vector<transport::region_request> asked;
  for (const auto& s : described_spaces(ctx))
    asked.push_back({s.base, s.length, transport::region_access::remote_write});
  auto me = caf::actor_cast<caf::actor>(self);
  ctx.engine->register_regions(
      std::move(asked), [me](auto r) { caf::anon_send(me, regions_registered{std::move(r)}); });
}

/// Describe the registrations `request_registration` made.
result<> take_registration(connection_state& st, const regions_registered& m) {
  if (!m.asked) return error{m.outcome.code, m.outcome.message};
  if (!m.outcome)
    return error{m.outcome.code, "memory registration for the peer failed: " + m.outcome.message};
  const auto& ctx = *st.ctx;
  st.regions.assign(pool_kind_count, peer_region{});
  size_t i = 0;
  for (const auto& s : described_spaces(ctx)) {
    const auto d = ctx.engine->describe(ctx.serves_decode() ? m.outcome.value[i++] : s.global);
    (s.kind < 0 ? st.staging : st.regions[s.kind]) = {true, d.remote_base, d.key, d.length};
  }
  return {};
}

/// Ask for the peer's fabric address to be added; the outcome arrives as `peer_inserted`.
void request_insert(connection_actor* self) {
  auto me = caf::actor_cast<caf::actor>(self);
  self->state.ctx->engine->insert_peer_async(self->state.hello.fabric_address, [me](auto r) {
    caf::anon_send(me, peer_inserted{std::move(r)});
  });
}

/// The fence: close this peer's registrations and cut its fabric connection (one step of the
/// progress thread, engine::fence_peer); `done` runs once nothing of the peer can land any more.
/// Whether the connection's end is a drained peer's goodbye: it said it is stopping, then closed
/// the connection itself (not declared dead by the heartbeat, not fenced for a room's failed
/// writes). Counted `drained`, neither lost nor fenced, and logged at info.
bool said_goodbye(const connection_state& st) {
  return !st.leaving.empty() && !st.machine.unresponsive() && !st.fence_asked;
}

void fence_peer(connection_state& st, std::function<void()> done) {
  st.ctx->engine->fence_peer(st.handle, std::move(st.fence), std::move(done));
  st.fence.clear();
}

peer_hello make_hello(const connection_state& st) {
  return describe_self(*st.ctx, st.regions, st.staging, st.nonce);
}

/// Connecting side: the peer's answer, checked (its proof of the cluster secret, then
/// versions, roles, layouts and regions).
result<> check_answer(connection_state& st) {
  const auto& secrets = st.ctx->secrets;
  const auto& h = st.hello;
  if (!secrets.empty()) {
    auto proved = check_peer_proof(secrets, st.nonce, h);
    if (!proved) return error{proved.code, std::move(proved.message)};
    st.proved_with = proved.value;
  }
  auto v = validate_peer(st.ctx->config, h, true, st.address);
  if (!v) return error{v.code, v.message};
  st.candidate = std::move(v.value);
  return {};
}

/// Accepting side: the hello this actor was spawned for, checked.
result<> check_hello(connection_state& st) {
  if (auto ok = check_peer_challenge(!st.ctx->secrets.empty(), st.hello); !ok) return ok;
  auto v = validate_peer(st.ctx->config, st.hello, false, st.address);
  if (!v) return error{v.code, v.message};
  st.candidate = std::move(v.value);
  return {};
}

void tick(connection_actor* self) {
  auto& st = self->state;
  if (!st.machine.ready()) return;
  const auto& t = st.ctx->config.timeouts;
  // Room messages skip this actor: any frame read since the last tick is news.
  if (const auto n = st.link ? st.link->frames_in() : 0; std::exchange(st.frames_seen, n) != n)
    heard(st);
  const int64_t now = now_ms();
  const auto step = hs::heartbeat_tick(now, st.tick_due, st.last_heard, st.next_beat,
                                       t.heartbeat_ms, t.heartbeat_misses);
  if (step.own_stall)
    st.ctx->log_peer->warn(
        "peer={}: this daemon did not run for {} ms (stopped or starved); the peer is judged "
        "after what arrived meanwhile has been read",
        st.address, now - st.tick_due);
  if (step.dead)
    return apply(self, st.machine.on(hs::ev::lost{
                           fmt::format("peer unresponsive: nothing heard for {} ms "
                                       "(timeouts.heartbeat_ms {} x heartbeat_misses "
                                       "{})",
                                       step.silent_ms, t.heartbeat_ms, t.heartbeat_misses),
                           true}));
  if (step.send) send(st, peer_heartbeat{});
  // After a stalled tick the next one judges however late it runs (due unknown): a daemon that
  // is always late still declares a silent peer dead, one period later at most.
  st.tick_due = step.own_stall ? 0 : now + step.wake_in_ms;
  self->delayed_send(self, std::chrono::milliseconds(step.wake_in_ms), tick_atom::value);
}

/// Outbound: dial the peer through the peer gate; the result arrives as `peer_dialed`. The
/// address was checked to be host:port by outbound_behavior.
void dial(connection_actor* self) {
  auto& st = self->state;
  // Runs on the gate thread (or here, when the dial fails at once): only wrap and post. The
  // link reads nothing until the actor binds it; if the actor is gone, the message and the link
  // are dropped, and the peer closes a link that never says hello.
  auto me = caf::actor_cast<caf::actor>(self);
  st.ctx->peer_port->dial(st.host, st.port,
                          [me](const peer_link_ptr& link, const std::string& error, bool reset) {
                            caf::anon_send(me, peer_dialed{link, error, reset});
                          });
}

/// Our hello: the link's first message (connecting), or the answer to the peer's (accepting;
/// with a cluster secret, with our nonce and our proof over both).
void send_hello(connection_actor* self) {
  auto& st = self->state;
  auto h = make_hello(st);
  if (st.machine.which() == hs::side::connecting) {
    send(st, std::move(h));
    return;
  }
  const auto& secrets = st.ctx->secrets;
  if (!secrets.empty()) {
    st.nonce = random_bytes(auth_nonce_bytes);
    h.nonce = st.nonce;
    h.proof = auth_proof(secrets.proving(), "ferry-accept", st.hello.nonce, st.nonce,
                         identity(st.ctx->config.node_name, st.ctx->instance));
  }
  send(st, std::move(h));
}

/// The peer as the metrics name it: its node, the same on both sides and across its restarts
/// (not the address dialed, nor node/instance); its address only before any hello named it.
const std::string& metrics_peer(const connection_state& st) {
  return st.hello.node.empty() ? st.address : st.hello.node;
}

void become_ready(connection_actor* self) {
  auto& st = self->state;
  st.candidate->channel = st.link;
  st.info = std::move(st.candidate);
  bind_link(caf::actor_cast<caf::actor>(self), st.link, st.info, &st.ctx->routes, st.scheduler);
  st.routed = true;
  st.health = st.ctx->metrics->peer_ready(metrics_peer(st));
  heard(st);
  st.next_beat = st.last_heard;  // the first tick sends one
  st.tick_due = st.last_heard + st.ctx->config.timeouts.heartbeat_ms;
  self->delayed_send(self, std::chrono::milliseconds(st.ctx->config.timeouts.heartbeat_ms),
                     tick_atom::value);
  std::string proved;
  if (st.proved_with >= 0) {
    const auto& file = st.ctx->secret_files[static_cast<size_t>(st.proved_with)];
    proved = fmt::format("; it proved the cluster secret of {} ({})", file,
                         st.proved_with == 0 ? "security.cluster_secret_file"
                                             : "security.accepted_cluster_secret_file");
    st.ctx->metrics->peer_authenticated(file);
  }
  st.ctx->log_peer->info("peer={} connected: node {} instance {}; link {}{}", st.address,
                         st.info->node, st.info->instance, st.info->link->describe(), proved);
  for (auto& rp : st.waiting) rp.deliver(peer_lookup{st.info, {}});
  st.waiting.clear();
  self->send(st.scheduler, peer_ready{st.address, st.info, {}, st.fence});
  for (const auto& m : st.queued) send(st, m);
  st.queued.clear();
  rails_when_ready(self);
}

void apply(connection_actor* self, hs::effects fx) {
  auto& st = self->state;
  auto me = caf::actor_cast<caf::actor>(self);
  for (auto& e : fx) {
    std::visit(
        [&](auto& x) {
          using E = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<E, hs::register_memory>) {
            request_registration(self);
          } else if constexpr (std::is_same_v<E, hs::insert_address>) {
            request_insert(self);
          } else if constexpr (std::is_same_v<E, hs::dial>) {
            dial(self);
          } else if constexpr (std::is_same_v<E, hs::redial_after>) {
            st.ctx->log_peer->info("peer={} dial {} of {}: {}; dialing again", st.address, x.dials,
                                   hs::max_dials, x.error);
            self->delayed_send(self, std::chrono::milliseconds(x.ms), redial_atom::value);
          } else if constexpr (std::is_same_v<E, hs::send_hello>) {
            send_hello(self);
          } else if constexpr (std::is_same_v<E, hs::send_proof>) {
            send(st, peer_auth{auth_proof(st.ctx->secrets.proving(), "ferry-connect",
                                          st.hello.nonce, st.nonce,
                                          identity(st.ctx->config.node_name, st.ctx->instance))});
          } else if constexpr (std::is_same_v<E, hs::send_refusal>) {
            send(st, peer_refused{x.reason});
          } else if constexpr (std::is_same_v<E, hs::report_resources>) {
            // For the Scheduler's fallback fence, should this actor end abnormally.
            self->send(st.scheduler, peer_resources{st.fence, st.handle});
          } else if constexpr (std::is_same_v<E, hs::become_ready>) {
            become_ready(self);
          } else if constexpr (std::is_same_v<E, hs::closing_with>) {
            for (auto& rp : st.waiting) rp.deliver(peer_lookup{nullptr, x.reason, x.code});
            st.waiting.clear();
            // A peer that said it drains and then goes (not silent: it closed) said goodbye.
            if (said_goodbye(st))
              st.ctx->log_peer->info("peer={} drained and closed its connection: {}", st.address,
                                     x.reason);
            else
              st.ctx->log_peer->warn("peer={} connection closed: {}", st.address, x.reason);
          } else if constexpr (std::is_same_v<E, hs::release>) {
            st.ctx->log_peer->warn("peer={} refused: {}", st.address, x.reason);
            fence_peer(st, nullptr);
            // Closed here: the Scheduler's fallback must not close or remove them again when it
            // sees this actor end (messages to it arrive before the down message).
            self->send(st.scheduler, peer_resources{});
          } else if constexpr (std::is_same_v<E, hs::fence>) {
            if (!said_goodbye(st)) st.ctx->metrics->peer_fenced(metrics_peer(st));
            fence_peer(st, [me] { caf::anon_send(me, fenced_atom::value); });
          } else if constexpr (std::is_same_v<E, hs::remove_address>) {
            if (st.handle) st.ctx->engine->remove_peer(*st.handle);
          } else if constexpr (std::is_same_v<E, hs::report_down>) {
            const auto& m = st.machine;
            if (x.was_ready && said_goodbye(st))
              st.ctx->metrics->peer_drained(metrics_peer(st));
            else if (x.was_ready)
              st.ctx->metrics->peer_lost(metrics_peer(st));
            st.health.reset();  // no longer ready: out of the scrape
            self->send(st.scheduler, peer_down{st.address, me, m.reason(), x.was_ready, true,
                                               x.unresponsive, x.cut, m.code()});
          } else if constexpr (std::is_same_v<E, hs::quit>) {
            if (st.link) st.link->close(st.machine.reason());
            self->quit();
          }
        },
        e);
  }
  // A peer no longer ready speaks to no room: what it still sends comes here and is dropped.
  if (st.routed && !st.machine.ready()) {
    st.routed = false;
    if (st.link && !st.link->closed()) bind_link(me, st.link);
  }
}

/// Behaviour shared by both directions once constructed.
caf::behavior relay(connection_actor* self) {
  auto inbound = [=](caf::message m) {
    auto& st = self->state;
    if (st.machine.closed()) return;
    if (auto why = st.machine.unexpected(hs::inbound::room_message))
      return apply(self, st.machine.on(hs::ev::lost{std::move(*why)}));
    heard(st);
    self->send(st.scheduler,
               peer_inbound{st.info, caf::actor_cast<caf::actor>(self), std::move(m)});
  };
  return {
      [=](info_atom) -> caf::result<peer_lookup> {
        auto& st = self->state;
        if (st.machine.ready() && !st.leaving.empty())
          return peer_lookup{nullptr,
                             fmt::format("peer {} is draining: {}", st.address, st.leaving),
                             errc::draining};
        if (st.machine.ready()) return peer_lookup{st.info, {}};
        if (st.machine.closed())
          return peer_lookup{nullptr, st.machine.reason(), st.machine.code()};
        auto rp = self->make_response_promise();
        st.waiting.push_back(rp);
        return caf::delegated<peer_lookup>();
      },
      [=](peer_outbound& o) {
        auto& st = self->state;
        if (st.machine.ready())
          send(st, o.msg);
        else if (!st.machine.closed())
          st.queued.push_back(std::move(o.msg));
      },
      [=](peer_prepare& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_prepare_paged& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_prepare_ack& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_announce& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_outcome& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_drained& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_staging_request& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_staging_grant& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_prepare_checked& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_announce_checked& m) { inbound(caf::make_message(std::move(m))); },
      [=](peer_heartbeat) {
        auto& st = self->state;
        if (st.machine.ready()) heard(st);
      },
      [=](link_closed& c) {
        apply(self, self->state.machine.on(hs::ev::lost{"peer connection ended: " + c.reason}));
      },
      [=](tick_atom) { tick(self); },
      [=](leaving_atom) {
        auto& st = self->state;
        auto told = [self] { self->send(self->state.scheduler, goodbye_atom::value); };
        if (!st.machine.ready() || st.info->version < peer_leaving_version) return told();
        // Answered (peer_leaving_ack) once the peer handled it: the peer has the goodbye, so the
        // drain does not end before it, and a stop is no loss to it. Bounded by a heartbeat.
        send(st, peer_leaving{"it began a stop; it finishes the rooms it accepted, then exits"});
        if (st.info->version < peer_leaving_ack_version) return told();
        st.goodbye_pending = true;
        self->delayed_send(self, std::chrono::milliseconds(st.ctx->config.timeouts.heartbeat_ms),
                           goodbye_atom::value);
      },
      [=](goodbye_atom) {  // the peer's answer did not come within a heartbeat
        auto& st = self->state;
        if (!st.goodbye_pending) return;
        st.goodbye_pending = false;
        self->send(st.scheduler, goodbye_atom::value);
      },
      [=](peer_leaving_ack) {
        auto& st = self->state;
        if (!st.goodbye_pending) return;
        heard(st);
        st.goodbye_pending = false;
        self->send(st.scheduler, goodbye_atom::value);
      },
      [=](peer_rails& m) { on_peer_rails(self, m); },
      [=](rails_added& m) { on_rails_added(self, m); },
      [=](peer_leaving& m) {
        auto& st = self->state;
        // Answered even before this side is ready (the peer may be ready first), so its drain
        // does not wait a heartbeat for nothing.
        if (std::min(st.hello.version, spoken_peer_version()) >= peer_leaving_ack_version)
          send(st, peer_leaving_ack{});
        if (!st.machine.ready()) return;
        heard(st);
        st.leaving = m.reason;
        // Before the log line: whoever reads the line and then asks for the peers finds it so.
        self->send(st.scheduler, leaving_atom::value, st.address);  // peers info: draining
        st.ctx->log_peer->info("peer={} is draining: {}; new rooms naming it fail (407 draining)",
                               st.address, m.reason);
      },
      [=](redial_atom) { apply(self, self->state.machine.on(hs::ev::redial{})); },
      [=](unusable_atom, const std::string& why) {
        apply(self, self->state.machine.on(hs::ev::lost{why}));
      },
      [=](fence_atom, const std::string& why) {
        self->state.fence_asked = true;
        apply(self, self->state.machine.on(hs::ev::lost{why}));
      },
      [=](fenced_atom) { apply(self, self->state.machine.on(hs::ev::fenced{})); },
      [=](replaced_atom, const std::string& instance) {
        auto& st = self->state;
        apply(self, st.machine.on(
                        hs::ev::lost{fmt::format("peer restarted: instance {} replaced by {}",
                                                 st.info ? st.info->instance : "?", instance)}));
      },
      [=](peer_hello& h) {
        auto& st = self->state;
        if (auto why = st.machine.unexpected(hs::inbound::hello))
          return apply(self, st.machine.on(hs::ev::lost{std::move(*why)}));
        st.hello = std::move(h);
        apply(self, st.machine.on(hs::ev::hello{check_answer(st)}));
      },
      [=](regions_registered& m) {
        auto& st = self->state;
        result<> described;
        if (st.machine.closed()) {
          // Too late for the handshake, not for the fence: the peer never saw these keys.
          if (m.outcome)
            st.fence.insert(st.fence.end(), m.outcome.value.begin(), m.outcome.value.end());
        } else {
          described = take_registration(st, m);
          if (m.outcome) st.fence = m.outcome.value;
        }
        apply(self, st.machine.on(hs::ev::registered{std::move(described), !st.fence.empty()}));
      },
      [=](peer_inserted& m) {
        auto& st = self->state;
        // Once closed, part of the fence (keys closed, then the peer cut, in one engine step),
        // not a separate removal: the peer may hold our keys already.
        if (m.outcome) {
          st.handle = m.outcome.value;
          if (st.candidate) st.candidate->fabric_peer = m.outcome.value;
        }
        result<> r;
        if (!m.outcome) r = error{m.outcome.code, m.outcome.message};
        apply(self, st.machine.on(hs::ev::inserted{std::move(r)}));
      },
      [=](peer_auth& a) {
        auto& st = self->state;
        if (auto why = st.machine.unexpected(hs::inbound::proof))
          return apply(self, st.machine.on(hs::ev::lost{std::move(*why)}));
        st.proved_with =
            matching_secret(st.ctx->secrets, a.proof, "ferry-connect", st.nonce, st.hello.nonce,
                            identity(st.candidate->node, st.candidate->instance));
        apply(self, st.machine.on(hs::ev::authenticated{st.proved_with >= 0}));
      },
      [=](peer_refused& r) { apply(self, self->state.machine.on(hs::ev::refused{r.reason})); },
      [=](peer_dialed& d) {
        auto& st = self->state;
        const auto o = d.link    ? hs::dial_outcome::connected
                       : d.reset ? hs::dial_outcome::reset
                                 : hs::dial_outcome::failed;
        if (d.link && st.machine.closed()) return d.link->close("the connection ended");
        st.link = std::move(d.link);
        if (st.link) bind_link(caf::actor_cast<caf::actor>(self), st.link);
        apply(self, st.machine.on(hs::ev::dialed{o, d.error}));
      },
      [=](deadline_msg& d) { apply(self, self->state.machine.on(hs::ev::deadline{d.ms})); },
  };
}

caf::behavior outbound_behavior(connection_actor* self, context_ptr ctx, std::string address,
                                caf::actor scheduler, std::string known_down) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.address = address;
  st.scheduler = std::move(scheduler);
  st.machine = hs::machine(hs::side::connecting, address, !st.ctx->secrets.empty());
  const auto ms = st.ctx->config.timeouts.handshake_ms;
  self->delayed_send(self, std::chrono::milliseconds(ms), deadline_msg{"handshake", ms, {}});
  if (!known_down.empty()) {
    self->send(self, unusable_atom::value, std::move(known_down));
    return relay(self);
  }
  if (!st.ctx->secrets.empty()) st.nonce = random_bytes(auth_nonce_bytes);
  const auto colon = address.rfind(':');
  int port = 0;
  if (colon != std::string::npos) port = std::atoi(address.c_str() + colon + 1);
  if (colon == std::string::npos || port <= 0 || port > 65535) {
    self->send(self,
               peer_refused{fmt::format("bad peer address '{}': expected host:port", address)});
    return relay(self);
  }
  st.host = address.substr(0, colon);
  st.port = static_cast<uint16_t>(port);
  // Our memory is described in our hello: register it first, then dial.
  apply(self, st.machine.on(hs::ev::start{}));
  return relay(self);
}

caf::behavior inbound_behavior(connection_actor* self, context_ptr ctx, peer_link_ptr link,
                               peer_hello hello, caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.link = std::move(link);
  bind_link(caf::actor_cast<caf::actor>(self), st.link);
  st.scheduler = std::move(scheduler);
  st.address = identity(hello.node, hello.instance);
  st.machine = hs::machine(hs::side::accepting, st.address, !st.ctx->secrets.empty());
  const auto ms = st.ctx->config.timeouts.handshake_ms;
  self->delayed_send(self, std::chrono::milliseconds(ms), deadline_msg{"handshake", ms, {}});
  st.hello = std::move(hello);
  // Then add its fabric address, register our memory for it, and answer.
  apply(self, st.machine.on(hs::ev::hello{check_hello(st)}));
  return relay(self);
}

}  // namespace conn

caf::actor spawn_outbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                     std::string address, caf::actor scheduler,
                                     std::string known_down) {
  return parent->spawn<caf::monitored>(conn::outbound_behavior, std::move(ctx), std::move(address),
                                       std::move(scheduler), std::move(known_down));
}

caf::actor spawn_inbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                    peer_link_ptr link, peer_hello hello, caf::actor scheduler) {
  return parent->spawn<caf::monitored>(conn::inbound_behavior, std::move(ctx), std::move(link),
                                       std::move(hello), std::move(scheduler));
}

}  // namespace ferry
