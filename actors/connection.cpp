// Connection: one per peer daemon.
//
// Outbound (decode side, created for a prepare naming a prefill address): dial the peer through
// the peer gate, which runs Ferry's preamble (core/peer_preamble.hpp) without blocking a worker,
// hand the socket to CAF's BASP broker as a client connection, and send our `peer_hello` to the
// Scheduler the peer's gate published on it; the peer spawns an inbound Connection that validates
// it and answers with its own `peer_hello` (or `peer_refused`). Both sides then check version,
// roles, compatibility of the layouts and the memory regions, insert the fabric address, and
// monitor each other.
//
// Once ready, room messages from local rooms (`peer_outbound`) go to the remote Connection, and
// room messages from the remote go to the local Scheduler for routing. Messages from rooms that
// arrive before the handshake completes are queued.
//
// Authentication: with a cluster secret (security.cluster_secret_file) the hellos carry nonces,
// the accepting side's hello carries its proof, and the connecting side answers `peer_auth`
// with its own; the accepting side becomes ready only then (core/auth.hpp).
//
// Fencing: a daemon that receives writes registers its pools and staging anew for each peer
// connection (its own remote keys). When the connection ends, it closes those registrations and
// cuts the peer's fabric connection in one step (engine::fence_peer), and only then tells the
// rooms, so a peer declared dead, hung or restarted can never land a late write afterwards --
// on tcp not even the rest of a write it had begun to send. A room whose drain deadline passes
// asks for the same (fence_atom).
//
// Liveness: both sides send a heartbeat every timeouts.heartbeat_ms; a peer from which nothing
// arrived for heartbeat_ms x heartbeat_misses is declared dead (a SIGSTOPped or partitioned
// peer, whose TCP connection CAF still believes open).

#include <fmt/format.h>

#include <algorithm>
#include <caf/io/all.hpp>

#include "actors/actors.hpp"
#include "actors/peer_gate.hpp"
#include "actors/peer_hello.hpp"
#include "core/auth.hpp"

namespace ferry {
namespace {

/// Peer gate -> Connection: the dialed socket, through the preamble, or why not. A scribe that
/// is never used (the actor is gone or done) closes its socket when the message is dropped.
struct peer_dialed {
  caf::io::scribe_ptr scribe;
  std::string error;
  bool reset = false;  // reset in the middle of the preamble: perhaps evicted by a flood
};

/// Connection -> itself: dial the peer again.
using redial_atom = caf::atom_constant<caf::atom("redial")>;

/// Engine -> Connection: the registrations asked for this peer are made, or why not.
struct regions_registered {
  result<std::vector<transport::region_id>> outcome;
};

/// Engine -> Connection: the peer's fabric address is in the address vector, or why not.
struct peer_inserted {
  result<transport::peer_handle> outcome;
};

/// A peer under a flood of connections from our own address (or from many) may evict our
/// pending preamble (actors/peer_gate.hpp); honest preambles are the newest, so another dial
/// soon gets through. Bounded: this many dials, and timeouts.handshake_ms overall.
constexpr int max_dials = 6;
constexpr auto first_redial_delay = std::chrono::milliseconds(20);

}  // namespace
}  // namespace ferry

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_dialed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::regions_registered)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::peer_inserted)

namespace ferry {
namespace {

struct connection_state {
  static inline const char* name = "ferry.connection";
  context_ptr ctx;
  caf::actor scheduler;
  std::string address;
  caf::actor basp;   // outbound: CAF's BASP broker, given the dialed socket
  std::string host;  // outbound: the peer's control address, split once
  uint16_t port = 0;
  int dials = 0;  // outbound: dials made (see max_dials)
  caf::actor remote;
  peer_info_ptr info;
  std::vector<caf::message> queued;
  std::vector<caf::response_promise> waiting;  // info requests before the handshake finished
  std::string failure;                         // why the connection ended (once done)
  errc failure_code = errc::ok;
  bool done = false;
  bytes nonce;                         // ours, when a cluster secret is configured
  bytes peer_nonce;                    // the accepting side keeps the connecting one's
  std::shared_ptr<peer_info> pending;  // accepting side: validated, awaiting peer_auth
  caf::actor pending_remote;
  // The engine calls of the handshake complete asynchronously (no worker waits on the fabric):
  std::shared_ptr<peer_info> validated;  // its hello passed; its fabric address is being added
  peer_hello hello;                      // that hello (its sender, nonce)
  int engine_calls = 0;                  // registrations or insertions not yet answered
  std::optional<transport::peer_handle> late_peer;  // inserted after the handshake had ended
  bool hello_sent = false;                          // outbound: our hello is on its way
  bool closing = false;                     // finished, and the fence or the report is under way
  std::vector<transport::region_id> fence;  // this peer's own registrations
  peer_down down;                           // what the rooms are told once the fence is done
  std::vector<peer_region> regions;         // as described to this peer, by pool kind
  peer_region staging;
  std::chrono::steady_clock::time_point last_heard;
  std::chrono::steady_clock::time_point next_beat;  // when the next heartbeat is due
};

using connection_actor = caf::stateful_actor<connection_state>;

/// Ask for the registrations this peer is described: a daemon that receives writes registers
/// its pools and staging for this peer alone (remote-writable, fresh keys); otherwise the
/// daemon's own local-only registrations are described. The outcome arrives as
/// `regions_registered`. Fails when the pools cannot be described (nothing asked).
result<> request_registration(connection_actor* self) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  // A client pool without its client's memory cannot be described; the handshake fails and the
  // peer retries with its next room.
  if (auto usable = ctx.pools_usable(); !usable) return usable;
  ++st.engine_calls;
  if (!ctx.serves_decode()) {
    self->send(self, regions_registered{});
    return {};
  }
  std::vector<transport::region_request> asked;
  for (const auto& s : described_spaces(ctx))
    asked.push_back({s.base, s.length, transport::region_access::remote_write});
  auto me = caf::actor_cast<caf::actor>(self);
  ctx.engine->register_regions(
      std::move(asked), [me](auto r) { caf::anon_send(me, regions_registered{std::move(r)}); });
  return {};
}

/// Describe the registrations `request_registration` made.
result<> take_registration(connection_state& st, regions_registered& m) {
  if (!m.outcome)
    return error{m.outcome.code, "memory registration for the peer failed: " + m.outcome.message};
  const auto& ctx = *st.ctx;
  st.fence = m.outcome.value;
  st.regions.assign(pool_kind_count, peer_region{});
  size_t i = 0;
  for (const auto& s : described_spaces(ctx)) {
    const auto d = ctx.engine->describe(ctx.serves_decode() ? m.outcome.value[i++] : s.global);
    (s.kind < 0 ? st.staging : st.regions[s.kind]) = {true, d.remote_base, d.key, d.length};
  }
  return {};
}

/// Ask for the peer's fabric address to be added; the outcome arrives as `peer_inserted`.
void request_insert(connection_actor* self, const std::vector<uint8_t>& address) {
  ++self->state.engine_calls;
  auto me = caf::actor_cast<caf::actor>(self);
  self->state.ctx->engine->insert_peer_async(
      address, [me](auto r) { caf::anon_send(me, peer_inserted{std::move(r)}); });
}

/// The fabric handle this connection inserted for its peer, if any.
std::optional<transport::peer_handle> inserted_peer(const connection_state& st) {
  if (st.info) return st.info->fabric_peer;
  if (st.pending) return st.pending->fabric_peer;
  return st.late_peer;
}

/// The fence: close this peer's registrations and cut its fabric connection (one step of the
/// progress thread, engine::fence_peer); `done` runs once nothing of the peer can land any more.
void fence(connection_state& st, std::function<void()> done) {
  st.ctx->engine->fence_peer(inserted_peer(st), std::move(st.fence), std::move(done));
  st.fence.clear();
}

peer_hello make_hello(const connection_state& st, caf::actor self) {
  return describe_self(*st.ctx, st.regions, st.staging, st.nonce, std::move(self));
}

/// After `finish`, once no engine call of the handshake is outstanding (a registration or an
/// insertion answered later is part of what the fence must close): fence the peer, then tell
/// the rooms and quit.
void close_out(connection_actor* self) {
  auto& st = self->state;
  if (!st.done || st.closing || st.engine_calls > 0) return;
  st.closing = true;
  if (st.fence.empty()) {
    // The peer was given nothing to write into (this daemon only sends to it): tell the rooms
    // now. The Scheduler removes a connected peer after them; one still in its handshake is
    // removed here.
    if (!st.info)
      if (auto handle = inserted_peer(st)) st.ctx->engine->remove_peer(*handle);
    self->send(st.scheduler, std::move(st.down));
    self->quit();
    return;
  }
  st.down.cut = true;
  auto me = caf::actor_cast<caf::actor>(self);
  fence(st, [me] { caf::anon_send(me, fenced_atom::value); });
}

/// End the connection: fence the peer, then tell the rooms why (`code`: peer_lost once
/// connected, else peer_unreachable unless the caller says the handshake itself was refused).
void finish(connection_actor* self, const std::string& reason, bool unresponsive = false,
            errc code = errc::ok) {
  auto& st = self->state;
  if (st.done) return;
  st.done = true;
  st.failure = reason;
  if (code == errc::ok) code = st.info ? errc::peer_lost : errc::peer_unreachable;
  st.failure_code = code;
  for (auto& rp : st.waiting) rp.deliver(peer_lookup{nullptr, reason, code});
  st.waiting.clear();
  st.ctx->log_peer->warn("peer={} connection closed: {}", st.address, reason);
  // Rooms learn of the loss only once the fence is complete: a room that then reports Failed
  // hands its pages back, and no byte of this peer may land in them afterwards (tcp: not even
  // the rest of a write it had begun to send). Until then this actor ignores everything else.
  st.down = peer_down{st.address, caf::actor_cast<caf::actor>(self),
                      reason,     st.info != nullptr,
                      true,       unresponsive,
                      false,      code};
  close_out(self);
}

void tick(connection_actor* self) {
  auto& st = self->state;
  if (st.done) return;
  const auto& t = st.ctx->config.timeouts;
  const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(
                          std::chrono::steady_clock::now() - st.last_heard)
                          .count();
  const int64_t bound = int64_t{t.heartbeat_ms} * t.heartbeat_misses;
  if (silent > bound)
    return finish(self,
                  fmt::format("peer unresponsive: nothing heard for {} ms (timeouts."
                              "heartbeat_ms {} x heartbeat_misses {})",
                              silent, t.heartbeat_ms, t.heartbeat_misses),
                  true);
  const auto now = std::chrono::steady_clock::now();
  if (now >= st.next_beat) {
    self->send(st.remote, heartbeat_atom::value);
    st.next_beat = now + std::chrono::milliseconds(t.heartbeat_ms);
  }
  // Wake for the next heartbeat, or just after the silence would exceed the bound if that is
  // sooner, so a silent peer is declared dead within the bound, not up to a period later.
  const auto deadline = st.last_heard + std::chrono::milliseconds(bound + 1);
  const auto wake = std::min(st.next_beat, deadline);
  self->delayed_send(self,
                     std::max(std::chrono::milliseconds(1),
                              std::chrono::duration_cast<std::chrono::milliseconds>(wake - now)),
                     tick_atom::value);
}

void become_ready(connection_actor* self, std::shared_ptr<peer_info> info, caf::actor remote) {
  auto& st = self->state;
  st.info = std::move(info);
  st.pending.reset();
  st.remote = std::move(remote);
  self->monitor(st.remote);
  st.last_heard = std::chrono::steady_clock::now();
  st.next_beat = st.last_heard;  // the first tick sends one
  self->delayed_send(self, std::chrono::milliseconds(st.ctx->config.timeouts.heartbeat_ms),
                     tick_atom::value);
  st.ctx->log_peer->info("peer={} connected: node {} instance {}; link {}", st.address,
                         st.info->node, st.info->instance, st.info->link->describe());
  for (auto& rp : st.waiting) rp.deliver(peer_lookup{st.info, {}});
  st.waiting.clear();
  self->send(st.scheduler, peer_ready{st.address, st.info, {}, st.fence});
  for (auto& m : st.queued) self->send(st.remote, std::move(m));
  st.queued.clear();
}

/// Outbound: dial the peer through the peer gate; the result arrives as `peer_dialed`. The
/// address was checked to be host:port by outbound_behavior.
void dial(connection_actor* self) {
  auto& st = self->state;
  ++st.dials;
  // Runs on the gate thread (or here, when the dial fails at once): only wrap and post.
  auto me = caf::actor_cast<caf::actor>(self);
  auto* mm = &self->system().middleman();
  st.ctx->peer_port->dial(
      st.host, st.port, [me, mm](int fd, const std::string&, const std::string& error, bool reset) {
        peer_dialed d;
        if (fd >= 0) d.scribe = mm->backend().new_scribe(fd);
        d.error = error;
        d.reset = reset;
        caf::anon_send(me, std::move(d));
      });
}

/// Tell the Scheduler what this handshake made so far (registrations, the peer's address), for
/// its fallback fence should this actor end abnormally before it is ready.
void report_resources(connection_actor* self) {
  auto& st = self->state;
  self->send(st.scheduler, peer_resources{st.fence, inserted_peer(st)});
}

/// Accepting side: refuse the peer's hello, naming why, and end without reporting a peer (the
/// Scheduler sees this actor go down).
void refuse_inbound(connection_actor* self, const std::string& why) {
  auto& st = self->state;
  st.ctx->log_peer->warn("peer={} refused: {}", st.address, why);
  if (st.hello.connection) self->send(st.hello.connection, peer_refused{why});
  st.done = st.closing = true;
  fence(st, nullptr);  // nothing was described to the peer yet: close and remove what we made
  // Closed here: the Scheduler's fallback must not close or remove them again when it sees this
  // actor end (messages to it arrive before the down message).
  self->send(st.scheduler, peer_resources{});
  self->quit();
}

/// Accepting side, its memory registered for the peer: answer with our hello; ready at once, or
/// once the peer proves the cluster secret (peer_auth).
void answer_inbound(connection_actor* self) {
  auto& st = self->state;
  const auto& secret = st.ctx->cluster_secret;
  auto h = make_hello(st, caf::actor_cast<caf::actor>(self));
  if (secret.empty()) {
    self->send(st.hello.connection, std::move(h));
    return become_ready(self, std::move(st.pending), st.hello.connection);
  }
  st.peer_nonce = st.hello.nonce;
  st.nonce = random_bytes(auth_nonce_bytes);
  h.nonce = st.nonce;
  h.proof = auth_proof(secret, "ferry-accept", st.peer_nonce, st.nonce,
                       identity(st.ctx->config.node_name, st.ctx->instance));
  self->send(st.hello.connection, std::move(h));
  st.pending_remote = st.hello.connection;
}

/// Behaviour shared by both directions once constructed.
caf::behavior relay(connection_actor* self, bool outbound) {
  self->set_down_handler([=](caf::down_msg& dm) {
    if (dm.source == self->state.remote)
      finish(self, "peer went down: " + self->system().render(dm.reason));
  });
  auto inbound = [=](caf::message m) {
    auto& st = self->state;
    if (st.done) return;
    if (!st.info) {
      // Only a peer that skipped the handshake or authentication sends room messages now.
      if (st.pending_remote &&
          self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(st.pending_remote))
        finish(self, "peer sent a room message before it authenticated");
      return;
    }
    if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(st.remote)) return;
    st.last_heard = std::chrono::steady_clock::now();
    self->send(st.scheduler,
               peer_inbound{st.info, caf::actor_cast<caf::actor>(self), std::move(m)});
  };
  return {
      [=](info_atom) -> caf::result<peer_lookup> {
        auto& st = self->state;
        if (st.info) return peer_lookup{st.info, {}};
        if (st.done) return peer_lookup{nullptr, st.failure, st.failure_code};
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
      [=](peer_drained& m) { inbound(caf::make_message(std::move(m))); },
      [=](heartbeat_atom) {
        auto& st = self->state;
        if (st.info && self->current_sender() == caf::actor_cast<caf::strong_actor_ptr>(st.remote))
          st.last_heard = std::chrono::steady_clock::now();
      },
      [=](tick_atom) { tick(self); },
      [=](redial_atom) {
        if (outbound && !self->state.done && !self->state.remote) dial(self);
      },
      [=](unusable_atom, const std::string& why) { finish(self, why); },
      [=](fence_atom, const std::string& why) { finish(self, why); },
      [=](fenced_atom) {
        auto& st = self->state;
        self->send(st.scheduler, std::move(st.down));
        self->quit();
      },
      [=](replaced_atom, const std::string& instance) {
        auto& st = self->state;
        finish(self, fmt::format("peer restarted: instance {} replaced by {}",
                                 st.info ? st.info->instance : "?", instance));
      },
      [=](peer_hello& h) {
        auto& st = self->state;
        // Only the outbound side awaits an answer, and only one.
        if (!outbound || !st.hello_sent || st.info || st.done || st.validated) return;
        const auto& secret = st.ctx->cluster_secret;
        auto refuse = [&](const std::string& e) {
          if (h.connection) self->send(h.connection, peer_refused{e});
          finish(self, "handshake failed: " + e, false, errc::peer_incompatible);
        };
        if (!secret.empty()) {
          if (h.proof.empty())
            return refuse(fmt::format(
                "peer {} did not prove the cluster secret (is its security.cluster_secret_file "
                "set?)",
                identity(h.node, h.instance)));
          if (!proofs_equal(h.proof, auth_proof(secret, "ferry-accept", st.nonce, h.nonce,
                                                identity(h.node, h.instance))))
            return refuse(
                fmt::format("peer {} failed the cluster-secret challenge (different "
                            "secrets?)",
                            identity(h.node, h.instance)));
        }
        auto v = validate_peer(st.ctx->config, h, true, st.address);
        if (!v) return refuse(v.message);
        st.validated = std::move(v.value);
        st.hello = std::move(h);
        request_insert(self, st.hello.fabric_address);
      },
      [=](regions_registered& m) {
        auto& st = self->state;
        --st.engine_calls;
        if (st.done) {
          // Too late for the handshake, not for the fence: the peer never saw these keys.
          if (m.outcome)
            st.fence.insert(st.fence.end(), m.outcome.value.begin(), m.outcome.value.end());
          return close_out(self);
        }
        auto taken = take_registration(st, m);
        report_resources(self);
        if (!taken) {
          if (!outbound) return refuse_inbound(self, taken.message);
          return finish(self, "peer refused the handshake: " + taken.message, false,
                        errc::peer_incompatible);
        }
        if (outbound) return dial(self);
        answer_inbound(self);
      },
      [=](peer_inserted& m) {
        auto& st = self->state;
        --st.engine_calls;
        if (st.done) {
          // Part of the fence (keys closed, then the peer cut, in one engine step), not a
          // separate removal: the peer may hold our keys already.
          if (m.outcome) st.late_peer = m.outcome.value;
          st.validated.reset();
          return close_out(self);
        }
        auto info = std::move(st.validated);
        if (!m.outcome) {
          const auto e = "cannot add the peer's fabric address: " + m.outcome.message;
          if (!outbound) return refuse_inbound(self, e);
          if (st.hello.connection) self->send(st.hello.connection, peer_refused{e});
          return finish(self, "handshake failed: " + e, false, errc::peer_incompatible);
        }
        info->fabric_peer = m.outcome.value;
        if (!outbound) {
          st.pending = std::move(info);
          report_resources(self);
          // Accepting side: the peer is now ours to remove; describe our memory to it next.
          if (auto e = request_registration(self); !e) return refuse_inbound(self, e.message);
          return;
        }
        const auto& secret = st.ctx->cluster_secret;
        if (!secret.empty())
          self->send(st.hello.connection,
                     peer_auth{auth_proof(secret, "ferry-connect", st.hello.nonce, st.nonce,
                                          identity(st.ctx->config.node_name, st.ctx->instance))});
        become_ready(self, std::move(info), st.hello.connection);
      },
      [=](peer_auth& a) {
        auto& st = self->state;
        if (outbound || !st.pending || !st.pending_remote || st.done) return;
        if (self->current_sender() != caf::actor_cast<caf::strong_actor_ptr>(st.pending_remote))
          return;
        const auto expected =
            auth_proof(st.ctx->cluster_secret, "ferry-connect", st.nonce, st.peer_nonce,
                       identity(st.pending->node, st.pending->instance));
        if (!proofs_equal(a.proof, expected)) {
          const std::string e = "peer failed the cluster-secret challenge (different secrets?)";
          self->send(st.pending_remote, peer_refused{e});
          return finish(self, "handshake failed: " + e, false, errc::peer_incompatible);
        }
        auto info = std::move(st.pending);
        become_ready(self, std::move(info), st.pending_remote);
      },
      [=](peer_refused& r) {
        finish(self, "peer refused the handshake: " + r.reason, false, errc::peer_incompatible);
      },
      [=](peer_dialed& d) {
        auto& st = self->state;
        if (!outbound || st.done || st.remote) return;  // the scribe closes its socket
        if (!d.scribe && d.reset && st.dials < max_dials) {
          st.ctx->log_peer->info("peer={} dial {} of {}: {}; dialing again", st.address, st.dials,
                                 max_dials, d.error);
          self->delayed_send(self, first_redial_delay * (1 << (st.dials - 1)), redial_atom::value);
          return;
        }
        if (!d.scribe)
          return finish(self, fmt::format("cannot connect to {}: {}", st.address, d.error));
        // BASP as the client on a connected socket; the reply is the one the middleman's own
        // connect gives: the peer's node and the actor its gate published (its Scheduler).
        self->request(st.basp, std::chrono::milliseconds(st.ctx->config.timeouts.handshake_ms),
                      caf::connect_atom::value, std::move(d.scribe), st.port)
            .then(
                [=](caf::node_id&, caf::strong_actor_ptr& ptr, std::set<std::string>&) {
                  if (self->state.done) return;  // ended meanwhile: say nothing to the peer
                  if (!ptr) {
                    finish(self, fmt::format("no ferryd is published at {}", self->state.address));
                    return;
                  }
                  self->state.hello_sent = true;
                  self->send(caf::actor_cast<caf::actor>(ptr),
                             make_hello(self->state, caf::actor_cast<caf::actor>(self)));
                },
                [=](caf::error& err) {
                  finish(self, fmt::format("cannot connect to {}: {}", self->state.address,
                                           self->system().render(err)));
                });
      },
      [=](deadline_msg& d) {
        if (!self->state.info)
          finish(self, fmt::format("handshake did not complete within {} ms", d.ms));
      },
  };
}

caf::behavior outbound_behavior(connection_actor* self, context_ptr ctx, caf::actor basp,
                                std::string address, caf::actor scheduler, std::string known_down) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.basp = std::move(basp);
  st.address = address;
  st.scheduler = std::move(scheduler);
  const auto colon = address.rfind(':');
  const auto ms = st.ctx->config.timeouts.handshake_ms;
  self->delayed_send(self, std::chrono::milliseconds(ms), deadline_msg{"handshake", ms, {}});
  if (!known_down.empty()) {
    self->send(self, unusable_atom::value, std::move(known_down));
    return relay(self, true);
  }
  if (!st.ctx->cluster_secret.empty()) st.nonce = random_bytes(auth_nonce_bytes);
  int port = 0;
  if (colon != std::string::npos) port = std::atoi(address.c_str() + colon + 1);
  if (colon == std::string::npos || port <= 0 || port > 65535) {
    self->send(self,
               peer_refused{fmt::format("bad peer address '{}': expected host:port", address)});
    return relay(self, true);
  }
  st.host = address.substr(0, colon);
  st.port = static_cast<uint16_t>(port);
  // Our memory is described in our hello: register it first, then dial (regions_registered).
  if (auto e = request_registration(self); !e) self->send(self, peer_refused{e.message});
  return relay(self, true);
}

caf::behavior inbound_behavior(connection_actor* self, context_ptr ctx, peer_hello hello,
                               caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.scheduler = std::move(scheduler);
  st.address = identity(hello.node, hello.instance);
  const auto& secret = st.ctx->cluster_secret;
  const auto ms = st.ctx->config.timeouts.handshake_ms;
  self->delayed_send(self, std::chrono::milliseconds(ms), deadline_msg{"handshake", ms, {}});
  st.hello = std::move(hello);
  if (!secret.empty() && st.hello.nonce.size() != auth_nonce_bytes) {
    refuse_inbound(self,
                   "this daemon requires peers to prove the cluster secret, and the peer offered "
                   "no challenge (set security.cluster_secret_file on both sides)");
    return relay(self, false);
  }
  if (secret.empty() && !st.hello.nonce.empty()) {
    refuse_inbound(self,
                   "the peer requires a cluster secret but this daemon has none (set "
                   "security.cluster_secret_file on both sides)");
    return relay(self, false);
  }
  auto v = validate_peer(st.ctx->config, st.hello, false, st.address);
  if (!v) {
    refuse_inbound(self, v.message);
    return relay(self, false);
  }
  // Then add its fabric address (peer_inserted), register our memory for it
  // (regions_registered), and answer (answer_inbound).
  st.validated = std::move(v.value);
  request_insert(self, st.hello.fabric_address);
  return relay(self, false);
}

}  // namespace

caf::actor spawn_outbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                     caf::actor basp, std::string address, caf::actor scheduler,
                                     std::string known_down) {
  return parent->spawn<caf::monitored>(outbound_behavior, std::move(ctx), std::move(basp),
                                       std::move(address), std::move(scheduler),
                                       std::move(known_down));
}

caf::actor spawn_inbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                    peer_hello hello, caf::actor scheduler) {
  return parent->spawn<caf::monitored>(inbound_behavior, std::move(ctx), std::move(hello),
                                       std::move(scheduler));
}

}  // namespace ferry
