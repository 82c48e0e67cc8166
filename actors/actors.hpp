#pragma once
/// Spawn functions of Ferry's actors. See docs/architecture.md for the message flow.
///
/// - Scheduler (one per daemon): room registry, client requests, admission, peer connections,
///   routing of peer messages and arrived immediates to rooms. Peers reach it through the peer
///   gate (transport/channels/peer_gate.hpp), which gives it each inbound link's first message.
/// - Connection (one per peer): handshake (identity, instance, layouts, compatibility hash,
///   fabric address, memory regions), relays room messages to/from the peer, monitors it.
/// - Sender (one per room, prefill side): plans and posts the room's writes, announces the total.
/// - Receiver (one per room, decode side): counts landed writes; Success only when the count
///   equals the announced total.

#include <caf/all.hpp>

#include "actors/context.hpp"
#include "actors/messages.hpp"

namespace ferry {

caf::actor spawn_scheduler(caf::actor_system& sys, context_ptr ctx);

/// Outbound connection to the peer daemon at `address` ("host:port"); reports to `scheduler`.
/// It dials through the peer gate (ctx->peer_port) and speaks on the link it gets.
/// With `known_down` it fails at once with that reason (a peer declared unresponsive moments
/// ago is not contacted again until timeouts.heartbeat_ms x heartbeat_misses has passed).
caf::actor spawn_outbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                     std::string address, caf::actor scheduler,
                                     std::string known_down = {});
/// Inbound connection answering the handshake `hello` a peer sent first on `link`.
caf::actor spawn_inbound_connection(caf::event_based_actor* parent, context_ptr ctx,
                                    peer_link_ptr link, peer_hello hello, caf::actor scheduler);

/// Prefill-side room, created by the first client send or the first decode prepare; it waits
/// for the prepares of every decode rank it feeds (max(1, Pd/Ps)).
caf::actor spawn_sender(caf::event_based_actor* parent, context_ptr ctx, uint64_t room,
                        caf::actor scheduler);
/// A client's prepare or send refused by its own fields alone, against this daemon's role,
/// config and layout (which never change while it runs): the error, logged as the Scheduler
/// logs its refusals, or nothing. The client gateway answers these on its thread
/// (actors/scheduler_rooms.cpp holds the Scheduler's checks, in the same order).
std::optional<proto::error> refuse_at_once(daemon_context& ctx, const proto::message& m,
                                           uint64_t conn);

/// Decode-side room, created by a client prepare; `connections` has one Connection per named
/// prefill peer, in the order of `prep.prefill_peers`.
/// `known`: the description of each connection whose peer is ready and not draining (null
/// where the Receiver must ask its Connection).
caf::actor spawn_receiver(caf::event_based_actor* parent, context_ptr ctx, proto::prepare prep,
                          uint64_t token, std::vector<caf::actor> connections,
                          std::vector<peer_info_ptr> known, caf::actor scheduler);

}  // namespace ferry
