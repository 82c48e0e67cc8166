// The Scheduler's `info` answers: status, rooms, peers and pools as text.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "actors/client_gateway.hpp"
#include "actors/client_memory.hpp"
#include "actors/scheduler_state.hpp"
#include "core/plan.hpp"

namespace ferry::sched {

std::string info_text(scheduler_state& st, proto::info_topic topic) {
  const auto& c = st.ctx->config;
  std::ostringstream o;
  switch (topic) {
    case proto::info_topic::status:
      o << "node: " << c.node_name << "\ninstance: " << st.ctx->instance
        << "\nrole: " << to_string(c.role) << "\nprovider: " << st.ctx->engine->provider_name()
        << "\ncontrol: " << c.control_listen << "\nclient: " << c.client_listen
        << "\nclients: " << st.ctx->gateway->connections() << "\npeers: " << st.connections.size()
        << "\nprefill_rooms_active: " << st.prefill.active.size()
        << "\nprefill_rooms_succeeded: " << st.prefill.succeeded
        << "\nprefill_rooms_failed: " << st.prefill.failed
        << "\nprefill_bytes_sent: " << st.prefill.bytes
        << "\ndecode_rooms_active: " << st.decode.active.size()
        << "\ndecode_rooms_succeeded: " << st.decode.succeeded
        << "\ndecode_rooms_failed: " << st.decode.failed
        << "\ndecode_bytes_received: " << st.decode.bytes << "\nstray_writes: " << st.stray_writes
        << "\nstaging_bytes: " << (st.ctx->staging ? st.ctx->staging->bytes : 0)
        << "\nstaging_in_use: " << (st.ctx->staging ? st.ctx->staging->in_use() : 0)
        << "\nstaging_waits: " << (st.ctx->staging ? st.ctx->staging->waits() : 0) << "\n";
      break;
    case proto::info_topic::rooms:
      if (st.prefill.active.empty() && st.decode.active.empty()) o << "no active rooms\n";
      for (auto* side : {&st.prefill, &st.decode})
        for (const auto& [room, e] : side->active)
          o << "room=" << room << " side=" << (side == &st.decode ? "decode" : "prefill")
            << " status=" << to_string(e.status) << " peer=" << (e.peer.empty() ? "-" : e.peer)
            << "\n";
      break;
    case proto::info_topic::peers:
      if (st.connections.empty() && st.outbound.empty()) o << "no peers\n";
      for (const auto& [conn, info] : st.connections)
        if (info)
          o << "peer=" << info->address << " node=" << info->node << " instance=" << info->instance
            << " tp=" << info->schema.tp_rank << "/" << info->schema.tp_size
            << " pp=" << info->schema.pp_rank << "/" << info->schema.pp_size
            << " link: " << info->link->describe() << "\n";
      for (const auto& [addr, conn] : st.outbound)
        if (!st.connections.count(conn) || !st.connections[conn])
          o << "peer=" << addr << " connecting\n";
      break;
  }
  return o.str();
}

}  // namespace ferry::sched
