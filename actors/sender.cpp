// Sender: one per room on the prefill side. The room's rules are the pure state machine of
// core/sender_room.hpp; this actor turns messages into its events and carries out its effects.
// Its data plane (planning each chunk for each decode rank, packing through staging, posting
// write batches) is actors/sender_post.cpp.
//
// Life: Bootstrapping (client chunks arrived before the decode prepares; queued) ->
// WaitingForInput (every decode rank this prefill rank feeds has prepared: max(1, Pd/Ps) of
// them) -> Transferring (first writes posted) -> Success (every decode rank counted every write)
// | Failed (bad chunk, write error, peer failure or loss, cancel, deadline). Each non-terminal
// status has its own deadline (timeouts.<status>_ms) besides the room's (timeouts.transfer_ms).
//
// Failure drains: the room stops planning, tells its decode ranks at once, and reports Failed
// only when every write batch it posted has completed locally (or timeouts.drain_ms passed), so
// the client never reuses source pages that a write still reads. Each decode rank then gets
// `peer_drained` with the number of writes that completed, which it waits to see land before it
// lets its own pages go.
//
// Each chunk is planned for each decode rank with the link plan cached at handshake: its page
// list by position, coalesced into runs, head-sliced KV packed into staging when the decode holds
// a slice of our heads, and small runs gathered through staging when that is cheaper than one
// write each (core/pack.hpp). A chunk may come as layer ranges (core/layer_ranges.hpp), each
// planned for its layers alone. The last chunk adds the one state slot pair (each range its
// layers' segments), the send that completes it the aux row, and then each rank's announcement
// of its total write count follows, with the digests of what it sent to a rank that checks
// (integrity.checksums, core/room_digest.hpp).

#include <fmt/format.h>

#include <chrono>
#include <deque>
#include <optional>

#include "actors/sender_state.hpp"
#include "core/pack.hpp"
#include "core/plan.hpp"
#include "core/room_digest.hpp"
#include "core/sender_room.hpp"
#include "os/failpoint.hpp"

namespace ferry {
namespace sending {
namespace {

bool wants_digests(const sender_state& st) {
  for (const auto& l : st.links)
    if (l.digests) return true;
  return false;
}

/// Keep what chunk `x` sends, by position, for the digests.
void remember_items(sender_state& st, const sender::post_chunk& x) {
  const auto& c = x.chunk;
  const size_t end = size_t{x.first} + c.src_pages.size();
  if (st.src_pages.size() < end) st.src_pages.resize(end, no_index);
  std::copy(c.src_pages.begin(), c.src_pages.end(), st.src_pages.begin() + x.first);
  if (c.state_slot != no_index) st.src_slot = c.state_slot;
  if (!c.state_pages.empty()) st.src_state_pages = c.state_pages;
  if (c.aux_row != no_index) st.src_row = c.aux_row;
}

/// Each rank's announcement of its total; a rank that asked for them gets the digests of what
/// this rank sent it with it (core/room_digest.hpp).
void announce(sender_state& st) {
  const auto& c = *st.ctx;
  const std::array<const uint8_t*, 3> bases{c.base(space::kv), c.base(space::state),
                                            c.base(space::aux)};
  const room_items src{st.src_pages, st.src_slot, st.src_state_pages, st.src_row};
  for (size_t i = 0; i < st.links.size(); ++i) {
    const auto& l = st.links[i];
    const auto& r = st.machine.links()[i];
    peer_announce a{st.room, r.token, r.writes, r.bytes};
    if (!l.digests) {
      to_peer(l.peer, l.connection, a);
      continue;
    }
    const room_items dst{l.prep.dst_pages, l.prep.dst_state_slot, l.dst_state_pages,
                         l.prep.dst_aux_row};
    peer_announce_checked checked{a, {}};
    for (const auto& x :
         digest_room(*l.peer->link, c.layout, l.peer->layout, src, dst, bases, digest_side::source))
      checked.digests.push_back(x.value);
    to_peer(l.peer, l.connection, std::move(checked));
  }
}

void report(sender_actor* self, room_status s, const std::string& reason, errc code) {
  auto& st = self->state;
  if (s == room_status::success) {
    if (auto seconds = st.commit.seconds_to(std::chrono::steady_clock::now()))
      st.ctx->metrics->phase(false, latency_phase::commit, *seconds);
    st.timeline.mark(prefill_mark::success);
  }
  if (is_terminal(s)) st.ctx->timelines.add(false, st.room, st.timeline);
  caf::anon_send(st.scheduler, room_update{st.room, false, s, reason,
                                           s == room_status::success ? st.machine.bytes() : 0, code,
                                           st.machine.prefix_tokens(), st.prepares});
}

void send_to_links(sender_actor* self, auto&& make) {
  auto& st = self->state;
  for (size_t i = 0; i < st.links.size(); ++i)
    to_peer(st.links[i].peer, st.links[i].connection, make(st.machine.links()[i]));
}

}  // namespace

/// Carry out the machine's effects, in order.
void apply(sender_actor* self, sender::effects fx, const answering& to) {
  auto& st = self->state;
  for (auto& e : fx) {
    std::visit(
        [&](auto& x) {
          using E = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<E, sender::reply>) {
            if (!to.request) return;
            if (x.outcome) {
              st.ctx->gateway->reply(to.request->conn, to.request->seq, proto::ok{});
              return;
            }
            if (st.ctx->digest.allow(logging::flood::room_error, st.ctx->log_room,
                                     spdlog::level::warn))
              st.ctx->log_room->warn("room={} peer={} send rejected: {}", st.room,
                                     st.machine.peer_name(), x.outcome.message);
            st.ctx->gateway->reply(to.request->conn, to.request->seq,
                                   proto::error{x.outcome.code, x.outcome.message});
          } else if constexpr (std::is_same_v<E, sender::ack>) {
            to_peer(to.prepare_peer, to.prepare_from,
                    peer_prepare_ack{st.room, x.token, static_cast<bool>(x.outcome),
                                     x.outcome.message, static_cast<uint16_t>(x.outcome.code)});
          } else if constexpr (std::is_same_v<E, sender::post_chunk>) {
            if (x.chunk.last) st.timeline.mark(prefill_mark::sent);
            if (wants_digests(st)) remember_items(st, x);
            for (size_t i = 0; i < st.links.size(); ++i) {
              auto& l = st.links[i];
              if (l.prep.dst_staging != staging_on_request) {
                post_link(self, i, x);
                continue;
              }
              // Its KV lands in the decode's staging, which the decode reserves now.
              if (!l.asked)
                to_peer(l.peer, l.connection, peer_staging_request{st.room, l.prep.token});
              l.asked = true;
              l.held.push_back(x);
            }
            st.ctx->log_room->debug("room={} peer={} chunk pages={} last={} layers={}+{} ends={}",
                                    st.room, st.machine.peer_name(), x.chunk.src_pages.size(),
                                    x.chunk.last, x.chunk.first_layer, x.chunk.layer_count,
                                    x.ends_room);
            pump(self);
            const bool pending = pack_pending(st);
            apply(self, feed(st, sender::ev::chunk_posted{pending}));
          } else if constexpr (std::is_same_v<E, sender::pump>) {
            pumped(self);
          } else if constexpr (std::is_same_v<E, sender::announce>) {
            st.commit.announced(std::chrono::steady_clock::now());
            st.timeline.mark(prefill_mark::announced);
            announce(st);
          } else if constexpr (std::is_same_v<E, sender::tell_failed>) {
            if (st.ctx->digest.allow(logging::flood::room_error, st.ctx->log_room,
                                     spdlog::level::warn))
              st.ctx->log_room->warn("room={} peer={} failed: {}", st.room, st.machine.peer_name(),
                                     x.reason);
            for (auto& l : st.links) {
              l.jobs.clear();
              l.held.clear();
            }
            // Nothing more of the room is worth sending: the drain waits only for the writes
            // already posted, and each decode rank for exactly those (peer_drained).
            if (x.in_flight) st.ctx->engine->cancel_writes(st.cancel);
            send_to_links(self, [&](const sender::link_record& r) {
              return peer_outcome{st.room, r.token,  true,
                                  false,   x.reason, static_cast<uint16_t>(x.code)};
            });
            if (x.in_flight)
              st.ctx->log_room->debug("room={} draining {} write batches (up to {} ms)", st.room,
                                      x.in_flight, st.ctx->config.timeouts.drain_ms);
          } else if constexpr (std::is_same_v<E, sender::tell_drained>) {
            send_to_links(self, [&](const sender::link_record& r) {
              return peer_drained{st.room, r.token, r.completed, r.failed};
            });
          } else if constexpr (std::is_same_v<E, sender::life>) {
            apply_effects(self, *st.ctx->timers, st.timers, x.effects,
                          [self](room_status s, const std::string& reason, errc code) {
                            report(self, s, reason, code);
                          });
          }
        },
        e);
  }
}

namespace {

void on_prepare(sender_actor* self, peer_inbound& in, peer_prepare& p,
                std::vector<uint32_t> state_pages = {}, bool digests = false) {
  auto& st = self->state;
  ++st.prepares;  // answered below, whatever the machine makes of it
  const auto& schema = in.from->schema;
  sender::ev::prepare m;
  m.link = in.connection.id();
  m.address = in.from->address;
  m.in_group = in.from->link->in_group;
  m.tp_size = schema.tp_size;
  m.tp_rank = schema.tp_rank;
  m.pp_rank = schema.pp_rank;
  m.expected_links = decode_ranks_per_prefill(st.ctx->config.tp.size, schema.tp_size);
  m.pages = static_cast<uint32_t>(p.dst_pages.size());
  m.state_pages = static_cast<uint32_t>(state_pages.size());
  m.prefix_tokens = p.prefix_tokens;
  m.token = p.token;
  m.indices = check_prepare_indices(st.ctx->config.pools, st.ctx->layout, *in.from, p, state_pages);
  const size_t before = st.machine.links().size();
  auto fx = feed(st, std::move(m));
  if (st.machine.links().size() > before) {
    if (st.ctx->log_room->should_log(spdlog::level::debug))  // describe() formats
      st.ctx->log_room->debug(
          "room={} peer={} prepared: {} dst pages, state slot {}, aux row {}; {}", st.room,
          in.from->address, p.dst_pages.size(), p.dst_state_slot, p.dst_aux_row,
          in.from->link->describe());
    st.links.push_back(decode_link{
        in.from, in.connection, std::move(p), std::move(state_pages), {}, {}, false, digests});
    st.timeline.mark_once(prefill_mark::prepared);
    // That link's outcome, which follows its prepare, may now come straight here.
    st.ctx->routes.add_prefill(st.room, caf::actor_cast<caf::actor>(self), in.connection.id());
  }
  apply(self, std::move(fx), answering{nullptr, in.connection, in.from});
}

/// A decode rank's outcome of the room (or a bad grant of its, taken as its failure).
void on_outcome(sender_actor* self, const peer_inbound& in, bool in_group, uint64_t token, bool ok,
                errc code, const std::string& reason) {
  auto& st = self->state;
  const uint64_t link = in.connection.id();
  apply(self,
        feed(st, sender::ev::outcome{link, in.from->address, in_group, token, ok, code, reason}));
}

/// The decode granted link `in`'s staging: post the sends held for it, into that block (or
/// directly, when it granted none). An offset outside its staging region fails the room.
void on_grant(sender_actor* self, peer_inbound& in, const peer_staging_grant& g) {
  auto& st = self->state;
  if (st.machine.lifecycle().terminal() || st.machine.lifecycle().draining()) return;
  for (size_t i = 0; i < st.links.size(); ++i) {
    auto& l = st.links[i];
    if (l.connection != in.connection || l.prep.token != g.token ||
        l.prep.dst_staging != staging_on_request || !l.asked)
      continue;
    if (auto ok = check_staging_offset(*in.from, st.room, g.offset, l.prep.dst_pages.size()); !ok)
      return on_outcome(self, in, true, g.token, false, ok.code, ok.message);
    l.prep.dst_staging = g.offset;
    auto held = std::move(l.held);
    l.held.clear();
    for (const auto& x : held) post_link(self, i, x);
    pumped(self);  // packs what waits for staging; the announcement follows when nothing does
    return;
  }
}

void cancel(sender_actor* self, const std::string& why) {
  auto& st = self->state;
  apply(self, feed(st, sender::ev::cancel{why}));
}

void on_peer(sender_actor* self, peer_inbound& in) {
  auto& st = self->state;
  in.msg.apply({
      [&](peer_staging_grant& g) { on_grant(self, in, g); },
      [&](peer_prepare& p) {
        // Test failpoint: the room ends before it takes this prepare, as when the prepare still
        // waits in the actor's mailbox as it ends. The Scheduler must answer it. Only where
        // nothing is in flight, so the room ends (and the actor with it) at once.
        if (st.machine.in_flight() == 0 && os::failpoint("sender_ends_before_prepare"))
          return cancel(self, "ended by the failpoint sender_ends_before_prepare");
        on_prepare(self, in, p);
      },
      [&](peer_prepare_paged& p) { on_prepare(self, in, p.prepare, std::move(p.dst_state_pages)); },
      [&](peer_prepare_checked& p) {
        on_prepare(self, in, p.prepare, std::move(p.dst_state_pages), true);
      },
      [&](peer_outcome& o) {
        on_outcome(self, in, in.from->link->in_group, o.token, o.ok, static_cast<errc>(o.code),
                   o.reason);
        for (const auto& r : st.machine.links())
          if (r.link == in.connection.id() && r.committed && o.ok)
            st.ctx->log_room->debug("room={} peer={} committed: {} writes, {} bytes", st.room,
                                    r.address, r.writes, r.bytes);
      },
  });
}

caf::behavior sender_behavior(sender_actor* self, context_ptr ctx, uint64_t room,
                              caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.scheduler = std::move(scheduler);
  st.room = room;
  const auto& cfg = st.ctx->config;
  auto layers = layer_ids(st.ctx->layout);
  st.trace = trace::file::open("sender");
  if (st.trace)
    st.trace->write({{"e", "new"},
                     {"id", room},
                     {"limits", trace::limits_json(limits_of(cfg.timeouts))},
                     {"tp_rank", cfg.tp.rank},
                     {"tp_size", cfg.tp.size},
                     {"pp_rank", cfg.pp.rank},
                     {"layers", layers}});
  st.machine = sender::room(room, limits_of(cfg.timeouts), cfg.tp.rank, cfg.tp.size, cfg.pp.rank,
                            std::move(layers));
  apply(self, feed(st, sender::ev::start{}));
  return {
      [=](client_request& req) {
        auto& st = self->state;
        auto& c = std::get<proto::send>(req.msg);
        auto fx = feed(st, sender::ev::chunk{std::move(c)});
        apply(self, std::move(fx), answering{&req, {}, {}});
      },
      [=](peer_inbound& in) { on_peer(self, in); },
      [=](batch_done_msg& d) {
        auto& st = self->state;
        st.commit.write_done(std::chrono::steady_clock::now());  // the last one starts the commit
        st.timeline.mark(prefill_mark::written);
        result<> r;
        if (!d.result.ok()) r = error{d.result.code, d.result.message};
        apply(self,
              feed(st, sender::ev::batch_done{d.batch, d.result.completed, d.result.failed, r}));
      },
      [=](staging_atom) { pumped(self); },
      [=](pump_atom) {
        self->state.pump_scheduled = false;
        pumped(self);
      },
      [=](cancel_atom, const std::string& why) { cancel(self, why); },
      [=](peer_down& d) {
        auto& st = self->state;
        const auto why = describe(d);
        apply(self, feed(st, sender::ev::peer_down{d.code, why}));
      },
      [=](room_deadline& d) {
        auto& st = self->state;
        apply(self, feed(st, sender::ev::expired{d.kind, d.generation}));
      },
  };
}

}  // namespace
}  // namespace sending

caf::actor spawn_sender(caf::event_based_actor* parent, context_ptr ctx, uint64_t room,
                        caf::actor scheduler) {
  return parent->spawn<caf::monitored>(sending::sender_behavior, std::move(ctx), room,
                                       std::move(scheduler));
}

}  // namespace ferry
