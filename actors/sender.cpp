// Sender: one per room on the prefill side.
//
// Life: Bootstrapping (client chunks arrived before the decode's prepare; queued, bounded by
// timeouts.prepare_wait_ms) -> WaitingForInput (prepare known) -> Transferring (first writes
// posted) -> Success (the decode counted every write) | Failed (bad chunk, write error, peer
// failure or loss, cancel, deadline).
//
// Each chunk is planned against the decode's page list by position, coalesced into runs, and
// posted as one transport batch. The last chunk adds the one state slot pair and the aux row, and
// is followed by the announcement of the room's total write count.

#include <fmt/format.h>

#include <deque>

#include "actors/actors.hpp"
#include "actors/client_gateway.hpp"
#include "core/plan.hpp"

namespace ferry {
namespace {

constexpr size_t max_queued_chunks = 4096;

struct sender_state {
  static inline const char* name = "ferry.sender";
  context_ptr ctx;
  caf::actor scheduler;
  uint64_t room = 0;
  room_state state;
  std::optional<peer_prepare> prep;
  peer_info_ptr peer;
  caf::actor connection;
  chunk_cursor cursor;
  std::deque<client_request> queued;  // chunks that arrived before the prepare
  uint64_t writes = 0;
  uint64_t bytes = 0;
  uint64_t next_batch = 1;
  bool announced = false;
  std::vector<planned_write> scratch;

  std::string peer_name() const { return peer ? peer->address : std::string("?"); }
};

using sender_actor = caf::stateful_actor<sender_state>;

void set_status(sender_actor* self, room_status s, std::string reason = {}) {
  auto& st = self->state;
  if (!(s == room_status::failed ? st.state.fail() : st.state.advance(s))) return;
  caf::anon_send(st.scheduler,
                 room_update{st.room, false, s, reason, s == room_status::success ? st.bytes : 0});
  if (is_terminal(s)) self->quit();
}

void fail(sender_actor* self, const std::string& reason, bool tell_peer) {
  auto& st = self->state;
  if (is_terminal(st.state.status())) return;
  st.ctx->log_room->warn("room={} peer={} failed: {}", st.room, st.peer_name(), reason);
  if (tell_peer && st.connection && st.prep)
    self->send(st.connection,
               peer_outbound{caf::make_message(peer_outcome{st.room, true, false, reason})});
  for (auto& q : st.queued)
    st.ctx->gateway->reply(
        q.conn, q.seq,
        proto::error{errc::cancelled, fmt::format("room {} failed: {}", st.room, reason)});
  st.queued.clear();
  set_status(self, room_status::failed, reason);
}

/// Plan and post one chunk; returns an error (nothing posted) when the chunk does not fit the
/// decode's page list.
std::optional<std::string> post_chunk(sender_actor* self, const proto::send& chunk) {
  auto& st = self->state;
  const auto& ctx = *st.ctx;
  uint32_t first = 0;
  if (auto e = st.cursor.take(static_cast<uint32_t>(chunk.src_pages.size()), chunk.last, first))
    return e;
  auto& w = st.scratch;
  w.clear();
  const auto& src = ctx.layout;
  const auto& dst = st.peer->layout;
  if (!chunk.src_pages.empty()) {
    auto dst_pages =
        std::span<const uint32_t>(st.prep->dst_pages).subspan(first, chunk.src_pages.size());
    auto runs = coalesce_runs(chunk.src_pages, dst_pages);
    plan_kv(src[pool_kind::kv], dst[pool_kind::kv], runs, w);
  }
  if (chunk.last) {
    if (src[pool_kind::state].present)
      plan_state(src[pool_kind::state], dst[pool_kind::state], chunk.state_slot,
                 st.prep->dst_state_slot, w);
    if (src[pool_kind::aux].present)
      plan_aux(src[pool_kind::aux], dst[pool_kind::aux], chunk.aux_row, st.prep->dst_aux_row, w);
  }
  split_pieces(w, ctx.config.fabric.write_piece_bytes);
  if (!w.empty()) {
    transport::write_batch batch;
    batch.peer = st.peer->fabric_peer;
    batch.ops.reserve(w.size());
    for (const auto& p : w) {
      const auto pool = static_cast<int>(p.pool);
      const auto& region = st.peer->regions[pool];
      batch.ops.push_back({ctx.regions[pool], p.src_offset, p.length,
                           region.remote_base + p.dst_offset, region.key, st.prep->token});
      st.bytes += p.length;
    }
    st.writes += w.size();
    const uint64_t id = st.next_batch++;
    caf::actor me = caf::actor_cast<caf::actor>(self);
    batch.done = [me, id](transport::batch_result r) {
      caf::anon_send(me, batch_done_msg{id, std::move(r)});
    };
    ctx.engine->submit(std::move(batch));
    set_status(self, room_status::transferring);
  }
  st.ctx->log_room->debug("room={} peer={} chunk pages={} last={} writes={}", st.room,
                          st.peer_name(), chunk.src_pages.size(), chunk.last, w.size());
  if (chunk.last) {
    st.announced = true;
    self->send(st.connection,
               peer_outbound{caf::make_message(peer_announce{st.room, st.writes, st.bytes})});
    // A room with no writes at all (no pages, no state, no aux pool) commits on the announcement.
    set_status(self, room_status::transferring);
  }
  return std::nullopt;
}

void handle_chunk(sender_actor* self, client_request& req) {
  auto& st = self->state;
  const auto& chunk = std::get<proto::send>(req.msg);
  if (!st.prep) {
    if (st.queued.size() >= max_queued_chunks) {
      st.ctx->gateway->reply(
          req.conn, req.seq,
          proto::error{errc::invalid_request,
                       fmt::format("room {}: {} chunks already wait for the decode's prepare",
                                   st.room, max_queued_chunks)});
      return;
    }
    // Reply now: the chunk is accepted and will be posted once the decode's prepare arrives.
    st.ctx->gateway->reply(req.conn, req.seq, proto::ok{});
    st.queued.push_back(std::move(req));
    return;
  }
  if (auto e = post_chunk(self, chunk)) {
    st.ctx->log_room->warn("room={} peer={} send rejected: {}", st.room, st.peer_name(), *e);
    st.ctx->gateway->reply(
        req.conn, req.seq,
        proto::error{errc::invalid_request, fmt::format("room {}: {}", st.room, *e)});
    return;
  }
  st.ctx->gateway->reply(req.conn, req.seq, proto::ok{});
}

caf::behavior sender_behavior(sender_actor* self, context_ptr ctx, uint64_t room,
                              caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.scheduler = std::move(scheduler);
  st.room = room;
  const auto& t = st.ctx->config.timeouts;
  self->delayed_send(self, std::chrono::milliseconds(t.prepare_wait_ms),
                     deadline_msg{"waiting for the decode's prepare", t.prepare_wait_ms, true});
  self->delayed_send(self, std::chrono::milliseconds(t.transfer_ms),
                     deadline_msg{"transfer", t.transfer_ms});
  return {
      [=](client_request& req) { handle_chunk(self, req); },
      [=](sender_prepare& sp) {
        auto& st = self->state;
        if (st.prep) {
          self->send(
              sp.connection,
              peer_outbound{caf::make_message(peer_prepare_ack{
                  st.room, false, fmt::format("duplicate room {}: already prepared", st.room)})});
          return;
        }
        st.peer = std::move(sp.peer);
        st.connection = std::move(sp.connection);
        st.prep = std::move(sp.prepare);
        st.cursor = chunk_cursor(static_cast<uint32_t>(st.prep->dst_pages.size()));
        st.ctx->log_room->debug("room={} peer={} prepared: {} dst pages, state slot {}, aux row {}",
                                st.room, st.peer_name(), st.prep->dst_pages.size(),
                                st.prep->dst_state_slot, st.prep->dst_aux_row);
        self->send(st.connection,
                   peer_outbound{caf::make_message(peer_prepare_ack{st.room, true, {}})});
        set_status(self, room_status::waiting_for_input);
        while (!st.queued.empty() && !is_terminal(st.state.status())) {
          auto req = std::move(st.queued.front());
          st.queued.pop_front();
          if (auto e = post_chunk(self, std::get<proto::send>(req.msg))) fail(self, *e, true);
        }
      },
      [=](batch_done_msg& d) {
        if (!d.result.ok) fail(self, "write failed: " + d.result.error, true);
      },
      [=](peer_outcome& o) {
        auto& st = self->state;
        if (o.ok) {
          st.ctx->log_room->debug("room={} peer={} committed: {} writes, {} bytes", st.room,
                                  st.peer_name(), st.writes, st.bytes);
          set_status(self, room_status::success);
        } else {
          fail(self, "decode reported: " + o.reason, false);
        }
      },
      [=](cancel_atom) { fail(self, "cancelled by client", true); },
      [=](peer_down& d) { fail(self, describe(d), false); },
      [=](deadline_msg& d) {
        auto& st = self->state;
        if (!d.ends_at_prepare || !st.prep)
          fail(self,
               fmt::format("timed out in {} after {} ms ({})", to_string(st.state.status()), d.ms,
                           d.what),
               true);
      },
  };
}

}  // namespace

caf::actor spawn_sender(caf::event_based_actor* parent, context_ptr ctx, uint64_t room,
                        caf::actor scheduler) {
  return parent->spawn<caf::monitored>(sender_behavior, std::move(ctx), room, std::move(scheduler));
}

}  // namespace ferry
