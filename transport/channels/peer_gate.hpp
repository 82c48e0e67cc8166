#pragma once
/// The peer port and the peer channel, served by one epoll thread of Ferry's own: it runs Ferry's
/// preamble (core/peer_preamble.hpp) on every peer connection, inbound and outbound, and then
/// carries the connection's channel frames (transport/channels/peer_link.hpp, core/peer_wire.hpp).
/// Nothing but Ferry's own fixed-size or bounded frames is ever parsed (docs/architecture.md, "Peer
/// port").
///
/// Inbound: the gate accepts, runs the accepting side of the preamble, and hands the new link to
/// `admit_fn` (the daemon gives its first message to the Scheduler). Outbound: `dial()`
/// connects without blocking, runs the connecting side, and hands the link to the caller's
/// `dial_fn` (a Connection). Either binds the link before it returns or the link reads nothing.
///
/// Bounds on what anyone who can reach the port can hold:
/// - every connection must finish the preamble within `preamble_ms`;
/// - at most `max_pending` inbound connections in the preamble, `max_per_source` from one
///   address; beyond either, the oldest pending one in that scope is reset. An honest preamble
///   takes two round trips, so the oldest is the idle, slow or stuck one; refusing newcomers
///   instead would let idle sockets lock an honest peer out. Each source is capped below the
///   total, so one address cannot evict another's connections;
/// - the gate reads exactly the current fixed-size frame, never more: no length field to
///   inflate, and no byte of the channel is consumed by the preamble;
/// - at most 64 accepts per wake-up; when accept() runs out of descriptors the oldest pending
///   connection is evicted or the listener paused for 200 ms (left armed, it would spin);
/// - rejected sockets are reset (SO_LINGER 0), so a flood leaves no TIME_WAIT behind;
/// - at most `max_dials` outbound preambles at once.

#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "core/auth.hpp"
#include "transport/channels/peer_link.hpp"

namespace ferry {

class peer_gate {
 public:
  struct limits {
    uint32_t max_pending = 64;
    uint32_t max_per_source = 8;
    uint32_t max_dials = 32;
    uint32_t preamble_ms = 3000;
  };
  /// What the gate did, for logs and tests.
  struct counters {
    std::atomic<uint64_t> accepted{0}, garbage{0}, refused{0}, timed_out{0}, peer_closed{0},
        evicted{0}, admitted{0}, dials_ok{0}, dials_failed{0}, accept_paused{0}, links_open{0};
  };
  /// An inbound connection that passed the preamble, as a link to bind. Runs on the gate
  /// thread: keep it short.
  using admit_fn = std::function<void(const peer_link_ptr& link)>;
  /// Outbound result: a link (to bind) or none and `error`; `reset`: the peer reset
  /// or closed the connection in the middle of the preamble, which is what its gate does to a
  /// pending connection it evicts under a flood (worth another dial). Runs on the gate thread,
  /// on the resolver's for a name that does not resolve, or on the caller's when the dial fails
  /// at once.
  using dial_fn =
      std::function<void(const peer_link_ptr& link, const std::string& error, bool reset)>;

  /// `node` is this daemon's name, `secrets` its cluster secrets (empty: none). With `log`, the
  /// gate reports refused preambles (at most one line a second) and, every 10 s at most, how many
  /// connections it reset as garbage, late or evicted, so a flood cannot flood the log too.
  peer_gate(std::string node, cluster_secrets secrets, limits lim,
            std::shared_ptr<spdlog::logger> log = nullptr);
  ~peer_gate();
  peer_gate(const peer_gate&) = delete;
  peer_gate& operator=(const peer_gate&) = delete;

  /// Bind and listen on host:port (before start()); an error text, empty on success.
  std::string listen(const std::string& host, uint16_t port, admit_fn on_admit);
  /// The bound port (after listen()).
  uint16_t port() const { return port_; }
  /// Start the gate thread (dials work without a listener too).
  void start();
  /// Stop the thread, reset every socket still in the preamble, close every link, fail queued
  /// dials, drop the callbacks (they hold actor handles, which must not outlive the actor
  /// system); later dials fail at once. Idempotent.
  void stop();
  /// Connect to host:port (a numeric address or a name) and run the preamble; `done` gets the
  /// socket or the reason. Thread-safe, and never waits: a name is resolved on a thread of its
  /// own (os/name_resolver.hpp).
  void dial(const std::string& host, uint16_t port, dial_fn done);

  const counters& stats() const { return stats_; }

 private:
  struct impl;
  void run();
  /// Queue a dial to a resolved address for the gate thread (or refuse it at once).
  void queue_dial(const sockaddr_storage& addr, socklen_t len, dial_fn done);
  std::unique_ptr<impl> impl_;
  std::thread thread_;
  uint16_t port_ = 0;
  counters stats_;
};

}  // namespace ferry
