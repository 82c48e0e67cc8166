#pragma once
/// Resolves peer names (DNS) on threads of its own, so that no actor worker, and not the peer
/// gate's epoll thread, waits on DNS. Numeric addresses never come here (peer_gate::dial parses
/// them at once). Up to `max_threads` lookups run at once (a thread starts when a lookup finds
/// none idle), so a name whose DNS server does not answer holds one thread, not every lookup
/// queued behind it.
///
/// A lookup's answer runs on the resolver thread, under its lock: keep it short (the gate only
/// queues the dial). `stop()` answers every lookup not answered yet with "the daemon is
/// stopping" and returns at once, even while a thread is inside getaddrinfo, which cannot be
/// interrupted: the threads (detached) drop whatever they resolve from then on and touch
/// nothing but the state they share with this object.

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
  static constexpr size_t max_threads = 4;
  /// How a name is looked up: the address, or the reason. getaddrinfo by default; a test gives
  /// one it controls.
  using lookup_fn =
      std::function<bool(const std::string& host, uint16_t port, address& out, std::string& error)>;
  static bool system_lookup(const std::string& host, uint16_t port, address& out,
                            std::string& error);

  explicit name_resolver(lookup_fn lookup = system_lookup);
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
