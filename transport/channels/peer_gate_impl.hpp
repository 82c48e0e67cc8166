#pragma once
// The peer gate's state and what its epoll thread does with each connection (preambles, links,
// deadlines); transport/channels/peer_gate.cpp has the public calls and the loop. Included by that
// file alone.

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

#include "core/peer_preamble.hpp"
#include "os/name_resolver.hpp"
#include "transport/channels/peer_gate.hpp"

namespace ferry {
namespace gate {

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

}  // namespace gate

using namespace gate;  // this file's own helpers, for the gate alone

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
  std::unordered_map<int, peer_link_ptr> links;  // past the preamble
  /// Inbound links whose first message has not arrived: when they must have said hello.
  std::unordered_map<int, clock_type::time_point> hello_due;
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
      if (done) done(nullptr, why, reset);
    }
  }

  /// The preamble is over: the socket becomes a link of the channel, read by this thread.
  void hand_over(conn& c) {
    const std::string node = c.peer_node();
    auto keys = c.in ? c.in->keys() : c.out->keys();
    const bool inbound = c.inbound();
    const std::string source = inbound ? c.source : std::string();
    auto done = std::move(c.done);
    const int fd = release(c.fd);
    auto link = std::make_shared<peer_link>(fd, ep, node, source, std::move(keys));
    // Watched for its end only until its owner binds it (which starts the reading).
    watch(fd, EPOLLRDHUP, EPOLL_CTL_ADD);
    links.emplace(fd, link);
    ++stats->links_open;
    if (inbound) {
      // Links that have not said hello count against limits.max_pending_peers too: over it,
      // the one whose hello is due soonest (the oldest) is closed.
      if (hello_due.size() >= lim.max_pending) {
        auto oldest = std::min_element(hello_due.begin(), hello_due.end(),
                                       [](auto& a, auto& b) { return a.second < b.second; });
        ++stats->evicted;
        links.at(oldest->first)->close("evicted: too many peers past the preamble without a hello");
        hello_due.erase(oldest);
      }
      hello_due[fd] = clock_type::now() + std::chrono::milliseconds(lim.preamble_ms);
      if (log) log->debug("peer port: {} passed the preamble as node {}", source, node);
      ++stats->admitted;
      if (on_admit)
        on_admit(link);
      else
        link->close("the daemon does not take peers");
      return;
    }
    ++stats->dials_ok;
    done(link, {}, false);
  }

  /// The link is over: close its socket and forget it.
  void forget_link(int fd) {
    auto it = links.find(fd);
    if (it == links.end()) return;
    it->second->finish();
    links.erase(it);
    hello_due.erase(fd);
    --stats->links_open;
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
    // Exactly the rest of the current frame, never a byte beyond it (it belongs to the channel).
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
      r.done(nullptr, why, false);
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
    // Links closed here whose peer did not close its end within peer_link::linger.
    std::vector<int> lingering;
    for (const auto& [fd, link] : links)
      if (link->lingered(now)) lingering.push_back(fd);
    for (const int fd : lingering) forget_link(fd);
    // A peer past the preamble has as long again to say hello; an idle authenticated socket
    // holds nothing longer than an idle unauthenticated one.
    for (auto it = hello_due.begin(); it != hello_due.end();) {
      const auto& link = links.at(it->first);
      if (link->frames_in() > 0 || link->closed()) {
        it = hello_due.erase(it);
      } else if (it->second <= now) {
        ++stats->timed_out;
        if (log)
          log->warn(
              "peer port: {} ({}) sent no hello within {} ms of its preamble "
              "(limits.peer_preamble_ms); closed",
              link->source(), link->peer_node(), lim.preamble_ms);
        link->close("no hello within limits.peer_preamble_ms");
        it = hello_due.erase(it);
      } else {
        next = std::min(next, it->second);
        ++it;
      }
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

}  // namespace ferry
