// Receiver: one per room on the decode side.
//
// Life: Bootstrapping (waiting for the named prefill peers' handshakes, then prepares sent to the
// ranks the geometry selects) -> WaitingForInput (every selected prefill rank accepted) ->
// Transferring (first write landed) -> Success (every selected rank announced, and the landed
// writes equal the sum of their totals; head-sliced KV unpacked from staging) | Failed (prefill
// refused or failed, a peer lost, more writes than announced, cancel, deadline). Each
// non-terminal status has its own deadline (timeouts.<status>_ms) besides the room's
// (timeouts.transfer_ms).
//
// Success is never inferred from a local event: only the counted remote-CQ-data immediates,
// which the fabric reports after each payload is placed, against the senders' announced totals.
//
// Failed means "the pages, slot, row and staging of this room may be reused". So once prepares
// went out, a failing room first drains: every selected prefill rank reports `peer_drained`
// (how many of its writes completed) and the room waits until that many have landed; a rank
// whose connection ended is fenced (its memory registrations are closed, so nothing of it can
// land any more). timeouts.drain_ms bounds the wait. Each link has its own token (immediate
// value, and epoch of the room incarnation), so landed writes are counted per rank.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "actors/actors.hpp"
#include "actors/room_lifecycle_glue.hpp"
#include "core/failpoint.hpp"
#include "core/plan.hpp"

namespace ferry {
namespace {

/// One prefill rank this room receives from.
struct source_link {
  peer_info_ptr peer;
  caf::actor connection;
  uint64_t token = 0;               // the immediate its writes carry
  std::optional<uint64_t> staging;  // this room's landing area for head-sliced KV
  bool accepted = false;
  bool refused = false;  // refused the prepare: it never writes
  bool fenced = false;   // its connection ended and its registrations are closed
  std::optional<uint64_t> announced;
  std::optional<uint64_t> drained;  // writes it completed, once its room failed
  uint64_t landed = 0;
};

struct receiver_state {
  static inline const char* name = "ferry.receiver";
  context_ptr ctx;
  caf::actor scheduler;
  std::vector<caf::actor> connections;  // one per named peer
  std::vector<peer_info_ptr> named;     // handshake results, by named position
  std::vector<std::string> unusable;    // why a named peer could not be used ("" = fine)
  std::vector<errc> unusable_code;      // and its code
  size_t looked_up = 0;                 // named peers resolved either way
  std::vector<source_link> links;       // the selected prefill ranks
  std::optional<uint64_t> staging;      // one block for every unpack link of the room
  std::vector<planned_copy> unpack;     // on commit: staging -> pages, done in quanta
  size_t unpacked = 0;
  uint64_t staging_need = 0;
  bool prepared = false;  // prepares sent
  proto::prepare prep;
  uint64_t token = 0;      // link to named peer i uses token + i
  room_life life;          // status, deadlines, drain (core/room_lifecycle.hpp)
  std::string drain_note;  // what the drain deadline found (and fenced), for the Failed reason
  commit_counter commit;
  uint64_t bytes = 0;

  std::string peers() const { return fmt::format("{}", fmt::join(prep.prefill_peers, ",")); }
  void release_staging() {
    for (auto& l : links) l.staging.reset();
    if (staging) ctx->staging->release(*staging);
    staging.reset();
  }
};

using receiver_actor = caf::stateful_actor<receiver_state>;

void apply(receiver_actor* self, const lifecycle_effects& e) {
  apply_effects(self, *self->state.ctx->timers, self->state.life, e,
                [self](room_status s, const std::string& reason, errc code) {
                  auto& st = self->state;
                  caf::anon_send(st.scheduler,
                                 room_update{st.prep.room, true, s, reason,
                                             s == room_status::success ? st.bytes : 0, code});
                });
}

void set_status(receiver_actor* self, room_status s) {
  apply(self, self->state.life.machine.advance(s));
}

bool draining(const receiver_state& st) { return st.life.machine.draining(); }
bool terminal(const receiver_state& st) { return st.life.machine.terminal(); }

void tell_links(receiver_actor* self, bool ok, const std::string& reason, errc code) {
  for (const auto& l : self->state.links)
    self->send(
        l.connection,
        peer_outbound{caf::make_message(peer_outcome{self->state.prep.room, l.token, false, ok,
                                                     reason, static_cast<uint16_t>(code)})});
}

/// Report Failed once no write of the room can land any more: every prefill rank refused,
/// is fenced, or drained and all of its completed writes landed. Nothing else reports it: when
/// the drain deadline passes first, the links still open are fenced (room_deadline below), and
/// their fences complete the drain.
void finish_drain(receiver_actor* self) {
  auto& st = self->state;
  if (!draining(st)) return;
  for (const auto& l : st.links)
    if (!l.refused && !l.fenced && (!l.drained || l.landed < *l.drained)) return;
  st.release_staging();
  apply(self, st.life.machine.drained(st.drain_note));
}

void fail(receiver_actor* self, errc code, const std::string& reason, bool tell_peers) {
  auto& st = self->state;
  lifecycle_effects effects;
  // Once prepares went out, prefill ranks may write: the drain is bounded by timeouts.drain_ms.
  if (!st.life.machine.fail(code, reason, st.prepared, effects)) return;
  st.ctx->log_room->warn("room={} peer={} failed: {}", st.prep.room, st.peers(), reason);
  if (!st.prepared) {
    // No prepare went out: no prefill rank can write into this room.
    for (auto& l : st.links) l.refused = true;
  } else if (tell_peers) {
    tell_links(self, false, reason, code);
  }
  apply(self, effects);
  finish_drain(self);
}

void succeed(receiver_actor* self) {
  auto& st = self->state;
  st.release_staging();
  st.ctx->log_room->debug("room={} peer={} committed: {} writes, {} bytes", st.prep.room,
                          st.peers(), st.commit.landed(), st.bytes);
  tell_links(self, true, {}, errc::ok);
  set_status(self, room_status::success);
}

/// Scatter head-sliced KV from the room's staging into its pages (links in unpack mode), one
/// quantum per message; Success once the last copy is done.
void unpack_step(receiver_actor* self) {
  auto& st = self->state;
  if (terminal(st) || draining(st)) return;
  uint64_t copied = 0;
  for (; st.unpacked < st.unpack.size() && copied < copy_quantum_bytes; ++st.unpacked) {
    const auto& c = st.unpack[st.unpacked];
    st.ctx->copy(c);
    copied += c.length;
  }
  if (st.unpacked < st.unpack.size())
    self->send(self, unpack_atom::value);
  else
    succeed(self);
}

void evaluate(receiver_actor* self, commit_counter::state c) {
  auto& st = self->state;
  switch (c) {
    case commit_counter::state::pending:
      return;
    case commit_counter::state::overflow:
      fail(self, errc::internal,
           fmt::format("{} writes landed but the prefill ranks announced {}", st.commit.landed(),
                       *st.commit.expected()),
           true);
      return;
    case commit_counter::state::complete:
      for (const auto& l : st.links)
        if (l.staging)
          plan_unpack(*l.peer->link, st.ctx->layout, st.prep.dst_pages, *l.staging, st.unpack);
      unpack_step(self);
      return;
  }
}

source_link* link_of(receiver_actor* self, const caf::actor& connection) {
  for (auto& l : self->state.links)
    if (l.connection == connection) return &l;
  return nullptr;
}

/// Reserve one staging block for every link whose KV lands sliced (kv_mode::unpack), then send
/// the prepares. When staging is full the room waits (Bootstrapping, under its deadline) and is
/// woken by the next release; a room too large for the whole area falls back to one write per
/// token.
void reserve_and_prepare(receiver_actor* self) {
  auto& st = self->state;
  if (st.prepared || terminal(st) || draining(st)) return;
  if (st.staging_need && !st.staging) {
    st.staging =
        st.ctx->staging->allocate_or_wait(st.staging_need, caf::actor_cast<caf::actor>(self));
    if (!st.staging) {
      st.ctx->log_room->debug("room={} waiting for {} bytes of staging", st.prep.room,
                              st.staging_need);
      return;
    }
    uint64_t at = *st.staging;
    for (auto& l : st.links)
      if (const auto need = l.peer->link->unpack_staging_bytes(st.prep.dst_pages.size())) {
        l.staging = at;
        at += need;
      }
  }
  st.prepared = true;
  for (const auto& l : st.links) {
    st.ctx->log_room->debug("room={} peer={} prepare: {} pages; {}", st.prep.room, l.peer->address,
                            st.prep.dst_pages.size(), l.peer->link->describe());
    self->send(l.connection,
               peer_outbound{caf::make_message(peer_prepare{
                   st.prep.room, l.token, st.prep.dst_pages, st.prep.state_slot, st.prep.aux_row,
                   l.staging.value_or(no_staging), st.prep.prefix_tokens})});
  }
}

/// Every named peer finished its handshake or failed: pick the ranks the geometry needs among
/// the usable ones. A peer that could not be used matters only if the geometry needs it.
void start(receiver_actor* self) {
  auto& st = self->state;
  std::vector<rank_schema> schemas;
  std::vector<size_t> usable;
  std::string first_unusable;
  errc first_code = errc::peer_unreachable;
  for (size_t i = 0; i < st.named.size(); ++i) {
    if (st.named[i]) {
      schemas.push_back(st.named[i]->schema);
      usable.push_back(i);
    } else if (first_unusable.empty()) {
      first_unusable = st.unusable[i];
      first_code = st.unusable_code[i];
    }
  }
  if (usable.empty()) return fail(self, first_code, first_unusable, false);
  auto chosen = select_prefill_peers(schema_of(st.ctx->config), schemas);
  if (!chosen)
    return fail(
        self, first_unusable.empty() ? chosen.code : first_code,
        first_unusable.empty() ? chosen.message : chosen.message + " (" + first_unusable + ")",
        false);
  uint64_t need = 0;
  for (size_t k : chosen.value) {
    const size_t i = usable[k];
    source_link l;
    l.peer = st.named[i];
    l.connection = st.connections[i];
    l.token = st.token + i;
    st.links.push_back(std::move(l));
    need += st.named[i]->link->unpack_staging_bytes(st.prep.dst_pages.size());
  }
  if (need && (!st.ctx->staging || need > st.ctx->staging->bytes))
    st.ctx->log_room->info(
        "room={} head-sliced KV needs {} bytes of staging but fabric.staging_bytes is {}; one "
        "write per token instead",
        st.prep.room, need, st.ctx->staging ? st.ctx->staging->bytes : 0);
  else
    st.staging_need = need;
  reserve_and_prepare(self);
}

/// Named peer `i` cannot be used (its handshake failed or its connection ended).
void resolve_unusable(receiver_actor* self, size_t i, errc code, std::string why) {
  auto& st = self->state;
  if (terminal(st) || !st.unusable[i].empty()) return;
  st.unusable[i] = std::move(why);
  st.unusable_code[i] = code;
  if (++st.looked_up == st.named.size()) start(self);
}

void on_peer(receiver_actor* self, peer_inbound& in) {
  auto& st = self->state;
  auto* l = link_of(self, in.connection);
  if (!l) return;  // not a rank this room prepared (cannot happen unless a peer misbehaves)
  in.msg.apply({
      [&](peer_prepare_ack& a) {
        if (a.token != l->token) return;  // not this incarnation's
        if (!a.ok) l->refused = true;
        if (draining(st)) return finish_drain(self);
        if (!a.ok)
          return fail(self, a.code ? static_cast<errc>(a.code) : errc::peer_incompatible,
                      fmt::format("prefill {} refused the prepare: {}", l->peer->address, a.reason),
                      true);
        l->accepted = true;
        for (const auto& x : st.links)
          if (!x.accepted) return;
        // Test hook: a Receiver dying while its prefill ranks may write (scheduler.cpp).
        if (core::failpoint("receiver_throw_on_accepted"))
          throw std::runtime_error("failpoint receiver_throw_on_accepted");
        set_status(self, room_status::waiting_for_input);
      },
      [&](peer_announce& a) {
        if (a.token != l->token || draining(st)) return;
        if (l->announced)
          return fail(self, errc::internal, "prefill " + l->peer->address + " announced twice",
                      true);
        l->announced = a.total_writes;
        st.bytes += a.total_bytes;
        set_status(self, room_status::transferring);
        uint64_t total = 0;
        for (const auto& x : st.links) {
          if (!x.announced) return;
          total += *x.announced;
        }
        evaluate(self, st.commit.announce(total));
      },
      [&](peer_outcome& o) {
        if (o.token != l->token) return;
        if (!o.ok)
          fail(self, o.code ? static_cast<errc>(o.code) : errc::internal,
               fmt::format("prefill {} reported: {}", l->peer->address, o.reason), true);
      },
      [&](peer_drained& d) {
        if (d.token != l->token || l->drained) return;
        l->drained = d.completed;
        // A prefill rank's room may fail (and drain) before this one hears of it.
        fail(self, errc::peer_lost, fmt::format("prefill {} failed the room", l->peer->address),
             true);
        finish_drain(self);
      },
  });
}

caf::behavior receiver_behavior(receiver_actor* self, context_ptr ctx, proto::prepare prep,
                                uint64_t token, std::vector<caf::actor> connections,
                                caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.prep = std::move(prep);
  st.token = token;
  st.connections = std::move(connections);
  st.scheduler = std::move(scheduler);
  st.named.resize(st.connections.size());
  st.unusable.resize(st.connections.size());
  st.unusable_code.resize(st.connections.size(), errc::ok);
  const auto& t = st.ctx->config.timeouts;
  st.life.machine = room_lifecycle(
      limits_of(t), {"waiting for the prefill peers, staging and their acceptance",
                     "waiting for the first write", "waiting for the remaining writes"});
  apply(self, st.life.machine.start());
  // Learn every named peer's geometry (its handshake may still be running).
  for (size_t i = 0; i < st.connections.size(); ++i)
    self->request(st.connections[i], std::chrono::milliseconds(t.handshake_ms + 1000),
                  info_atom::value)
        .then(
            [=](peer_lookup& r) {
              if (r.info) {
                auto& st = self->state;
                if (st.named[i] || !st.unusable[i].empty()) return;
                st.named[i] = std::move(r.info);
                if (++st.looked_up == st.named.size()) start(self);
                return;
              }
              resolve_unusable(self, i, r.code == errc::ok ? errc::peer_unreachable : r.code,
                               fmt::format("could not use peer {}: {}",
                                           self->state.prep.prefill_peers[i], r.error));
            },
            [=](caf::error& e) {
              // A Connection that already ended cannot answer; its peer_down, which the
              // Scheduler forwards to this room, carries the real reason.
              if (e.category() == caf::atom("system") &&
                  e.code() == static_cast<uint8_t>(caf::sec::request_receiver_down))
                return;
              resolve_unusable(
                  self, i, errc::peer_unreachable,
                  fmt::format("could not use peer {}: {}", self->state.prep.prefill_peers[i],
                              self->system().render(e)));
            });
  return {
      [=](peer_inbound& in) { on_peer(self, in); },
      [=](landed_msg& m) {
        auto& st = self->state;
        for (auto& l : st.links)
          if (l.token == m.token) l.landed += m.count;
        if (draining(st)) return finish_drain(self);
        set_status(self, room_status::transferring);
        evaluate(self, st.commit.add_landed(m.count));
      },
      [=](staging_atom) { reserve_and_prepare(self); },
      [=](unpack_atom) { unpack_step(self); },
      [=](cancel_atom, const std::string& why) { fail(self, errc::cancelled, why, true); },
      [=](peer_down& d) {
        auto& st = self->state;
        if (st.looked_up < st.named.size()) {
          // Before selection: this named peer is out; whether that matters is decided once
          // every named peer is resolved.
          for (size_t i = 0; i < st.connections.size(); ++i)
            if (st.connections[i] == d.connection) {
              if (st.named[i]) {
                st.named[i].reset();
                --st.looked_up;
              }
              resolve_unusable(self, i, d.code, describe(d));
            }
          return;
        }
        // After selection, a named peer the geometry left out does not matter.
        auto* l = link_of(self, d.connection);
        if (!l) return;
        l->fenced = d.fenced;
        fail(self, d.code, describe(d), true);
        finish_drain(self);
      },
      [=](room_deadline& d) {
        auto& st = self->state;
        auto x = st.life.machine.expired(d.kind, d.generation);
        if (!x) return;  // no longer applies
        if (x->what == expiry::kind::timed_out)
          return fail(
              self, errc::timed_out,
              fmt::format("timed out in {} after {} ms ({}: {} landed, {} announced{})",
                          to_string(x->in), x->ms, x->waits, st.commit.landed(),
                          st.commit.expected() ? std::to_string(*st.commit.expected()) : "none",
                          st.staging_need && !st.staging
                              ? fmt::format("; waiting for {} bytes of staging", st.staging_need)
                              : ""),
              true);
        // The drain deadline: a prefill rank that has not drained may still have writes of this
        // room in flight, so this room's pages cannot be handed back yet. Fence those ranks
        // (their connections end, closing their keys and cutting their fabric connections);
        // each fence arrives as peer_down and completes the drain.
        std::string waiting;
        for (const auto& l : st.links)
          if (!l.refused && !l.fenced && (!l.drained || l.landed < *l.drained)) {
            waiting += fmt::format(
                "{}{} ({})", waiting.empty() ? "" : ", ", l.peer->address,
                l.drained ? fmt::format("{} of {} drained writes landed", l.landed, *l.drained)
                          : "no drain report");
            self->send(l.connection, fence_atom::value,
                       fmt::format("fenced: room {} did not drain within {} ms "
                                   "(timeouts.drain_ms)",
                                   st.prep.room, x->ms));
          }
        if (waiting.empty()) return finish_drain(self);
        st.drain_note = fmt::format(
            "; drain incomplete after {} ms (timeouts.drain_ms), fenced: {}", x->ms, waiting);
      },
  };
}

}  // namespace

caf::actor spawn_receiver(caf::event_based_actor* parent, context_ptr ctx, proto::prepare prep,
                          uint64_t token, std::vector<caf::actor> connections,
                          caf::actor scheduler) {
  return parent->spawn<caf::monitored>(receiver_behavior, std::move(ctx), std::move(prep), token,
                                       std::move(connections), std::move(scheduler));
}

}  // namespace ferry
