#include "actors/peer_gate.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <vector>

#include "actors/name_resolver.hpp"
#include "core/peer_preamble.hpp"

namespace ferry {
namespace {

using clock_type = std::chrono::steady_clock;
constexpr int max_accepts_per_wake = 64;
constexpr auto accept_pause = std::chrono::milliseconds(200);
// Out of descriptors, a pending connection younger than this is not evicted to make room: the
// listener is paused instead, so a flood cannot evict honest preambles as fast as they start.
constexpr auto min_age_to_evict_for_fd = std::chrono::milliseconds(20);
constexpr auto refusal_log_interval = std::chrono::seconds(1);
constexpr auto summary_log_interval = std::chrono::seconds(10);

/// Reset rather than close: a flood leaves no TIME_WAIT behind.
void reset_close(int fd) {
  linger l{1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  ::close(fd);
}

std::string source_of(const sockaddr_storage& ss) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET)
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(ss).sin_addr, buf, sizeof buf);
  else if (ss.ss_family == AF_INET6)
    inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(ss).sin6_addr, buf, sizeof buf);
  return buf;
}

/// One socket in the preamble, inbound (acceptor) or outbound (dialer).
struct conn {
  int fd = -1;
  bool connecting = false;  // outbound, before the TCP connect completed
  std::optional<preamble::acceptor> in;
  std::optional<preamble::dialer> out;
  std::vector<uint8_t> pending;  // frame being written
  size_t written = 0;
  preamble::outcome after_write = preamble::outcome::reading;
  std::string fail_reason;  // for outcome::failed after the refusal is written
  clock_type::time_point started, deadline;
  std::string source;       // inbound: the remote address
  peer_gate::dial_fn done;  // outbound

  bool inbound() const { return in.has_value(); }
  size_t want() const { return in ? in->want() : out->want(); }
  const std::string& peer_node() const { return in ? in->peer_node() : out->peer_node(); }
};

struct dial_req {
  sockaddr_storage addr{};
  socklen_t len = 0;
  peer_gate::dial_fn done;
};

}  // namespace

struct peer_gate::impl {
  std::string node;
  cluster_secrets secrets;
  limits lim;
  counters* stats = nullptr;
  std::shared_ptr<spdlog::logger> log;
  clock_type::time_point last_refusal_log{}, last_summary{};
  uint64_t refusals_unlogged = 0;
  uint64_t summarised_garbage = 0, summarised_timed_out = 0, summarised_evicted = 0;
  int ep = -1, wake = -1, lfd = -1;
  admit_fn on_admit;
  std::unordered_map<int, conn> conns;
  std::unordered_map<std::string, uint32_t> per_source;
  uint32_t pending_in = 0;
  bool listen_paused = false;
  clock_type::time_point listen_paused_until{};
  std::mutex mutex;
  std::deque<dial_req> dials;    // guarded by mutex
  bool stopping = false;         // guarded by mutex
  uint32_t dials_in_flight = 0;  // guarded by mutex: queued or in the preamble
  name_resolver names;           // peers named by a DNS name

  void watch(int fd, uint32_t events, int op) {
    epoll_event ev{};
    ev.data.fd = fd;
    ev.events = events;
    epoll_ctl(ep, op, fd, &ev);
  }

  void arm(const conn& c) {
    const bool out = c.connecting || c.written < c.pending.size();
    watch(c.fd, (out ? EPOLLOUT : EPOLLIN) | EPOLLRDHUP, EPOLL_CTL_MOD);
  }

  /// Forget the connection without closing its socket; its descriptor.
  int release(int fd) {
    auto it = conns.find(fd);
    epoll_ctl(ep, EPOLL_CTL_DEL, fd, nullptr);
    if (it->second.inbound()) {
      --pending_in;
      auto s = per_source.find(it->second.source);
      if (s != per_source.end() && --s->second == 0) per_source.erase(s);
    } else {
      std::lock_guard g(mutex);
      --dials_in_flight;
    }
    conns.erase(it);
    return fd;
  }

  void drop(int fd, const std::string& why, bool reset = false) {
    auto it = conns.find(fd);
    if (it == conns.end()) return;
    auto done = std::move(it->second.done);
    const bool inbound = it->second.inbound();
    release(fd);
    reset_close(fd);
    if (!inbound) {
      ++stats->dials_failed;
      if (done) done(-1, {}, why, reset);
    }
  }

  void hand_over(conn& c) {
    const std::string node = c.peer_node();
    if (c.inbound()) {
      if (log) log->debug("peer port: {} passed the preamble as node {}", c.source, node);
      const int fd = release(c.fd);
      ++stats->admitted;
      if (on_admit)
        on_admit(fd, node);
      else
        reset_close(fd);
      return;
    }
    auto done = std::move(c.done);
    const int fd = release(c.fd);
    ++stats->dials_ok;
    done(fd, node, {}, false);
  }

  /// A refused preamble is worth a line (a misconfigured peer learns why on its side; this
  /// side's operator should too), but at most one a second.
  void log_refusal(const conn& c, const std::string& why) {
    if (!log) return;
    const auto now = clock_type::now();
    if (now - last_refusal_log < refusal_log_interval) {
      ++refusals_unlogged;
      return;
    }
    last_refusal_log = now;
    const auto& node = c.peer_node();
    log->warn("peer port: refused {} ({}): {}{}", c.source, node.empty() ? "no node name" : node,
              why,
              refusals_unlogged ? " (and " + std::to_string(refusals_unlogged) +
                                      " more refusals since the last such line)"
                                : "");
    refusals_unlogged = 0;
  }

  /// Every 10 s at most: what the gate reset, if anything, since the last summary.
  void log_summary(clock_type::time_point now) {
    if (!log || now - last_summary < summary_log_interval) return;
    last_summary = now;
    const uint64_t g = stats->garbage, t = stats->timed_out, e = stats->evicted;
    if (g == summarised_garbage && t == summarised_timed_out && e == summarised_evicted) return;
    log->warn(
        "peer port: reset {} connections that did not speak the preamble, {} that did not finish "
        "it within {} ms, {} evicted over limits.max_pending_peers(_per_source) (since the last "
        "such line)",
        g - summarised_garbage, t - summarised_timed_out, lim.preamble_ms, e - summarised_evicted);
    summarised_garbage = g;
    summarised_timed_out = t;
    summarised_evicted = e;
  }

  /// Act on a preamble step: write its frame, then go on as it says.
  void apply(conn& c, preamble::step s) {
    if (s.next == preamble::outcome::failed) {
      if (s.garbage && c.inbound()) ++stats->garbage;
      if (!s.garbage && c.inbound()) {
        ++stats->refused;
        log_refusal(c, s.error);
      }
      if (s.out.empty()) return drop(c.fd, s.error);
    }
    c.pending = std::move(s.out);
    c.written = 0;
    c.after_write = s.next;
    c.fail_reason = std::move(s.error);
    flush(c);
  }

  void flush(conn& c) {
    while (c.written < c.pending.size()) {
      const ssize_t n =
          ::send(c.fd, c.pending.data() + c.written, c.pending.size() - c.written, MSG_NOSIGNAL);
      if (n > 0) {
        c.written += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return arm(c);
      return drop(c.fd, "the connection failed during the peer preamble");
    }
    c.pending.clear();
    c.written = 0;
    switch (c.after_write) {
      case preamble::outcome::finished:
        return hand_over(c);
      case preamble::outcome::failed:
        return drop(c.fd, c.fail_reason);
      case preamble::outcome::reading:
        return arm(c);
    }
  }

  void on_readable(conn& c) {
    // Exactly the rest of the current frame, never a byte beyond it (it may belong to BASP).
    uint8_t buf[preamble::challenge_size];
    for (int round = 0; round < 4; ++round) {
      const size_t want = std::min(c.want(), sizeof buf);
      if (want == 0) return;
      const ssize_t n = ::recv(c.fd, buf, want, 0);
      if (n == 0) {
        if (c.inbound()) ++stats->peer_closed;
        return drop(c.fd, "the peer closed the connection during the preamble", true);
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        if (c.inbound()) ++stats->peer_closed;
        const bool reset = errno == ECONNRESET;
        return drop(
            c.fd,
            std::string("the connection failed during the peer preamble: ") + std::strerror(errno),
            reset);
      }
      auto s = c.in ? c.in->feed(buf, size_t(n)) : c.out->feed(buf, size_t(n));
      if (s.next != preamble::outcome::reading || !s.out.empty()) return apply(c, std::move(s));
    }
  }

  /// The oldest inbound connection in the preamble (from `source`, if given), or -1.
  int oldest_inbound(const std::string* source) const {
    int oldest = -1;
    auto t = clock_type::time_point::max();
    for (const auto& [fd, c] : conns)
      if (c.inbound() && c.started < t && (!source || c.source == *source)) {
        t = c.started;
        oldest = fd;
      }
    return oldest;
  }

  void accept_some() {
    for (int i = 0; i < max_accepts_per_wake; ++i) {
      sockaddr_storage ss{};
      socklen_t len = sizeof ss;
      const int fd =
          ::accept4(lfd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          const int oldest = oldest_inbound(nullptr);
          if (oldest >= 0 &&
              conns.at(oldest).started + min_age_to_evict_for_fd < clock_type::now()) {
            ++stats->evicted;
            drop(oldest, "evicted");
            continue;
          }
          ++stats->accept_paused;
          epoll_ctl(ep, EPOLL_CTL_DEL, lfd, nullptr);
          listen_paused = true;
          listen_paused_until = clock_type::now() + accept_pause;
        }
        return;  // EAGAIN, or paused
      }
      ++stats->accepted;
      auto src = source_of(ss);
      const auto found = per_source.find(src);
      const bool source_full = found != per_source.end() && found->second >= lim.max_per_source;
      if (source_full || pending_in >= lim.max_pending) {
        const int oldest = oldest_inbound(source_full ? &src : nullptr);
        if (oldest >= 0) {
          ++stats->evicted;
          drop(oldest, "evicted");
        }
      }
      ++per_source[src];
      ++pending_in;
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      conn c;
      c.fd = fd;
      c.in.emplace(node, secrets);
      c.source = std::move(src);
      c.started = clock_type::now();
      c.deadline = c.started + std::chrono::milliseconds(lim.preamble_ms);
      conns.emplace(fd, std::move(c));
      watch(fd, EPOLLIN | EPOLLRDHUP, EPOLL_CTL_ADD);
    }
  }

  void start_dial(dial_req& r) {
    auto failed = [&](const std::string& why) {
      {
        std::lock_guard g(mutex);
        --dials_in_flight;
      }
      ++stats->dials_failed;
      r.done(-1, {}, why, false);
    };
    const int fd = ::socket(r.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return failed(std::string("socket: ") + std::strerror(errno));
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&r.addr), r.len) < 0 && errno != EINPROGRESS) {
      const auto e = std::string(std::strerror(errno));
      ::close(fd);
      return failed(e);
    }
    conn c;
    c.fd = fd;
    c.connecting = true;
    c.out.emplace(node, secrets);
    c.done = std::move(r.done);
    c.started = clock_type::now();
    c.deadline = c.started + std::chrono::milliseconds(lim.preamble_ms);
    conns.emplace(fd, std::move(c));
    watch(fd, EPOLLOUT | EPOLLRDHUP, EPOLL_CTL_ADD);
  }

  void on_connected(conn& c) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return drop(c.fd, std::strerror(err));
    c.connecting = false;
    preamble::step s;
    s.out = c.out->hello();
    apply(c, std::move(s));
  }

  /// Expire what is due; milliseconds until the next deadline (at most a second).
  int expire() {
    const auto now = clock_type::now();
    auto next = now + std::chrono::seconds(1);
    std::vector<int> due;
    for (const auto& [fd, c] : conns) {
      if (c.deadline <= now)
        due.push_back(fd);
      else
        next = std::min(next, c.deadline);
    }
    for (const int fd : due) {
      if (conns.at(fd).inbound()) ++stats->timed_out;
      drop(fd, "the peer preamble did not complete within " + std::to_string(lim.preamble_ms) +
                   " ms (limits.peer_preamble_ms)");
    }
    if (listen_paused) {
      if (listen_paused_until <= now) {
        watch(lfd, EPOLLIN, EPOLL_CTL_ADD);
        listen_paused = false;
      } else {
        next = std::min(next, listen_paused_until);
      }
    }
    log_summary(now);
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
    return int(std::max<int64_t>(ms, 0) + 1);
  }
};

peer_gate::peer_gate(std::string node, cluster_secrets secrets, limits lim,
                     std::shared_ptr<spdlog::logger> log)
    : impl_(std::make_unique<impl>()) {
  impl_->node = std::move(node);
  impl_->secrets = std::move(secrets);
  impl_->lim = lim;
  impl_->log = std::move(log);
  impl_->last_summary = clock_type::now();
  impl_->stats = &stats_;
  impl_->ep = epoll_create1(EPOLL_CLOEXEC);
  impl_->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  impl_->watch(impl_->wake, EPOLLIN, EPOLL_CTL_ADD);
}

peer_gate::~peer_gate() {
  stop();
  if (impl_->lfd >= 0) ::close(impl_->lfd);
  ::close(impl_->wake);
  ::close(impl_->ep);
}

std::string peer_gate::listen(const std::string& host, uint16_t port, admit_fn on_admit) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const auto service = std::to_string(port);
  const auto where = host + ":" + service;
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res))
    return "cannot resolve " + where + ": " + gai_strerror(rc);
  const int fd = ::socket(res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (fd < 0 || ::bind(fd, res->ai_addr, res->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
    const auto err = std::string(std::strerror(errno));
    if (fd >= 0) ::close(fd);
    freeaddrinfo(res);
    return where + ": " + err;
  }
  freeaddrinfo(res);
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
  port_ = ntohs(ss.ss_family == AF_INET ? reinterpret_cast<sockaddr_in&>(ss).sin_port
                                        : reinterpret_cast<sockaddr_in6&>(ss).sin6_port);
  impl_->lfd = fd;
  impl_->on_admit = std::move(on_admit);
  impl_->watch(fd, EPOLLIN, EPOLL_CTL_ADD);
  return {};
}

void peer_gate::start() {
  thread_ = std::thread([this] { run(); });
}

void peer_gate::stop() {
  impl_->names.stop();  // answers the lookups still pending; none queues a dial after this
  {
    std::lock_guard g(impl_->mutex);
    impl_->stopping = true;
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(impl_->wake, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  std::deque<dial_req> left;
  {
    std::lock_guard g(impl_->mutex);
    left.swap(impl_->dials);
    impl_->dials_in_flight -= static_cast<uint32_t>(left.size());
  }
  for (auto& r : left) {
    ++stats_.dials_failed;
    r.done(-1, {}, "the daemon is stopping", false);
  }
  std::vector<int> fds;
  for (const auto& [fd, c] : impl_->conns) fds.push_back(fd);
  for (const int fd : fds) impl_->drop(fd, "the daemon is stopping");
  impl_->on_admit = nullptr;
}

void peer_gate::dial(const std::string& host, uint16_t port, dial_fn done) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_NUMERICHOST;  // parses, never asks DNS
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc == EAI_NONAME) {
    // A name: resolved on the resolver's thread, whose answer queues the dial.
    impl_->names.resolve(host, port,
                         [this, done = std::move(done)](const name_resolver::address* a,
                                                        const std::string& error) mutable {
                           if (!a) {
                             ++stats_.dials_failed;
                             return done(-1, {}, error, false);
                           }
                           queue_dial(a->addr, a->len, std::move(done));
                         });
    return;
  }
  if (rc != 0) {
    ++stats_.dials_failed;
    return done(-1, {}, "cannot resolve " + host + ": " + gai_strerror(rc), false);
  }
  sockaddr_storage addr{};
  std::memcpy(&addr, res->ai_addr, res->ai_addrlen);
  const socklen_t len = res->ai_addrlen;
  freeaddrinfo(res);
  queue_dial(addr, len, std::move(done));
}

void peer_gate::queue_dial(const sockaddr_storage& addr, socklen_t len, dial_fn done) {
  dial_req r;
  r.addr = addr;
  r.len = len;
  std::string refused;
  {
    std::lock_guard g(impl_->mutex);
    if (impl_->stopping)
      refused = "the daemon is stopping";
    else if (impl_->dials_in_flight >= impl_->lim.max_dials)
      refused = "too many peer connections being set up at once (" +
                std::to_string(impl_->lim.max_dials) + ")";
    if (refused.empty()) {
      r.done = std::move(done);
      impl_->dials.push_back(std::move(r));
      ++impl_->dials_in_flight;
    }
  }
  if (!refused.empty()) {
    ++stats_.dials_failed;
    return done(-1, {}, refused, false);
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(impl_->wake, &one, sizeof one);
}

void peer_gate::run() {
  pthread_setname_np(pthread_self(), "ferry.peergate");
  auto& m = *impl_;
  epoll_event evs[64];
  for (;;) {
    const int n = epoll_wait(m.ep, evs, 64, m.expire());
    if (n < 0 && errno != EINTR) return;
    for (int i = 0; i < std::max(n, 0); ++i) {
      const int fd = evs[i].data.fd;
      if (fd == m.wake) {
        uint64_t v;
        [[maybe_unused]] auto r = ::read(m.wake, &v, sizeof v);
        std::deque<dial_req> take;
        {
          std::lock_guard g(m.mutex);
          if (m.stopping) return;
          take.swap(m.dials);
        }
        for (auto& d : take) m.start_dial(d);
        continue;
      }
      if (fd == m.lfd) {
        m.accept_some();
        continue;
      }
      auto it = m.conns.find(fd);
      if (it == m.conns.end()) continue;  // dropped earlier in this round
      auto& c = it->second;
      const bool writable = evs[i].events & (EPOLLOUT | EPOLLERR | EPOLLHUP);
      if (c.connecting) {
        if (writable) m.on_connected(c);
      } else if (c.written < c.pending.size()) {
        if (writable) m.flush(c);
      } else {
        m.on_readable(c);
      }
    }
  }
}

}  // namespace ferry
