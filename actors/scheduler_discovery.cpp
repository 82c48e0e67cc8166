// discover: every rank of an engine instance from one of its addresses.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "actors/client_memory.hpp"
#include "actors/scheduler_state.hpp"
#include "core/plan.hpp"
#include "transport/channels/client_gateway.hpp"

namespace ferry::sched {

namespace {

proto::discovered_rank rank_at(const std::string& address) {
  proto::discovered_rank r;
  r.address = address;
  return r;
}

}  // namespace

/// discover: handshake with the daemon at the address (the connection stays for the rooms
/// that follow), then with every rank its config lists (discovery.instance_ranks), and answer
/// each rank's position or why it cannot be used. Each lookup is bounded by the handshake
/// deadline, and the ranks are asked at once: a rank that is down costs no more than one.
void on_discover(scheduler_actor* self, client_request& r) {
  auto& st = self->state;
  const auto address = std::get<proto::discover>(r.msg).address;
  if (!valid_host_port(address))
    return reply_error(
        self, r, errc::invalid_request,
        fmt::format("discover: '{}' is not host:port (a port in 1..65535)", address));
  const auto limit = std::chrono::milliseconds(st.ctx->config.timeouts.handshake_ms + 1000);
  struct gather {
    uint64_t conn;
    uint32_t seq;
    proto::discover_reply out;
    size_t pending = 0;
  };
  auto lookup = [self, limit](std::shared_ptr<gather> g, size_t i) {
    auto& rank = g->out.ranks[i];
    auto done = [self, g] {
      if (--g->pending == 0) self->state.ctx->gateway->reply(g->conn, g->seq, g->out);
    };
    self->request(connection_for(self, rank.address), limit, info_atom::value)
        .then(
            [g, i, done](peer_lookup& l) {
              auto& x = g->out.ranks[i];
              if (l.info) {
                x.up = true;
                x.node = l.info->node;
                x.tp_size = l.info->schema.tp_size;
                x.tp_rank = l.info->schema.tp_rank;
                x.pp_size = l.info->schema.pp_size;
                x.pp_rank = l.info->schema.pp_rank;
                x.dp_size = l.info->schema.dp_size;
                x.dp_rank = l.info->schema.dp_rank;
              } else {
                x.reason = l.error;
              }
              done();
            },
            [self, g, i, done](caf::error& e) {
              g->out.ranks[i].reason = "no answer: " + self->system().render(e);
              done();
            });
  };
  // First the named daemon, which says who the other ranks are.
  auto first = std::make_shared<gather>(gather{r.conn, r.seq, {}, 1});
  first->out.ranks.push_back(rank_at(address));
  self->request(connection_for(self, address), limit, info_atom::value)
      .then(
          [self, first, lookup, address](peer_lookup& l) {
            if (!l.info) {
              first->out.ranks[0].reason = l.error;
              return self->state.ctx->gateway->reply(first->conn, first->seq, first->out);
            }
            auto g = std::make_shared<gather>(gather{first->conn, first->seq, {}, 0});
            g->out.ranks.push_back(rank_at(address));
            for (const auto& a : l.info->instance_ranks)
              if (a != address) g->out.ranks.push_back(rank_at(a));
            g->pending = g->out.ranks.size();
            for (size_t i = 0; i < g->out.ranks.size(); ++i) lookup(g, i);
          },
          [self, first](caf::error& e) {
            first->out.ranks[0].reason = "no answer: " + self->system().render(e);
            self->state.ctx->gateway->reply(first->conn, first->seq, first->out);
          });
}

}  // namespace ferry::sched
