// Receiver: one per room on the decode side. The room's rules are the pure state machine of
// core/receiver_room.hpp; this actor looks the named peers up, turns messages into the
// machine's events and carries out its effects (prepares, outcomes, fences, staging, the
// copies out of staging of KV that landed there).
//
// Life: Bootstrapping (waiting for the named prefill peers' handshakes, then, with peers older
// than version 10, staging reserved when KV lands in it, then prepares sent to the ranks the
// geometry selects) -> WaitingForInput (every selected prefill rank accepted; when a rank asks
// for its staging, the room's block is reserved, and a wait for it is the room's status note)
// -> Transferring (first write landed) -> Success (every
// selected rank announced, and the landed writes equal the sum of their totals; KV that landed in
// staging copied into the pages) | Failed (prefill refused or failed, a peer lost, more writes than
// announced, cancel, deadline). Each non-terminal status has its own deadline
// (timeouts.<status>_ms) besides the room's (timeouts.transfer_ms).
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

#include <chrono>
#include <optional>

#include "actors/actors.hpp"
#include "actors/room_lifecycle_glue.hpp"
#include "actors/room_trace.hpp"
#include "core/pack.hpp"
#include "core/plan.hpp"
#include "core/receiver_room.hpp"
#include "core/room_digest.hpp"
#include "os/failpoint.hpp"

namespace ferry {
namespace {

/// How long after its prepares a room has the progress thread watch closely for writes: the
/// prefill may send at once (then the first write is seen within 200 µs on shm, not after a
/// sleep of up to 4 ms); an engine that sends later pays the long sleep only after this.
constexpr std::chrono::milliseconds expect_writes_window{100};

struct receiver_state {
  static inline const char* name = "ferry.receiver";
  context_ptr ctx;
  caf::actor scheduler;
  std::vector<caf::actor> connections;  // one per named peer
  std::vector<peer_info_ptr> named;     // handshake results, by named position
  proto::prepare prep;
  receiver::room machine;  // the room's rules (core/receiver_room.hpp)
  deadline_tokens timers{};
  std::vector<strided_copy> unpack;    // on commit: staging -> pages, done in quanta
  size_t unpacked = 0;                 // copies of unpack done whole
  uint64_t unpacked_rows = 0;          // rows of unpack[unpacked] done
  std::unique_ptr<trace::file> trace;  // FERRY_TRACE_DIR (actors/room_trace.hpp)
  commit_clock commit;                 // where the commit phase starts (actors/metrics.hpp)
  bool noted = false;                  // the room's status note says it waits for staging
  /// The room is checked end to end: the daemon's integrity.checksums or its prepare's checksum.
  bool checks = false;
  /// A checked room: each named peer's digests of what it sent (peer_announce_checked)
  std::vector<std::optional<std::vector<uint64_t>>> digests;
  room_timeline timeline;  // its milestones (actors/room_timeline.hpp)

  std::string peers() const { return fmt::format("{}", fmt::join(prep.prefill_peers, ",")); }
};

using receiver_actor = caf::stateful_actor<receiver_state>;

void apply(receiver_actor* self, receiver::effects fx);

/// Feed the machine one event, traced with FERRY_TRACE_DIR (actors/room_trace.hpp).
inline receiver::effects feed(receiver_state& st, receiver::event e) {
  return trace::feed(st.trace.get(), st.machine, std::move(e));
}
using trace::json;

/// Tell the Scheduler why the room waits in its status (a poll's reason), or, with "", that it
/// no longer does.
void note(receiver_actor* self, std::string why) {
  auto& st = self->state;
  st.noted = !why.empty();
  caf::anon_send(st.scheduler, room_update{st.prep.room, true, st.machine.lifecycle().status(),
                                           std::move(why), 0, errc::ok});
}

void report(receiver_actor* self, room_status s, const std::string& reason, errc code) {
  auto& st = self->state;
  if (s == room_status::success) {
    if (auto seconds = st.commit.seconds_to(std::chrono::steady_clock::now()))
      st.ctx->metrics->phase(true, latency_phase::commit, *seconds);
    st.timeline.mark(decode_mark::success);
  }
  if (is_terminal(s)) st.ctx->timelines.add(true, st.prep.room, st.timeline);
  caf::anon_send(st.scheduler,
                 room_update{st.prep.room, true, s, reason,
                             s == room_status::success ? st.machine.bytes() : 0, code});
}

/// Copy the KV that landed in the room's staging into its pages (head-sliced rows to unpack,
/// whole pages or packed slices to scatter; core/pack.hpp), one quantum per message; the
/// machine hears `unpacked` once the last copy is done.
void unpack_step(receiver_actor* self) {
  auto& st = self->state;
  if (st.machine.lifecycle().terminal() || st.machine.lifecycle().draining()) return;
  uint64_t copied = 0;
  while (st.unpacked < st.unpack.size() && copied < copy_quantum_bytes) {
    const auto& c = st.unpack[st.unpacked];
    const uint64_t room = (copy_quantum_bytes - copied) / std::max<uint64_t>(c.length, 1);
    const uint64_t n = std::min(c.count - st.unpacked_rows, std::max<uint64_t>(room, 1));
    st.ctx->copy(c, st.unpacked_rows, n);
    copied += n * c.length;
    if ((st.unpacked_rows += n) == c.count) {
      ++st.unpacked;
      st.unpacked_rows = 0;
    }
  }
  st.ctx->staging->unpacked(copied);
  if (st.unpacked < st.unpack.size())
    self->send(self, unpack_atom::value);
  else
    apply(self, feed(st, receiver::ev::unpacked{}));
}

/// What landed against each rank's digests (integrity.checksums): the first difference, or "".
std::string check_digests(const receiver_state& st) {
  const auto& c = *st.ctx;
  const room_items mine{st.prep.dst_pages, st.prep.state_slot, st.prep.state_pages,
                        st.prep.aux_row};
  const std::array<const uint8_t*, 3> bases{c.base(space::kv), c.base(space::state),
                                            c.base(space::aux)};
  for (const auto& l : st.machine.links()) {
    const auto& peer = *st.named[l.named];
    const auto& sent = st.digests[l.named];
    if (!sent)
      return fmt::format("prefill {} announced its writes without the digests of what it sent",
                         peer.address);
    const auto got =
        digest_room(*peer.link, peer.layout, c.layout, mine, mine, bases, digest_side::destination);
    if (auto why = digest_difference(got, *sent, c.layout, peer.address); !why.empty()) return why;
  }
  return {};
}

/// Carry out the machine's effects, in order.
void apply(receiver_actor* self, receiver::effects fx) {
  auto& st = self->state;
  for (auto& e : fx) {
    std::visit(
        [&](auto& x) {
          using E = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<E, receiver::reserve_staging>) {
            auto at = x.wait ? staging_or_wait(self, st.ctx, x.bytes)
                             : st.ctx->staging->try_allocate(x.bytes);
            if (!at && !x.wait) {
              apply(self, feed(st, receiver::ev::staging_declined{}));
              return;
            }
            if (!at) {
              st.ctx->log_room->debug("room={} waiting for {} bytes of staging", st.prep.room,
                                      x.bytes);
              if (!st.noted)
                note(self, fmt::format("waiting for {} bytes of staging (fabric.staging_bytes "
                                       "{}, {} in use by other rooms)",
                                       x.bytes, st.ctx->staging->bytes, st.ctx->staging->in_use()));
              return;  // staging_atom once some is released
            }
            if (st.noted) note(self, {});
            apply(self, feed(st, receiver::ev::staging_reserved{*at}));
          } else if constexpr (std::is_same_v<E, receiver::no_staging>) {
            if (x.full) {
              st.ctx->log_room->debug(
                  "room={} staging is full: its KV goes one write per run, not through {} bytes "
                  "of staging",
                  st.prep.room, x.need);
              return;
            }
            if (st.ctx->digest.allow(logging::flood::staging_short, st.ctx->log_room,
                                     spdlog::level::info))
              st.ctx->log_room->info(
                  "room={} KV would land in {} bytes of staging but fabric.staging_bytes is {}; "
                  "head-sliced KV goes one write per token, whole pages one write per run",
                  st.prep.room, x.need, st.ctx->staging ? st.ctx->staging->bytes : 0);
          } else if constexpr (std::is_same_v<E, receiver::send_prepares>) {
            // The prefill ranks may write as soon as they accept: have the progress thread
            // watch for it closely (shm: no sleeping in long steps meanwhile).
            st.ctx->engine->expect_writes(expect_writes_window);
            for (const auto& l : st.machine.links()) {
              const auto& peer = st.named[l.named];
              if (st.ctx->log_room->should_log(spdlog::level::debug))  // describe() formats
                st.ctx->log_room->debug("room={} peer={} prepare: {} pages; {}", st.prep.room,
                                        peer->address, st.prep.dst_pages.size(),
                                        peer->link->describe());
              const uint64_t staging =
                  l.staging ? *l.staging : (l.on_request ? staging_on_request : no_staging);
              peer_prepare p{st.prep.room,    l.token, st.prep.dst_pages,    st.prep.state_slot,
                             st.prep.aux_row, staging, st.prep.prefix_tokens};
              const auto& state = st.ctx->config.pools.mamba;
              const bool paged_state = state && paged(state->type);
              if (st.checks)  // the prefill sends its digests
                to_peer(peer, st.connections[l.named],
                        peer_prepare_checked{std::move(p), paged_state ? st.prep.state_pages
                                                                       : std::vector<uint32_t>{}});
              else
                to_peer(peer, st.connections[l.named],
                        paged_state ? peer_wire::message(
                                          peer_prepare_paged{std::move(p), st.prep.state_pages})
                                    : peer_wire::message(std::move(p)));
            }
          } else if constexpr (std::is_same_v<E, receiver::grant>) {
            const auto& l = st.machine.links()[x.link];
            to_peer(st.named[l.named], st.connections[l.named],
                    peer_staging_grant{st.prep.room, l.token, l.staging.value_or(no_staging)});
          } else if constexpr (std::is_same_v<E, receiver::tell>) {
            if (x.ok)
              st.ctx->log_room->debug("room={} peer={} committed: {} writes, {} bytes",
                                      st.prep.room, st.peers(), st.machine.commit().landed(),
                                      st.machine.bytes());
            for (const auto& l : st.machine.links())
              to_peer(st.named[l.named], st.connections[l.named],
                      peer_outcome{st.prep.room, l.token, false, x.ok, x.reason,
                                   static_cast<uint16_t>(x.code)});
          } else if constexpr (std::is_same_v<E, receiver::failed>) {
            if (st.ctx->digest.allow(logging::flood::room_error, st.ctx->log_room,
                                     spdlog::level::warn))
              st.ctx->log_room->warn("room={} peer={} failed: {}", st.prep.room, st.peers(),
                                     x.reason);
          } else if constexpr (std::is_same_v<E, receiver::unpack>) {
            for (const auto& l : st.machine.links())
              if (l.staging)
                plan_unpack(*st.named[l.named]->link, st.ctx->layout, st.prep.dst_pages, *l.staging,
                            st.unpack);
            unpack_step(self);
          } else if constexpr (std::is_same_v<E, receiver::verify>) {
            const auto why = check_digests(st);
            const auto code = why.empty() ? errc::ok : errc::checksum_mismatch;
            if (code == errc::ok) st.ctx->metrics->room_verified();
            apply(self, feed(st, receiver::ev::verified{code, why}));
          } else if constexpr (std::is_same_v<E, receiver::release_staging>) {
            st.ctx->staging->release(x.at);
          } else if constexpr (std::is_same_v<E, receiver::fence>) {
            self->send(st.connections[st.machine.links()[x.link].named], fence_atom::value,
                       x.reason);
          } else if constexpr (std::is_same_v<E, receiver::life>) {
            apply_effects(self, *st.ctx->timers, st.timers, x.effects,
                          [self](room_status s, const std::string& reason, errc code) {
                            report(self, s, reason, code);
                          });
          }
        },
        e);
  }
}

/// The named positions of connection `c` (a peer may be named more than once).
template <class F>
void for_named(receiver_actor* self, const caf::actor& c, F&& f) {
  const auto& conns = self->state.connections;
  for (size_t i = 0; i < conns.size(); ++i)
    if (conns[i] == c) f(i);
}

/// Named peer `i` announced its writes.
void on_announce(receiver_actor* self, size_t i, const peer_announce& a) {
  auto& st = self->state;
  st.commit.announced(std::chrono::steady_clock::now());
  st.timeline.mark(decode_mark::announced);
  apply(self, feed(st, receiver::ev::announce{i, a.token, a.total_writes, a.total_bytes}));
}

void on_peer(receiver_actor* self, peer_inbound& in) {
  auto& st = self->state;
  for_named(self, in.connection, [&](size_t i) {
    if (!st.machine.link_of(i)) return;  // not a rank this room prepared
    in.msg.apply({
        [&](peer_prepare_ack& a) {
          const bool before = st.machine.all_accepted();
          auto fx = feed(
              st, receiver::ev::prepare_ack{i, a.token, a.ok, static_cast<errc>(a.code), a.reason});
          // Test hook: a Receiver dying while its prefill ranks may write (scheduler.cpp).
          if (!before && st.machine.all_accepted()) st.timeline.mark(decode_mark::acknowledged);
          if (!before && st.machine.all_accepted() && os::failpoint("receiver_throw_on_accepted"))
            throw std::runtime_error("failpoint receiver_throw_on_accepted");
          apply(self, std::move(fx));
        },
        [&](peer_announce& a) { on_announce(self, i, a); },
        [&](peer_announce_checked& a) {
          // Kept for the verify at commit (a room that does not check asked for none).
          if (st.checks && a.announce.token == st.machine.link_of(i)->token)
            st.digests[i] = std::move(a.digests);
          on_announce(self, i, a.announce);
        },
        [&](peer_outcome& o) {
          apply(self, feed(st, receiver::ev::outcome{i, o.token, o.ok, static_cast<errc>(o.code),
                                                     o.reason}));
        },
        [&](peer_staging_request& q) {
          apply(self, feed(st, receiver::ev::staging_requested{i, q.token}));
        },
        [&](peer_drained& d) {
          apply(self, feed(st, receiver::ev::drained{i, d.token, d.completed, d.failed}));
        },
    });
  });
}

/// Named peer `i` cannot be used (`why`, after "could not use peer ADDRESS: ").
void unusable(receiver_actor* self, size_t i, errc code, const std::string& problem) {
  auto& st = self->state;
  const auto why = fmt::format("could not use peer {}: {}", st.prep.prefill_peers[i], problem);
  apply(self, feed(st, receiver::ev::unusable{i, code, why}));
}

/// Named peer `i` looked up: its geometry and where its KV lands, or why it cannot be used.
void on_lookup(receiver_actor* self, size_t i, peer_lookup& r) {
  auto& st = self->state;
  if (r.info) {
    const auto& c = *st.ctx;
    const auto land =
        plan_landing(*r.info->link, st.prep.dst_pages, c.config.fabric.pack_threshold(),
                     c.staging ? c.staging->bytes : 0);
    if (land.scatter)
      c.log_room->debug("room={} peer={} {}", st.prep.room, r.info->address, land.describe());
    const auto need = land.bytes;
    const auto schema = r.info->schema;
    const bool asks = r.info->version >= peer_late_staging_version;
    if (st.checks && r.info->version < peer_checksums_version) {
      return unusable(self, i, errc::peer_incompatible,
                      fmt::format("a checked room needs peer protocol {}; it speaks {}",
                                  peer_checksums_version, r.info->version));
    }
    if (!st.named[i]) st.named[i] = std::move(r.info);
    apply(self, feed(st, receiver::ev::resolved{i, schema, need, land.scatter, asks}));
    return;
  }
  unusable(self, i, r.code == errc::ok ? errc::peer_unreachable : r.code, r.error);
}

caf::behavior receiver_behavior(receiver_actor* self, context_ptr ctx, proto::prepare prep,
                                uint64_t token, std::vector<caf::actor> connections,
                                std::vector<peer_info_ptr> known, caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.prep = std::move(prep);
  st.connections = std::move(connections);
  st.scheduler = std::move(scheduler);
  st.named.resize(st.connections.size());
  st.digests.resize(st.connections.size());
  const auto& t = st.ctx->config.timeouts;
  st.checks = st.ctx->config.integrity.checksums || st.prep.checksum;
  st.machine =
      receiver::room(st.prep.room, limits_of(t), schema_of(st.ctx->config), st.prep.prefill_peers,
                     token, static_cast<uint32_t>(st.prep.dst_pages.size()),
                     st.ctx->staging ? st.ctx->staging->bytes : 0, st.checks);
  st.trace = trace::file::open("receiver");
  if (st.trace)
    st.trace->write({{"e", "new"},
                     {"id", st.prep.room},
                     {"limits", trace::limits_json(limits_of(t))},
                     {"mine", trace::schema_json(schema_of(st.ctx->config))},
                     {"named", st.prep.prefill_peers},
                     {"first_token", token},
                     {"pages", st.prep.dst_pages.size()},
                     {"staging_capacity", st.ctx->staging ? st.ctx->staging->bytes : 0},
                     {"checks", st.checks}});
  // Before any prepare leaves: what its prefill ranks answer comes straight here.
  st.ctx->routes.add_decode(token, static_cast<uint32_t>(st.connections.size()),
                            caf::actor_cast<caf::actor>(self));
  apply(self, feed(st, receiver::ev::start{}));
  // Learn every named peer's geometry: from the Scheduler where it knew the peer ready (no
  // round trip), else from its Connection (its handshake may still be running).
  for (size_t i = 0; i < st.connections.size(); ++i) {
    if (i < known.size() && known[i]) {
      peer_lookup r{std::move(known[i]), {}, errc::ok};
      on_lookup(self, i, r);
      continue;
    }
    // No timeout of its own: the room's Bootstrapping deadline bounds the wait, and a CAF
    // request timeout costs two wake-ups of CAF's clock thread per room (set and cancel).
    // A Connection that dies answers with an error.
    self->request(st.connections[i], caf::infinite, info_atom::value)
        .then([=](peer_lookup& r) { on_lookup(self, i, r); },
              [=](caf::error& e) {
                // A Connection that already ended cannot answer; its peer_down, which the
                // Scheduler forwards to this room, carries the real reason.
                if (e == caf::sec::request_receiver_down) return;
                unusable(self, i, errc::peer_unreachable, self->system().render(e));
              });
  }
  return {
      [=](peer_inbound& in) { on_peer(self, in); },
      [=](landed_msg& m) {
        auto& st = self->state;
        st.commit.write_done(std::chrono::steady_clock::now());  // the last one starts the commit
        st.timeline.mark(decode_mark::landed);
        apply(self, feed(st, receiver::ev::landed{m.token, m.count}));
      },
      [=](staging_atom) {
        auto& st = self->state;
        apply(self, feed(st, receiver::ev::staging_freed{}));
      },
      [=](unpack_atom) { unpack_step(self); },
      [=](cancel_atom, const std::string& why) {
        auto& st = self->state;
        apply(self, feed(st, receiver::ev::cancel{why}));
      },
      [=](peer_down& d) {
        for_named(self, d.connection, [&](size_t i) {
          auto& st = self->state;
          const auto why = describe(d);
          apply(self, feed(st, receiver::ev::peer_down{i, d.fenced, d.code, why}));
        });
      },
      [=](room_deadline& d) {
        auto& st = self->state;
        apply(self, feed(st, receiver::ev::expired{d.kind, d.generation}));
      },
  };
}

}  // namespace

caf::actor spawn_receiver(caf::event_based_actor* parent, context_ptr ctx, proto::prepare prep,
                          uint64_t token, std::vector<caf::actor> connections,
                          std::vector<peer_info_ptr> known, caf::actor scheduler) {
  return parent->spawn<caf::monitored>(receiver_behavior, std::move(ctx), std::move(prep), token,
                                       std::move(connections), std::move(known),
                                       std::move(scheduler));
}

}  // namespace ferry
