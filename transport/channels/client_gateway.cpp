// transport/channels/client_gateway.hpp: serving the connected clients on the gateway thread.

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
#include <stdexcept>
#include <unordered_map>

#include "transport/channels/client_gateway_impl.hpp"
#include "transport/channels/status_board.hpp"

namespace ferry {

using namespace gateway_keys;

namespace {

/// A request answered on this thread, without the actors: a poll (or poll_many) of rooms in
/// progress (transport/channels/status_board.hpp says why only those).
std::optional<proto::message> answer_here(const status_board& board, const proto::message& m) {
  if (const auto* p = std::get_if<proto::poll>(&m))
    if (auto r = board.poll(p->room)) return proto::message(std::move(*r));
  if (const auto* p = std::get_if<proto::poll_many>(&m))
    if (auto r = board.poll_many(p->rooms)) return proto::message(std::move(*r));
  return std::nullopt;
}

}  // namespace

client_gateway::impl::~impl() {
  for (auto& [id, c] : conns) close(c.fd);
  if (reserve_fd >= 0) close(reserve_fd);
  if (listen_fd >= 0) close(listen_fd);
  if (epoll_fd >= 0) close(epoll_fd);
  if (wake_fd >= 0) close(wake_fd);
  if (!path.empty()) unlink(path.c_str());
}

void client_gateway::impl::add_conn(int fd, std::atomic<size_t>& count) {
  const uint64_t id = next_id++;
  auto& c = conns[id];
  c.fd = fd;
  c.w->fd = fd;
  {
    std::lock_guard g(wires_mutex);
    wires.emplace(id, c.w);
  }
  ++count;
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = id;
  epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  log->debug("client conn={} connected", id);
}

void client_gateway::impl::close_conn(uint64_t id, std::atomic<size_t>& count) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  for (auto& b : it->second.fd_batches)
    for (int fd : b.fds) close(fd);
  {
    std::lock_guard g(wires_mutex);
    wires.erase(id);
  }
  {
    // No answering thread writes to the descriptor from here on.
    std::lock_guard g(it->second.w->m);
    it->second.w->closed = true;
  }
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, it->second.fd, nullptr);
  close(it->second.fd);
  conns.erase(it);
  --count;
  to.gone(client_gone{id});
}

bool client_gateway::impl::write_locked(uint64_t id, wire& w) {
  bool ok = true;
  while (w.out_pos < w.out.size()) {
    ssize_t n = ::send(w.fd, w.out.data() + w.out_pos, w.out.size() - w.out_pos,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      w.out_pos += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      break;
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      ok = false;
      break;
    }
  }
  if (w.out_pos == w.out.size()) {
    w.out.clear();
    w.out_pos = 0;
  }
  const bool want = ok && w.out_pos < w.out.size();
  if (want != w.want_write && !w.closed) {
    w.want_write = want;
    epoll_event ev{};
    ev.events = want ? (EPOLLIN | EPOLLOUT) : EPOLLIN;
    ev.data.u64 = id;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, w.fd, &ev);
  }
  return ok;
}

void client_gateway::impl::send_locked(uint64_t id, wire& w, const proto::message& m,
                                       uint32_t seq) {
  if (w.closed || w.dropped) return;
  auto frame = encode_for(w.version, m, seq);
  w.out.insert(w.out.end(), frame.begin(), frame.end());
  if (w.out.size() - w.out_pos > max_output_bytes) {
    log->warn("client conn={} is not reading its replies; disconnecting", id);
    w.dropped = true;
    ::shutdown(w.fd, SHUT_RDWR);  // the gateway thread sees the hang-up and closes it
    return;
  }
  // Nothing waits before it: write it now, from this thread. Otherwise the gateway thread
  // writes it behind the rest when the socket drains. A failure shows as the socket's hang-up.
  if (!w.want_write && !write_locked(id, w)) ::shutdown(w.fd, SHUT_RDWR);
}

bool client_gateway::impl::flush(uint64_t id, connection& c) {
  std::lock_guard g(c.w->m);
  if (c.w->dropped) return false;
  return write_locked(id, *c.w);
}

bool client_gateway::impl::has_output(const connection& c) {
  std::lock_guard g(c.w->m);
  return c.w->out_pos < c.w->out.size();
}

/// At a stop: what actors answered before it (the outcome of the last room of a drain, say)
/// still reaches its client. Bounded: a client that does not read within `limit` loses the
/// rest with its connection.
void client_gateway::impl::deliver_before_close(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  std::vector<pollfd> waiting;
  for (;;) {
    waiting.clear();
    for (auto& [id, c] : conns)
      if (has_output(c) && flush(id, c) && has_output(c)) waiting.push_back({c.fd, POLLOUT, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    if (waiting.empty() || left <= 0) return;
    if (::poll(waiting.data(), waiting.size(), static_cast<int>(left)) < 0 && errno != EINTR)
      return;
  }
}

/// The session rules of docs/protocol.md: hello first, once, in a version both sides speak
/// (which the connection then keeps). Returns the refusal for a request that breaks them (the
/// request is not served); `close` is set when the connection cannot go on.
std::optional<proto::error> client_gateway::impl::session_error(connection& c,
                                                                const proto::message& m,
                                                                bool& close) {
  const auto* h = std::get_if<proto::hello>(&m);
  if (!h && !c.said_hello)
    return proto::error{errc::invalid_request,
                        fmt::format("{} before hello: hello must be the first request of a "
                                    "connection",
                                    proto::to_string(proto::type_of(m)))};
  if (!h) return std::nullopt;
  if (c.said_hello)
    return proto::error{errc::invalid_request,
                        "a second hello: this connection already said hello"};
  const uint16_t version = proto::negotiate(h->min_version, h->version);
  if (version == 0) {
    close = true;
    return proto::error{errc::unsupported_version,
                        fmt::format("client speaks protocol versions {}..{}, ferryd speaks "
                                    "{}..{}",
                                    h->min_version, h->version, proto::min_protocol_version,
                                    proto::protocol_version)};
  }
  c.said_hello = true;
  c.version = version;
  c.reader.set_version(version);
  std::lock_guard g(c.w->m);
  c.w->version = version;
  return std::nullopt;
}

/// The descriptors of the frame that occupied stream bytes [start, end): those whose read
/// ended inside it, when it is a register_memory asking for exactly that many. Any other
/// descriptor received up to `end` is closed (with a log line): it belongs to no request.
/// A refusal (then every descriptor of the frame is closed and the request is not served).
std::optional<proto::error> client_gateway::impl::take_fds(connection& c, uint64_t start,
                                                           uint64_t end, const proto::decoded& d,
                                                           std::vector<int>& out) {
  const auto* reg = d.msg ? std::get_if<proto::register_memory>(&*d.msg) : nullptr;
  bool truncated = false;
  while (!c.fd_batches.empty() && c.fd_batches.front().end <= end) {
    auto& b = c.fd_batches.front();
    if (reg && b.end > start) {
      out.insert(out.end(), b.fds.begin(), b.fds.end());
      truncated = truncated || b.truncated;
    } else {
      log->warn("a client sent {} file descriptor(s) with a {} frame; closed them", b.fds.size(),
                d.msg ? proto::to_string(proto::type_of(*d.msg)) : "bad");
      for (int fd : b.fds) close(fd);
    }
    c.fd_batches.pop_front();
  }
  if (!reg) return std::nullopt;
  std::optional<proto::error> refusal;
  if (truncated)
    refusal = proto::error{errc::invalid_request,
                           fmt::format("register_memory: more than {} file descriptors came "
                                       "with the frame",
                                       proto::max_register_fds)};
  else if (out.size() != reg->fd_count)
    refusal = proto::error{errc::invalid_request,
                           fmt::format("register_memory: the frame says {} file descriptor(s) "
                                       "but {} came with it (SCM_RIGHTS on its first byte)",
                                       reg->fd_count, out.size())};
  if (refusal) {
    for (int fd : out) close(fd);
    out.clear();
  }
  return refusal;
}

/// recv, also taking the descriptors a client passes with SCM_RIGHTS.
ssize_t client_gateway::impl::receive(connection& c, std::vector<uint8_t>& buf) {
  iovec iov{buf.data(), buf.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * proto::max_register_fds)];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t got = recvmsg(c.fd, &msg, MSG_CMSG_CLOEXEC);
  if (got <= 0) return got;
  connection::fd_batch batch;
  batch.end = c.stream_in + static_cast<uint64_t>(got);
  batch.truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h; h = CMSG_NXTHDR(&msg, h)) {
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    const int* fds = reinterpret_cast<const int*>(CMSG_DATA(h));
    batch.fds.insert(batch.fds.end(), fds, fds + n);
  }
  if (!batch.fds.empty() || batch.truncated) c.fd_batches.push_back(std::move(batch));
  return got;
}

void client_gateway::impl::queue_local(uint64_t id, connection& c, const proto::message& m,
                                       uint32_t seq) {
  std::lock_guard g(c.w->m);
  send_locked(id, *c.w, m, seq);
}

/// A frame in the connection's version (a hello_reply also says which one that is).
std::vector<uint8_t> client_gateway::impl::encode_for(uint16_t version, const proto::message& m,
                                                      uint32_t seq) {
  if (const auto* h = std::get_if<proto::hello_reply>(&m)) {
    auto r = *h;
    r.version = version;
    return proto::encode(r, seq, version);
  }
  return proto::encode(m, seq, version);
}

client_gateway::~client_gateway() { stop(); }

void client_gateway::start(sink to, const status_board* board, request_check check) {
  if (!to.request || !to.gone)
    throw std::invalid_argument("client_gateway::start: the sink needs both callbacks");
  impl_->to = std::move(to);
  impl_->board = board;
  impl_->check = std::move(check);
  thread_ = std::thread([this] { run(); });
}

void client_gateway::stop() {
  if (!impl_ || impl_->stopping.exchange(true)) return;
  uint64_t one = 1;
  [[maybe_unused]] auto n = write(impl_->wake_fd, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
}

void client_gateway::reply(uint64_t conn, uint32_t seq, const proto::message& m) {
  std::shared_ptr<impl::wire> w;
  {
    std::lock_guard g(impl_->wires_mutex);
    auto it = impl_->wires.find(conn);
    if (it == impl_->wires.end()) return;  // gone
    w = it->second;
  }
  // Written by this thread (an actor's worker): no wake-up of the gateway thread on the way.
  std::lock_guard g(w->m);
  impl_->send_locked(conn, *w, m, seq);
}

void client_gateway::run() {
  auto& im = *impl_;
  std::vector<epoll_event> events(64);
  std::vector<uint8_t> rbuf(256 * 1024);
  while (!im.stopping.load()) {
    // Wake up in time for the earliest incomplete-frame deadline, if any.
    int wait_ms = -1;
    const auto now = std::chrono::steady_clock::now();
    for (const auto& [id, c] : im.conns)
      if (c.partial_since) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                              *c.partial_since + im.frame_limit - now)
                              .count();
        const int ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1000));
        wait_ms = wait_ms < 0 ? ms : std::min(wait_ms, ms);
      }
    if (int resume = im.resume_listening(now); resume >= 0)
      wait_ms = wait_ms < 0 ? resume : std::min(wait_ms, resume);
    int n = epoll_wait(im.epoll_fd, events.data(), static_cast<int>(events.size()), wait_ms);
    if (n < 0 && errno == EINTR) continue;
    for (int i = 0; i < n; ++i) {
      const uint64_t key = events[i].data.u64;
      if (key == listen_key) {
        im.accept_clients(conn_count_);
        continue;
      }
      if (key == wake_key) {
        uint64_t v;
        [[maybe_unused]] auto r = read(im.wake_fd, &v, sizeof(v));
        continue;
      }
      auto it = im.conns.find(key);
      if (it == im.conns.end()) continue;
      auto& c = it->second;
      bool close_it = false;
      if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        for (;;) {
          ssize_t got = impl::receive(c, rbuf);
          if (got > 0) {
            c.reader.feed(std::span<const uint8_t>(rbuf.data(), static_cast<size_t>(got)));
            c.stream_in += static_cast<uint64_t>(got);
            if (static_cast<size_t>(got) < rbuf.size()) break;
          } else if (got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            break;
          } else if (got < 0 && errno == EINTR) {
            continue;
          } else {
            close_it = true;
            break;
          }
        }
        for (;;) {
          const uint64_t start = c.stream_in - c.reader.buffered();
          auto d = c.reader.next();
          if (!d) break;
          std::vector<int> fds;
          if (auto refusal = im.take_fds(c, start, c.stream_in - c.reader.buffered(), *d, fds)) {
            im.log->warn("client conn={} {}", key, refusal->message);
            im.queue_local(key, c, *refusal, d->seq);
            continue;
          }
          if (d->msg) {
            bool close_after = false;
            if (auto refusal = im.session_error(c, *d->msg, close_after)) {
              im.log->warn("client conn={} {}", key, refusal->message);
              im.queue_local(key, c, *refusal, d->seq);
              if (close_after) {
                close_it = true;
                break;
              }
              continue;
            }
            if (auto answer = im.board ? answer_here(*im.board, *d->msg) : std::nullopt) {
              im.queue_local(key, c, *answer, d->seq);
              continue;
            }
            if (auto refusal = im.check ? im.check(*d->msg, key) : std::nullopt) {
              im.queue_local(key, c, std::move(*refusal), d->seq);
              continue;
            }
            im.to.request(client_request{key, d->seq, std::move(*d->msg), c.version, std::move(fds),
                                         static_cast<bool>(im.check)});
            continue;
          }
          im.log->warn("client conn={} sent a bad frame: {}", key, d->error);
          im.queue_local(key, c, proto::error{d->code, d->error}, d->seq);
          if (d->framing_lost) {
            close_it = true;  // framing is lost; tell the client why, then close
            break;
          }
        }
        if (c.reader.buffered() == 0)
          c.partial_since.reset();
        else if (!c.partial_since)
          c.partial_since = std::chrono::steady_clock::now();
      }
      if ((events[i].events & EPOLLOUT) || im.has_output(c)) {
        if (!im.flush(key, c)) close_it = true;
      }
      if (close_it) {
        im.flush(key, c);
        im.log->debug("client conn={} closed", key);
        im.close_conn(key, conn_count_);
      }
    }
    // A frame started but not finished in time: a stalled or slow-loris client. Everyone else
    // was served meanwhile (the socket is non-blocking); this one is told and closed.
    const auto t = std::chrono::steady_clock::now();
    std::vector<uint64_t> stalled;
    for (auto& [id, c] : im.conns)
      if (c.partial_since && t - *c.partial_since >= im.frame_limit) stalled.push_back(id);
    for (auto id : stalled) {
      auto& c = im.conns[id];
      const auto text = fmt::format(
          "incomplete frame: {} bytes received and nothing more for {} ms "
          "(limits.client_frame_ms); closing",
          c.reader.buffered(), im.frame_limit.count());
      im.log->warn("client conn={} {}", id, text);
      im.queue_local(id, c, proto::error{errc::malformed_frame, text}, 0);
      im.flush(id, c);
      im.close_conn(id, conn_count_);
    }
  }
  im.deliver_before_close(std::chrono::milliseconds(1000));
}

}  // namespace ferry
