#pragma once
// The Connection actor's state and its own messages (actors/connection.cpp), shared with the
// part that exchanges fabric endpoints with the peer (actors/connection_rails.cpp). Private to
// those two files.

#include <caf/all.hpp>
#include <optional>

#include "actors/context.hpp"
#include "actors/messages.hpp"
#include "core/auth.hpp"
#include "core/peer_handshake.hpp"

namespace ferry::conn {

namespace hs = handshake;

/// Peer gate -> Connection: the dialed link, through the preamble, or why not.
struct peer_dialed {
  peer_link_ptr link;
  std::string error;
  bool reset = false;  // reset in the middle of the preamble: perhaps evicted by a flood
};

/// Connection -> itself: dial the peer again.
using redial_atom = caf::atom_constant<caf::atom("redial")>;

/// Engine -> Connection: the registrations asked for this peer are made, or why not.
/// `asked` false: nothing was asked of the engine (the pools cannot be described).
struct regions_registered {
  result<std::vector<transport::region_id>> outcome;
  bool asked = true;
};

/// Engine -> Connection: the peer's fabric address is in the address vector, or why not.
struct peer_inserted {
  result<transport::peer_handle> outcome;
};

/// Engine -> Connection: the peer's other endpoints are known on our rails (how many), or why
/// not; `answer`: the decode side, which now sends its own endpoints.
struct rails_added {
  result<uint32_t> outcome;
  bool answer = false;
};

}  // namespace ferry::conn

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::conn::peer_dialed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::conn::regions_registered)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::conn::peer_inserted)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(ferry::conn::rails_added)

namespace ferry::conn {

struct connection_state {
  static inline const char* name = "ferry.connection";
  connection_state() = default;
  connection_state(const connection_state&) = delete;
  connection_state& operator=(const connection_state&) = delete;
  /// However the actor ends, its link ends with it, so the peer sees the connection close.
  ~connection_state() {
    if (link) link->close("the connection ended");
  }
  hs::machine machine{hs::side::connecting, {}, false};
  context_ptr ctx;
  caf::actor scheduler;
  std::string address;
  std::string host;  // outbound: the peer's control address, split once
  uint16_t port = 0;
  peer_link_ptr link;                    // the channel to the peer, once dialed or admitted
  peer_hello hello;                      // the peer's (its nonce)
  std::shared_ptr<peer_info> candidate;  // its hello passed; becomes `info` when ready
  peer_info_ptr info;
  std::vector<peer_wire::message> queued;
  std::vector<caf::response_promise> waiting;    // info requests before the handshake finished
  bytes nonce;                                   // ours, when a cluster secret is configured
  int proved_with = -1;                          // which of the accepted secrets the peer proved
  std::optional<transport::peer_handle> handle;  // the peer's fabric address, once inserted
  std::vector<transport::region_id> fence;       // this peer's own registrations
  std::vector<peer_region> regions;              // as described to this peer, by pool kind
  peer_region staging;
  int64_t last_heard = 0;                 // ms on the steady clock
  int64_t next_beat = 0;                  // when the next heartbeat is due
  int64_t tick_due = 0;                   // when the scheduled heartbeat tick should run
  std::shared_ptr<peer_health> health;    // while ready: the metrics' view of last_heard
  std::string leaving;                    // the peer said it is stopping (peer_leaving): why
  bool fence_asked = false;               // a room asked for the fence (its writes failed)
  bool goodbye_pending = false;           // our peer_leaving awaits its peer_leaving_ack
  std::optional<peer_rails> early_rails;  // connecting: the peer's rails, sent before our ready
  bool routed = false;                    // the link delivers room messages straight to their rooms
  uint64_t frames_seen = 0;               // the link's frames_in() at the last heartbeat tick
};

using connection_actor = caf::stateful_actor<connection_state>;

/// Milliseconds on the steady clock.
int64_t now_ms();
/// Something arrived from the ready peer.
void heard(connection_state& st);
/// Send on the link (dropped once it is over: the connection's end is reported by then).
void send(connection_state& st, const peer_wire::message& m);
/// Carry out the handshake machine's effects, in order.
void apply(connection_actor* self, hs::effects fx);

// Rails (actors/connection_rails.cpp).

/// Once ready: the prefill side lists its endpoints; the decode side takes a list that came
/// before it was ready.
void rails_when_ready(connection_actor* self);
/// The peer's `peer_rails`.
void on_peer_rails(connection_actor* self, peer_rails& m);
/// The engine added the peer's endpoints (or failed to).
void on_rails_added(connection_actor* self, rails_added& m);

}  // namespace ferry::conn
