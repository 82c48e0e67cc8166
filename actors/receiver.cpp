// Receiver: one per room on the decode side.
//
// Life: Bootstrapping (prepare sent towards the prefill peer, connecting if needed) ->
// WaitingForInput (the prefill accepted the prepare) -> Transferring (first write landed) ->
// Success (landed writes == announced total) | Failed (prefill refused or failed, peer lost,
// more writes than announced, cancel, deadline).
//
// Success is never inferred from a local event: only the counted remote-CQ-data immediates,
// which the fabric reports after each payload is placed, against the sender's announced total.

#include <fmt/format.h>

#include "actors/actors.hpp"
#include "core/plan.hpp"

namespace ferry {
namespace {

struct receiver_state {
  static inline const char* name = "ferry.receiver";
  context_ptr ctx;
  caf::actor scheduler;
  caf::actor connection;
  proto::prepare prep;
  uint64_t token = 0;
  room_state state;
  commit_counter commit;
  uint64_t bytes = 0;
};

using receiver_actor = caf::stateful_actor<receiver_state>;

void set_status(receiver_actor* self, room_status s, std::string reason = {}) {
  auto& st = self->state;
  if (!(s == room_status::failed ? st.state.fail() : st.state.advance(s))) return;
  caf::anon_send(st.scheduler, room_update{st.prep.room, true, s, reason,
                                           s == room_status::success ? st.bytes : 0});
  if (is_terminal(s)) self->quit();
}

void fail(receiver_actor* self, const std::string& reason, bool tell_peer) {
  auto& st = self->state;
  if (is_terminal(st.state.status())) return;
  st.ctx->log_room->warn("room={} peer={} failed: {}", st.prep.room, st.prep.prefill_peer, reason);
  if (tell_peer)
    self->send(st.connection,
               peer_outbound{caf::make_message(peer_outcome{st.prep.room, false, false, reason})});
  set_status(self, room_status::failed, reason);
}

void evaluate(receiver_actor* self, commit_counter::state c) {
  auto& st = self->state;
  switch (c) {
    case commit_counter::state::pending:
      return;
    case commit_counter::state::overflow:
      fail(self,
           fmt::format("{} writes landed but the prefill announced {}", st.commit.landed(),
                       *st.commit.expected()),
           true);
      return;
    case commit_counter::state::complete:
      st.ctx->log_room->debug("room={} peer={} committed: {} writes, {} bytes", st.prep.room,
                              st.prep.prefill_peer, st.commit.landed(), st.bytes);
      self->send(st.connection,
                 peer_outbound{caf::make_message(peer_outcome{st.prep.room, false, true, {}})});
      set_status(self, room_status::success);
      return;
  }
}

caf::behavior receiver_behavior(receiver_actor* self, context_ptr ctx, proto::prepare prep,
                                uint64_t token, caf::actor connection, caf::actor scheduler) {
  auto& st = self->state;
  st.ctx = std::move(ctx);
  st.prep = std::move(prep);
  st.token = token;
  st.connection = std::move(connection);
  st.scheduler = std::move(scheduler);
  self->send(st.connection,
             peer_outbound{caf::make_message(peer_prepare{st.prep.room, token, st.prep.dst_pages,
                                                          st.prep.state_slot, st.prep.aux_row})});
  const auto ms = st.ctx->config.timeouts.transfer_ms;
  self->delayed_send(self, std::chrono::milliseconds(ms), deadline_msg{"transfer", ms});
  return {
      [=](peer_prepare_ack& a) {
        if (a.ok)
          set_status(self, room_status::waiting_for_input);
        else
          fail(self, "prefill refused the prepare: " + a.reason, false);
      },
      [=](landed_msg& l) {
        set_status(self, room_status::transferring);
        evaluate(self, self->state.commit.add_landed(l.count));
      },
      [=](peer_announce& a) {
        self->state.bytes = a.total_bytes;
        set_status(self, room_status::transferring);
        evaluate(self, self->state.commit.announce(a.total_writes));
      },
      [=](peer_outcome& o) {
        if (!o.ok) fail(self, "prefill reported: " + o.reason, false);
      },
      [=](cancel_atom) { fail(self, "cancelled by client", true); },
      [=](peer_down& d) { fail(self, describe(d), false); },
      [=](deadline_msg& d) {
        fail(self,
             fmt::format("timed out in {} after {} ms ({} landed, {} announced)",
                         to_string(self->state.state.status()), d.ms, self->state.commit.landed(),
                         self->state.commit.expected()
                             ? std::to_string(*self->state.commit.expected())
                             : "none"),
             true);
      },
  };
}

}  // namespace

caf::actor spawn_receiver(caf::event_based_actor* parent, context_ptr ctx, proto::prepare prep,
                          uint64_t token, caf::actor connection, caf::actor scheduler) {
  return parent->spawn<caf::monitored>(receiver_behavior, std::move(ctx), std::move(prep), token,
                                       std::move(connection), std::move(scheduler));
}

}  // namespace ferry
