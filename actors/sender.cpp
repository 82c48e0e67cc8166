// Sender: one per room on the prefill side.
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
// a slice of our heads. The last chunk adds the one state slot pair and the aux row, and is
// followed by each rank's announcement of its total write count.

#include <fmt/format.h>

#include <deque>
#include <unordered_map>
#include <unordered_set>

#include "actors/actors.hpp"
#include "actors/client_gateway.hpp"
#include "actors/room_lifecycle_glue.hpp"
#include "core/plan.hpp"

namespace ferry {
namespace {

constexpr size_t max_queued_chunks = 4096;

/// One decode rank this room goes to.
struct decode_link {
  peer_info_ptr peer;
  caf::actor connection;
  peer_prepare prep;
  chunk_cursor cursor;
  std::deque<pack_job> jobs;  // head-sliced KV waiting for staging (kv_mode::pack)
  uint64_t writes = 0;
  uint64_t bytes = 0;
  uint64_t completed = 0;  // writes completed locally (they land at the decode)
  uint64_t failed = 0;     // writes that failed or were never posted
  bool committed = false;
};

struct sender_state {
  static inline const char* name = "ferry.sender";
  context_ptr ctx;
  caf::actor scheduler;
  uint64_t room = 0;
  room_life life;  // status, deadlines, drain (core/room_lifecycle.hpp)
  std::vector<decode_link> links;
  uint32_t expected_links = 0;        // known from the first prepare's geometry
  std::deque<client_request> queued;  // chunks that arrived before every prepare
  uint32_t prefix_tokens = 0;         // the decode's prefix (every decode rank's prepare agrees)
  uint64_t next_batch = 1;
  std::unordered_map<uint64_t, size_t> batch_link;  // batch in flight -> index in links
  bool last_posted = false;                         // the last chunk was planned
  bool pump_scheduled = false;                      // a pump_atom to self is on its way
  bool announced = false;
  std::vector<planned_write> writes;
  std::vector<planned_copy> copies;
  std::unordered_set<uint32_t> sent_pages;  // source pages of the chunks accepted so far

  bool ready() const { return expected_links && links.size() == expected_links; }
  std::string peer_name() const {
    std::string s;
    for (const auto& l : links) s += (s.empty() ? "" : ",") + l.peer->address;
    return s.empty() ? "?" : s;
  }
};

using sender_actor = caf::stateful_actor<sender_state>;

void report(sender_actor* self, room_status s, const std::string& reason, errc code) {
  auto& st = self->state;
  uint64_t bytes = 0;
  for (const auto& l : st.links) bytes += l.bytes;
  caf::anon_send(st.scheduler,
                 room_update{st.room, false, s, reason, s == room_status::success ? bytes : 0, code,
                             st.ready() ? st.prefix_tokens : 0});
}

void apply(sender_actor* self, const lifecycle_effects& e) {
  apply_effects(self, *self->state.ctx->timers, self->state.life, e,
                [self](room_status s, const std::string& reason, errc code) {
                  report(self, s, reason, code);
                });
}

void set_status(sender_actor* self, room_status s) {
  apply(self, self->state.life.machine.advance(s));
}

bool draining(const sender_state& st) { return st.life.machine.draining(); }
bool terminal(const sender_state& st) { return st.life.machine.terminal(); }

/// Report Failed once nothing is in flight any more (or with `note` when the drain deadline
/// passed first); tell each decode rank how many of its writes completed.
void finish_drain(sender_actor* self, const std::string& note = {}) {
  auto& st = self->state;
  if (!draining(st)) return;
  if (!st.batch_link.empty() && note.empty()) return;
  if (note.empty())
    for (const auto& l : st.links)
      self->send(l.connection, peer_outbound{caf::make_message(
                                   peer_drained{st.room, l.prep.token, l.completed, l.failed})});
  apply(self, st.life.machine.drained(note));
}

void fail(sender_actor* self, errc code, const std::string& reason) {
  auto& st = self->state;
  lifecycle_effects effects;
  // With batches in flight the drain is bounded by timeouts.drain_ms.
  if (!st.life.machine.fail(code, reason, !st.batch_link.empty(), effects)) return;
  st.ctx->log_room->warn("room={} peer={} failed: {}", st.room, st.peer_name(), reason);
  for (auto& l : st.links) {
    l.jobs.clear();
    self->send(l.connection,
               peer_outbound{caf::make_message(peer_outcome{st.room, l.prep.token, true, false,
                                                            reason, static_cast<uint16_t>(code)})});
  }
  // Queued chunks were answered `ok` when they arrived; the room's failure reaches the client
  // as an event and a poll answer, never as a second reply to those requests.
  st.queued.clear();
  if (!st.batch_link.empty())
    st.ctx->log_room->debug("room={} draining {} write batches (up to {} ms)", st.room,
                            st.batch_link.size(), st.ctx->config.timeouts.drain_ms);
  apply(self, effects);
  finish_drain(self);
}

/// Copy planned local copies, then post `w` (split into pieces) to link `l` as one batch whose
/// completion releases `staging` (if any).
void submit(sender_actor* self, decode_link& l, std::optional<uint64_t> staging) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  auto& w = st.writes;
  for (const auto& c : st.copies) ctx.copy(c);
  split_pieces(w, ctx.config.fabric.write_piece_bytes);
  if (w.empty()) {
    if (staging) ctx.staging->release(*staging);
    return;
  }
  transport::write_batch batch;
  batch.peer = l.peer->fabric_peer;
  const size_t link_index = static_cast<size_t>(&l - st.links.data());
  batch.ops.reserve(w.size());
  for (const auto& p : w) {
    const auto& region = l.peer->region(p.dst);
    batch.ops.push_back({ctx.region(p.src), p.src_offset, p.length,
                         region.remote_base + p.dst_offset, region.key, l.prep.token});
    l.bytes += p.length;
  }
  l.writes += w.size();
  const uint64_t id = st.next_batch++;
  st.batch_link[id] = link_index;
  caf::actor me = caf::actor_cast<caf::actor>(self);
  // Packed staging is released by the completion itself: once every write of the batch has
  // completed locally nothing reads it any more, whether or not this room still exists.
  staging_area* area = staging ? ctx.staging.get() : nullptr;
  batch.done = [me, id, area, at = staging.value_or(0)](transport::batch_result r) {
    if (area) area->release(at);
    caf::anon_send(me, batch_done_msg{id, std::move(r)});
  };
  ctx.engine->submit(std::move(batch));
  set_status(self, room_status::transferring);
}

/// Bytes of staging one packed batch may use: small enough that many rooms pack at once.
uint64_t pack_slice_bytes(const daemon_context& ctx) {
  return std::min<uint64_t>(4u << 20, ctx.staging->bytes / 8);
}

/// Pack and post queued head-sliced KV while staging lasts. When it is full, the room resumes
/// on its next batch completion or staging release (staging_atom), whichever comes first.
/// After a quantum of copying it yields (pump_atom to itself).
void pump(sender_actor* self) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  uint64_t copied = 0;
  for (auto& l : st.links) {
    const auto& link = *l.peer->link;
    while (!l.jobs.empty() && !terminal(st)) {
      uint64_t tokens = 0;
      size_t n = 0;
      const uint64_t budget = pack_slice_bytes(ctx) / link.row.length;
      while (n < l.jobs.size() && (n == 0 || tokens + l.jobs[n].tokens <= budget))
        tokens += l.jobs[n++].tokens;
      auto at = ctx.staging->allocate_or_wait(tokens * link.row.length,
                                              caf::actor_cast<caf::actor>(self));
      if (!at) return;  // resumed by batch_done or staging_atom
      st.copies.clear();
      st.writes.clear();
      for (uint64_t cursor = *at; n > 0; --n) {
        expand_pack_job(link, l.jobs.front(), cursor, st.copies, st.writes);
        cursor += l.jobs.front().tokens * link.row.length;
        l.jobs.pop_front();
      }
      copied += tokens * link.row.length;
      submit(self, l, at);
      if (copied >= copy_quantum_bytes && !l.jobs.empty()) {
        if (!st.pump_scheduled) self->send(self, pump_atom::value);
        st.pump_scheduled = true;
        return;
      }
    }
  }
}

/// After the last chunk and once nothing waits for staging: tell every decode rank its total.
void maybe_announce(sender_actor* self) {
  auto& st = self->state;
  if (!st.last_posted || st.announced || terminal(st)) return;
  for (const auto& l : st.links)
    if (!l.jobs.empty()) return;
  st.announced = true;
  for (const auto& l : st.links)
    self->send(
        l.connection,
        peer_outbound{caf::make_message(peer_announce{st.room, l.prep.token, l.writes, l.bytes})});
  // A room with no writes at all (no pages, no state, no aux pool) commits on the announcement.
  set_status(self, room_status::transferring);
}

/// Plan one chunk for one decode rank: whole pages, writes into the decode's staging, or
/// direct per-token writes go out now; packed slices queue for staging.
void post_link(sender_actor* self, decode_link& l, const proto::send& chunk, uint32_t first) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  const auto& link = *l.peer->link;
  st.writes.clear();
  st.copies.clear();
  if (!chunk.src_pages.empty()) {
    auto dst_pages =
        std::span<const uint32_t>(l.prep.dst_pages).subspan(first, chunk.src_pages.size());
    auto runs = coalesce_runs(chunk.src_pages, dst_pages, first);
    // Pack through staging unless one token's slice would not even fit a slice of it.
    if (link.kv == kv_mode::pack && ctx.staging && link.row.length <= pack_slice_bytes(ctx)) {
      std::vector<pack_job> jobs;
      plan_pack_jobs(link, ctx.layout, l.peer->layout, runs,
                     pack_slice_bytes(ctx) / link.row.length, jobs);
      l.jobs.insert(l.jobs.end(), jobs.begin(), jobs.end());
    } else {
      staging_use su;
      su.room_pages = static_cast<uint32_t>(l.prep.dst_pages.size());
      if (l.prep.dst_staging != no_staging) su.dst = l.prep.dst_staging;
      plan_kv_chunk(link, ctx.layout, l.peer->layout, runs, su, st.copies, st.writes);
    }
  }
  if (chunk.last) {
    if (ctx.layout[pool_kind::state].present)
      plan_state_link(link, ctx.layout, l.peer->layout, chunk.state_slot, l.prep.dst_state_slot,
                      st.writes);
    if (ctx.layout[pool_kind::aux].present)
      plan_aux_link(link, ctx.layout, l.peer->layout, chunk.aux_row, l.prep.dst_aux_row, st.writes);
  }
  submit(self, l, std::nullopt);
}

/// Plan and post one chunk to every decode rank; returns an error (nothing posted) when the
/// chunk does not fit the decode's page list.
result<> post_chunk(sender_actor* self, const proto::send& chunk) {
  auto& st = self->state;
  const auto n = static_cast<uint32_t>(chunk.src_pages.size());
  // Every rank prepared the same number of pages and saw the same chunks, so one check holds
  // for all cursors.
  auto probe = st.links.front().cursor;
  auto first = probe.take(n, chunk.last);
  if (!first) return std::move(first).error();
  for (auto& l : st.links) {
    (void)l.cursor.take(n, chunk.last);  // the probe above took the same from the same position
    post_link(self, l, chunk, first.value);
  }
  st.ctx->log_room->debug("room={} peer={} chunk pages={} last={}", st.room, st.peer_name(), n,
                          chunk.last);
  st.last_posted = chunk.last;
  pump(self);
  maybe_announce(self);
  return {};
}

void handle_chunk(sender_actor* self, client_request& req) {
  auto& st = self->state;
  const auto& chunk = std::get<proto::send>(req.msg);
  if (draining(st)) {
    st.ctx->gateway->reply(
        req.conn, req.seq,
        proto::error{errc::cancelled, fmt::format("room {} failed: {} (its writes are draining)",
                                                  st.room, st.life.machine.fail_reason())});
    return;
  }
  // A page in two chunks would be written to two positions: refuse the chunk, naming it.
  for (size_t i = 0; i < chunk.src_pages.size(); ++i)
    if (st.sent_pages.count(chunk.src_pages[i])) {
      st.ctx->gateway->reply(
          req.conn, req.seq,
          proto::error{errc::invalid_request,
                       fmt::format("room {}: src page {} (position {}) was already sent in an "
                                   "earlier chunk of this room",
                                   st.room, chunk.src_pages[i], i)});
      return;
    }
  auto accept = [&] { st.sent_pages.insert(chunk.src_pages.begin(), chunk.src_pages.end()); };
  if (!st.ready()) {
    if (st.queued.size() >= max_queued_chunks) {
      st.ctx->gateway->reply(
          req.conn, req.seq,
          proto::error{errc::invalid_request,
                       fmt::format("room {}: {} chunks already wait for the decode's prepare",
                                   st.room, max_queued_chunks)});
      return;
    }
    // Reply now: the chunk is accepted and will be posted once the decode's prepare arrives.
    accept();
    st.ctx->gateway->reply(req.conn, req.seq, proto::ok{});
    st.queued.push_back(std::move(req));
    return;
  }
  if (auto e = post_chunk(self, chunk); !e) {
    st.ctx->log_room->warn("room={} peer={} send rejected: {}", st.room, st.peer_name(), e.message);
    st.ctx->gateway->reply(req.conn, req.seq,
                           proto::error{e.code, fmt::format("room {}: {}", st.room, e.message)});
    return;
  }
  accept();
  st.ctx->gateway->reply(req.conn, req.seq, proto::ok{});
}

/// Whether a decode rank's prepare can join this room (invalid_request when not). `fatal`: the
/// room cannot succeed any more (its decode ranks disagree), so it fails with this reason.
result<> check_prepare(const sender_state& st, const peer_inbound& in, const peer_prepare& p,
                       bool& fatal) {
  const auto& mine = st.ctx->config.tp;
  const auto& peer = in.from->schema;
  fatal = false;
  if (!in.from->link->in_group)
    return error{errc::invalid_request, fmt::format("decode TP rank {} of {} (PP stage {}) does "
                                                    "not receive from this prefill (TP rank {} of "
                                                    "{}, PP stage {})",
                                                    peer.tp_rank, peer.tp_size, peer.pp_rank,
                                                    mine.rank, mine.size, st.ctx->config.pp.rank)};
  for (const auto& l : st.links)
    if (l.connection == in.connection)
      return error{errc::invalid_request,
                   fmt::format("duplicate room {}: already prepared", p.room)};
  if (st.ready())
    return error{errc::invalid_request, fmt::format("room {}: all {} decode ranks already prepared",
                                                    p.room, st.expected_links)};
  fatal = true;
  for (const auto& l : st.links) {
    if (l.prep.dst_pages.size() != p.dst_pages.size())
      return error{
          errc::invalid_request,
          fmt::format(
              "room {}: decode ranks prepared different page counts: {} prepared {} pages, {} "
              "prepared {}",
              p.room, l.peer->address, l.prep.dst_pages.size(), in.from->address,
              p.dst_pages.size())};
    if (l.prep.prefix_tokens != p.prefix_tokens)
      return error{
          errc::invalid_request,
          fmt::format(
              "room {}: decode ranks prepared different prefixes: {} prepared {} tokens, {} "
              "prepared {}",
              p.room, l.peer->address, l.prep.prefix_tokens, in.from->address, p.prefix_tokens)};
    if (l.peer->schema.tp_size != peer.tp_size)
      return error{
          errc::invalid_request,
          fmt::format("room {}: decode ranks of different TP sizes prepared it: {} has TP {}, "
                      "{} has TP {}",
                      p.room, l.peer->address, l.peer->schema.tp_size, in.from->address,
                      peer.tp_size)};
  }
  fatal = false;
  // The decode named these indices; check them against the layout it declared before any write
  // is planned, so a buggy or hostile peer gets a refusal, not writes outside its pools.
  const auto& dl = in.from->layout;
  if (!p.dst_pages.empty()) {
    if (!dl[pool_kind::kv].present)
      return error{errc::invalid_request,
                   fmt::format("room {}: pages named but the decode has no kv pool", p.room)};
    if (auto e = check_indices(p.dst_pages, dl[pool_kind::kv].buffers[0].items, "decode dst page",
                               "pages");
        !e)
      return error{e.code, fmt::format("room {}: {}", p.room, e.message)};
  }
  if (p.dst_state_slot != no_index &&
      (!dl[pool_kind::state].present || p.dst_state_slot >= dl[pool_kind::state].buffers[0].items))
    return error{errc::invalid_request,
                 fmt::format("room {}: decode dst state slot {} is outside its mamba pool", p.room,
                             p.dst_state_slot)};
  if (p.dst_aux_row != no_index &&
      (!dl[pool_kind::aux].present || p.dst_aux_row >= dl[pool_kind::aux].buffers[0].items))
    return error{errc::invalid_request,
                 fmt::format("room {}: decode dst aux row {} is outside its aux pool", p.room,
                             p.dst_aux_row)};
  if (st.ctx->layout[pool_kind::state].present && p.dst_state_slot == no_index)
    return error{
        errc::invalid_request,
        fmt::format("mamba requires single state index: room {} got dst=none from the decode",
                    p.room)};
  if (st.ctx->layout[pool_kind::aux].present && p.dst_aux_row == no_index)
    return error{errc::invalid_request,
                 fmt::format("room {}: the decode named no aux row", p.room)};
  if (p.dst_staging != no_staging) {
    const auto need = in.from->link->unpack_staging_bytes(p.dst_pages.size());
    if (!need || !in.from->staging.present || p.dst_staging > in.from->staging.length ||
        in.from->staging.length - p.dst_staging < need)
      return error{
          errc::invalid_request,
          fmt::format("room {}: staging offset {} ({} bytes) is outside the decode's staging "
                      "region of {} bytes",
                      p.room, p.dst_staging, need, in.from->staging.length)};
  }
  return {};
}

void on_prepare(sender_actor* self, peer_inbound& in, peer_prepare& p) {
  auto& st = self->state;
  bool fatal = false;
  auto joined = draining(st) ? result<>(error{st.life.machine.fail_code(),
                                              fmt::format("room {} failed on the prefill: {}",
                                                          p.room, st.life.machine.fail_reason())})
                             : check_prepare(st, in, p, fatal);
  if (!joined) {
    self->send(in.connection,
               peer_outbound{caf::make_message(peer_prepare_ack{
                   p.room, p.token, false, joined.message, static_cast<uint16_t>(joined.code)})});
    if (fatal) fail(self, joined.code, joined.message);
    return;
  }
  st.expected_links = decode_ranks_per_prefill(st.ctx->config.tp.size, in.from->schema.tp_size);
  decode_link l;
  l.peer = in.from;
  l.connection = in.connection;
  l.cursor = chunk_cursor(static_cast<uint32_t>(p.dst_pages.size()));
  st.prefix_tokens = p.prefix_tokens;
  l.prep = std::move(p);
  st.ctx->log_room->debug("room={} peer={} prepared: {} dst pages, state slot {}, aux row {}; {}",
                          st.room, l.peer->address, l.prep.dst_pages.size(), l.prep.dst_state_slot,
                          l.prep.dst_aux_row, l.peer->link->describe());
  self->send(l.connection,
             peer_outbound{caf::make_message(peer_prepare_ack{st.room, l.prep.token, true, {}})});
  st.links.push_back(std::move(l));
  if (!st.ready()) return;
  set_status(self, room_status::waiting_for_input);
  while (!st.queued.empty() && !terminal(st)) {
    auto req = std::move(st.queued.front());
    st.queued.pop_front();
    if (auto e = post_chunk(self, std::get<proto::send>(req.msg)); !e)
      fail(self, e.code, e.message);
  }
}

void on_peer(sender_actor* self, peer_inbound& in) {
  auto& st = self->state;
  in.msg.apply({
      [&](peer_prepare& p) { on_prepare(self, in, p); },
      [&](peer_outcome& o) {
        decode_link* l = nullptr;
        for (auto& x : st.links)
          if (x.connection == in.connection) l = &x;
        if (!l) {
          // A decode rank of this room's group failed before its prepare arrived.
          if (!o.ok && in.from->link->in_group)
            fail(self, o.code ? static_cast<errc>(o.code) : errc::internal,
                 fmt::format("decode {} reported: {}", in.from->address, o.reason));
          return;
        }
        if (o.token != l->prep.token) return;  // an earlier incarnation of this room id
        if (!o.ok)
          return fail(self, o.code ? static_cast<errc>(o.code) : errc::internal,
                      fmt::format("decode {} reported: {}", l->peer->address, o.reason));
        l->committed = true;
        st.ctx->log_room->debug("room={} peer={} committed: {} writes, {} bytes", st.room,
                                l->peer->address, l->writes, l->bytes);
        for (const auto& x : st.links)
          if (!x.committed) return;
        set_status(self, room_status::success);
      },
  });
}

caf::behavior sender_behavior(sender_actor* self, context_ptr ctx, uint64_t room,
                              caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.scheduler = std::move(scheduler);
  st.room = room;
  st.life.machine =
      room_lifecycle(limits_of(st.ctx->config.timeouts),
                     {"waiting for the decode's prepare", "waiting for the client's first chunk",
                      "waiting for the last chunk and the decode's commit"});
  apply(self, st.life.machine.start());
  return {
      [=](client_request& req) { handle_chunk(self, req); },
      [=](peer_inbound& in) { on_peer(self, in); },
      [=](batch_done_msg& d) {
        auto& st = self->state;
        std::string to = "?";
        if (auto it = st.batch_link.find(d.batch); it != st.batch_link.end()) {
          auto& l = st.links[it->second];
          l.completed += d.result.completed;
          l.failed += d.result.failed;
          to = l.peer->address;
          st.batch_link.erase(it);
        }
        if (draining(st)) return finish_drain(self);
        if (!d.result.ok())
          return fail(self, d.result.code,
                      fmt::format("write to decode {} failed: {}", to, d.result.message));
        pump(self);
        maybe_announce(self);
      },
      [=](staging_atom) {
        pump(self);
        maybe_announce(self);
      },
      [=](pump_atom) {
        self->state.pump_scheduled = false;
        pump(self);
        maybe_announce(self);
      },
      [=](cancel_atom, const std::string& why) { fail(self, errc::cancelled, why); },
      [=](peer_down& d) { fail(self, d.code, describe(d)); },
      [=](room_deadline& d) {
        auto& st = self->state;
        auto x = st.life.machine.expired(d.kind, d.generation);
        if (!x) return;  // no longer applies
        if (x->what == expiry::kind::drain_over)
          return finish_drain(
              self, fmt::format("; {} write batches were still in flight after the {} ms drain "
                                "(timeouts.drain_ms)",
                                st.batch_link.size(), x->ms));
        fail(self, errc::timed_out,
             fmt::format("timed out in {} after {} ms ({})", to_string(x->in), x->ms, x->waits));
      },
  };
}

}  // namespace

caf::actor spawn_sender(caf::event_based_actor* parent, context_ptr ctx, uint64_t room,
                        caf::actor scheduler) {
  return parent->spawn<caf::monitored>(sender_behavior, std::move(ctx), room, std::move(scheduler));
}

}  // namespace ferry
