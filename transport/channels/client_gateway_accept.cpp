// transport/channels/client_gateway.hpp: the listen socket, and admitting new clients.

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <fstream>
#include <optional>
#include <unordered_map>

#include "transport/channels/client_gateway_impl.hpp"

namespace ferry {

using namespace gateway_keys;

namespace {

/// The kernel's limit on a listen backlog (net.core.somaxconn): a burst of engine connects
/// should wait in the backlog, not fail with EAGAIN.
int listen_backlog() {
  std::ifstream f("/proc/sys/net/core/somaxconn");
  int n = 0;
  return f >> n && n > 0 ? n : 4096;
}

}  // namespace

/// Tell a just-accepted connection why it is refused, and close it.
void client_gateway::impl::refuse(int fd, const std::string& why, errc code) {
  auto f = proto::encode(proto::error{code, why}, 0);
  [[maybe_unused]] auto w = ::send(fd, f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  close(fd);
}

/// Accept what the backlog holds (bounded per wake-up, so requests are served in between).
void client_gateway::impl::accept_clients(std::atomic<size_t>& count) {
  for (int n = 0; n < 256; ++n) {
    int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE) return out_of_descriptors(errno);
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        log->error("accepting a client connection failed: {}", std::strerror(errno));
      return;
    }
    if (!admit(fd)) continue;
    if (conns.size() >= max_clients) {
      refuse(fd, fmt::format("too many clients: {} connections already open "
                             "(limits.max_clients)",
                             conns.size()));
      log->warn("client connection refused: {} already open (limits.max_clients)", conns.size());
      continue;
    }
    add_conn(fd, count);
  }
}

/// Whether the process that connected `fd` may use this daemon (the credentials the kernel
/// took at its connect()); one that may not is told why and closed before any byte of it is
/// read. Logged at most every 10 s, with the count since, so a local flood cannot flood the log.
bool client_gateway::impl::admit(int fd) {
  auto peer = credentials_of(fd);
  if (peer && admitted(access, self_uid, peer.value)) return true;
  const auto why = peer ? access_denied_reason(peer.value)
                        : "access denied: the client's credentials cannot be read: " + peer.message;
  ++denied_unlogged;
  const auto now = std::chrono::steady_clock::now();
  if (!last_denied_warning || now - *last_denied_warning >= std::chrono::seconds(10)) {
    log->warn("client connection refused: {}{}", why,
              denied_unlogged > 1
                  ? fmt::format(" ({} refused since the last warning, this one included)",
                                denied_unlogged)
                  : std::string());
    last_denied_warning = now;
    denied_unlogged = 0;
  }
  refuse(fd, why, errc::access_denied);  // after the log line: a test reads it once refused
  return false;
}

/// accept4 failed for want of a descriptor: give up the reserve to accept one connection and
/// refuse it with the reason, or, with no reserve left, stop polling the listen socket for a
/// while. Either way other clients are served on, and the warning is logged at most every 10 s.
void client_gateway::impl::out_of_descriptors(int err) {
  ++fd_refusals;
  const auto now = std::chrono::steady_clock::now();
  const auto why = fmt::format(
      "ferryd is out of file descriptors ({}): this connection is refused; raise the daemon's "
      "descriptor limit (ulimit -n, LimitNOFILE) or lower limits.max_clients",
      std::strerror(err));
  if (now - last_fd_warning >= std::chrono::seconds(10)) {
    log->warn(
        "client connections refused: {} ({} connections open, {} refused since the last "
        "warning)",
        why, conns.size(), fd_refusals);
    last_fd_warning = now;
    fd_refusals = 0;
  }
  if (reserve_fd >= 0) {
    close(reserve_fd);
    reserve_fd = -1;
    if (int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC); fd >= 0)
      refuse(fd, why);
    reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (reserve_fd >= 0) return;
  }
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
  listen_paused_until = now + std::chrono::milliseconds(100);
}

/// Put the listen socket back into epoll once its pause is over; the wait (ms) until then, or
/// -1 when it is not paused.
int client_gateway::impl::resume_listening(std::chrono::steady_clock::time_point now) {
  if (!listen_paused_until) return -1;
  if (now < *listen_paused_until)
    return static_cast<int>(
               std::chrono::duration_cast<std::chrono::milliseconds>(*listen_paused_until - now)
                   .count()) +
           1;
  listen_paused_until.reset();
  if (reserve_fd < 0) reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = listen_key;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, listen_fd, &ev);
  return -1;
}

result<std::shared_ptr<client_gateway>> client_gateway::listen(
    const std::string& path, uint32_t max_clients, uint32_t frame_ms, client_access access,
    std::shared_ptr<spdlog::logger> log) {
  std::shared_ptr<client_gateway> g(new client_gateway());
  g->impl_ = std::make_unique<impl>();
  auto& im = *g->impl_;
  im.max_clients = max_clients;
  im.access = std::move(access);
  im.frame_limit = std::chrono::milliseconds(frame_ms);
  im.log = log ? std::move(log) : spdlog::default_logger();
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) {
    return error{errc::config_invalid, "listen.client: socket path '" + path + "' is too long"};
  }
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  im.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (im.listen_fd < 0) {
    return error{errc::system_error,
                 std::string("socket(AF_UNIX) failed: ") + std::strerror(errno)};
  }
  // A socket file that still accepts connections belongs to a running process (another ferryd
  // whose config names the same path): replacing it would cut that daemon off its clients.
  if (int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0); probe >= 0) {
    const bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    close(probe);
    if (live) {
      return error{errc::system_error,
                   "listen.client '" + path +
                       "' is in use: another process accepts connections on it (a second ferryd?)"};
    }
  }
  unlink(path.c_str());  // a stale socket file of a daemon that is gone
  // Created for the daemon's user alone; share_socket_file then opens it as far as
  // security.client_users and client_groups need (core/access.hpp).
  mode_t old = umask(0077);
  int rc = bind(im.listen_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  umask(old);
  if (rc != 0) {
    return error{errc::system_error,
                 "cannot bind client socket '" + path + "': " + std::strerror(errno)};
  }
  im.path = path;
  if (auto shared = share_socket_file(im.access, path); !shared) return shared.error();
  if (::listen(im.listen_fd, listen_backlog()) != 0) {
    return error{errc::system_error,
                 "cannot listen on client socket '" + path + "': " + std::strerror(errno)};
  }
  im.reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  im.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  im.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = listen_key;
  epoll_ctl(im.epoll_fd, EPOLL_CTL_ADD, im.listen_fd, &ev);
  ev.data.u64 = wake_key;
  epoll_ctl(im.epoll_fd, EPOLL_CTL_ADD, im.wake_fd, &ev);
  return g;
}

}  // namespace ferry
