#include "actors/peer_link.hpp"

#include <fmt/format.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace ferry {

namespace {
/// Per wake-up: at most this many reads of a link, so one busy peer cannot starve the others.
constexpr int reads_per_event = 16;
constexpr size_t read_chunk = 64u << 10;
}  // namespace

peer_link::peer_link(int fd, int epoll_fd, std::string peer_node, std::string source,
                     peer_wire::link_keys keys, size_t max_unsent)
    : fd_(fd),
      epoll_fd_(epoll_fd),
      peer_node_(std::move(peer_node)),
      source_(std::move(source)),
      max_unsent_(max_unsent),
      writer_(std::move(keys.send)),
      reader_(std::move(keys.recv)) {}

peer_link::~peer_link() { finish(); }

void peer_link::bind(deliver_fn on_message, closed_fn on_closed, bool one_message) {
  std::lock_guard g(mutex_);
  on_message_ = std::move(on_message);
  on_closed_ = std::move(on_closed);
  one_message_ = one_message;
  if (closed_) {
    // Ended before its owner arrived: the owner learns it now.
    if (on_closed_ && !closed_here_) on_closed_(reason_);
    return;
  }
  paused_ = false;
  parse_locked();
  update_events_locked();
}

bool peer_link::send(const peer_wire::message& m) {
  std::lock_guard g(mutex_);
  if (closed_) return false;
  writer_.seal(m, out_);
  ++stats_.frames_out;
  if (!write_armed_) {
    flush_locked();
    if (closed_) return false;
    if (write_armed_)
      ++stats_.writes_deferred;
    else
      ++stats_.writes_direct;
  }
  if (out_.size() - out_pos_ > max_unsent_) {
    end_locked(
        fmt::format("the peer left {} bytes of this daemon's messages unread (more than "
                    "{} MiB): it does not read its peer channel",
                    out_.size() - out_pos_, max_unsent_ >> 20));
    return false;
  }
  return true;
}

void peer_link::close(const std::string& why) {
  std::lock_guard g(mutex_);
  if (closed_) return;
  if (!write_armed_) flush_locked();
  closed_ = closed_here_ = true;
  reason_ = why.empty() ? "closed by this daemon" : why;
  on_message_ = nullptr;
  on_closed_ = nullptr;
  // The gate sees the shutdown as a hang-up and closes the descriptor.
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

bool peer_link::closed() const {
  std::lock_guard g(mutex_);
  return closed_;
}

std::string peer_link::reason() const {
  std::lock_guard g(mutex_);
  return reason_;
}

bool peer_link::on_event(uint32_t events) {
  {
    std::lock_guard g(mutex_);
    if (closed_) return false;
    if (events & EPOLLOUT) flush_locked();
    if (closed_) return false;
  }
  const bool hangup = events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
  if (!(events & EPOLLIN) && !hangup) return true;
  uint8_t buf[read_chunk];
  for (int i = 0; i < reads_per_event; ++i) {
    {
      std::lock_guard g(mutex_);
      if (closed_) return false;
      // Paused (awaiting its owner's judgement of a first message): read nothing more; a
      // hang-up then ends the link, which is all a peer that went meanwhile can mean.
      if (paused_) {
        if (hangup) end_locked("the peer closed the connection");
        return !closed_;
      }
    }
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    std::lock_guard g(mutex_);
    if (closed_) return false;
    if (n > 0) {
      stats_.bytes_in += uint64_t(n);
      reader_.feed(buf, size_t(n));
      parse_locked();
      if (size_t(n) < sizeof buf) break;
      continue;
    }
    if (n == 0) {
      end_locked("the peer closed the connection");
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    end_locked(std::string("the peer connection failed: ") + std::strerror(errno));
    return false;
  }
  std::lock_guard g(mutex_);
  return !closed_;
}

void peer_link::finish() {
  std::lock_guard g(mutex_);
  if (fd_ < 0) return;
  if (!closed_) {
    closed_ = closed_here_ = true;
    reason_ = "the daemon is stopping";
  }
  // The owner's callbacks hold actor handles, which must not outlive the actor system.
  on_message_ = nullptr;
  on_closed_ = nullptr;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
  ::close(fd_);
  fd_ = -1;
}

void peer_link::parse_locked() {
  while (!paused_ && !closed_) {
    peer_wire::message m;
    std::string error;
    const auto r = reader_.next(m, error);
    if (r == peer_wire::frame_reader::result_kind::more) return;
    if (r == peer_wire::frame_reader::result_kind::failed)
      return end_locked("the peer sent a frame that does not check: " + error);
    ++stats_.frames_in;
    if (on_message_) on_message_(std::move(m));
    if (one_message_) {
      paused_ = true;
      update_events_locked();
    }
  }
}

void peer_link::flush_locked() {
  while (out_pos_ < out_.size() && fd_ >= 0) {
    const ssize_t n =
        ::send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_pos_ += size_t(n);
      stats_.bytes_out += uint64_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!write_armed_) {
        write_armed_ = true;
        update_events_locked();
      }
      return;
    }
    // The read side reports the connection's end with its reason; nothing more can be sent.
    return end_locked(std::string("the peer connection failed: ") + std::strerror(errno));
  }
  out_.clear();
  out_pos_ = 0;
  if (write_armed_) {
    write_armed_ = false;
    update_events_locked();
  }
}

void peer_link::update_events_locked() {
  if (fd_ < 0 || closed_) return;
  epoll_event ev{};
  ev.data.fd = fd_;
  ev.events =
      EPOLLRDHUP | (paused_ ? 0u : uint32_t{EPOLLIN}) | (write_armed_ ? uint32_t{EPOLLOUT} : 0u);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd_, &ev);
}

void peer_link::end_locked(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  reason_ = why;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  auto tell = std::move(on_closed_);
  on_message_ = nullptr;
  on_closed_ = nullptr;
  if (tell) tell(why);
}

}  // namespace ferry
