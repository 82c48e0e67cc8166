#pragma once
/// Resolves peer names (DNS) on a thread of its own, so that no actor worker, and not the peer
/// gate's epoll thread, waits on DNS. Numeric addresses never come here (peer_gate::dial parses
/// them at once).
///
/// A lookup's answer runs on the resolver thread, under its lock: keep it short (the gate only
/// queues the dial). `stop()` answers every lookup not answered yet with "the daemon is
/// stopping" and returns at once, even while the thread is inside getaddrinfo, which cannot be
/// interrupted: the thread (detached) drops whatever it resolves from then on and touches
/// nothing but the state it shares with this object. The thread starts with the first lookup.

#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ferry {

class name_resolver {
 public:
  struct address {
    sockaddr_storage addr{};
    socklen_t len = 0;
  };
  /// `addr` set, or null and `error` ("cannot resolve HOST: ..." or "the daemon is stopping").
  using done_fn = std::function<void(const address* addr, const std::string& error)>;

  name_resolver();
  ~name_resolver();
  name_resolver(const name_resolver&) = delete;
  name_resolver& operator=(const name_resolver&) = delete;

  void resolve(std::string host, uint16_t port, done_fn done);
  /// Idempotent; later lookups are answered "the daemon is stopping" at once.
  void stop();

 private:
  struct state;
  std::shared_ptr<state> s_;
};

}  // namespace ferry
