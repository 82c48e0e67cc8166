#include <netdb.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "transport/channels/peer_gate_impl.hpp"

namespace ferry {

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
    r.done(nullptr, "the daemon is stopping", false);
  }
  std::vector<int> fds;
  for (const auto& [fd, c] : impl_->conns) fds.push_back(fd);
  for (const int fd : fds) impl_->drop(fd, "the daemon is stopping");
  fds.clear();
  for (const auto& [fd, l] : impl_->links) fds.push_back(fd);
  for (const int fd : fds) impl_->forget_link(fd);
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
                             return done(nullptr, error, false);
                           }
                           queue_dial(a->addr, a->len, std::move(done));
                         });
    return;
  }
  if (rc != 0) {
    ++stats_.dials_failed;
    return done(nullptr, "cannot resolve " + host + ": " + gai_strerror(rc), false);
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
    return done(nullptr, refused, false);
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
      if (auto l = m.links.find(fd); l != m.links.end()) {
        if (!l->second->on_event(evs[i].events)) m.forget_link(fd);
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
