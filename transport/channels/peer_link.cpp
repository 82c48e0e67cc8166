#include "transport/channels/peer_link.hpp"

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
/// Sent bytes at the front of the output are dropped once they are this many and half of it.
constexpr size_t compact_after = 1u << 20;
}  // namespace

/// What a locked section ends or replaces: the owner's callbacks hold actor handles, whose
/// last release may end an actor whose state closes this link, so they are told and destroyed
/// only after the link's mutex is released (declare before the lock).
struct peer_link::graveyard {
  closed_fn tell;  ///< the owner, told `why` that the link ended
  std::string why;
  deliver_fn message;
  closed_fn closed;
  ~graveyard() {
    if (tell) tell(why);
  }
};

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
  graveyard dead;
  std::lock_guard g(mutex_);
  dead.message = std::exchange(on_message_, std::move(on_message));
  dead.closed = std::exchange(on_closed_, std::move(on_closed));
  one_message_ = one_message;
  // Judged from its header: while a first message is awaited, only a hello may come.
  reader_.only(one_message ? std::optional(peer_wire::kind::hello) : std::nullopt);
  if (closed_) {
    // Ended before its owner arrived: the owner learns it now.
    if (!closed_here_) dead.tell = std::exchange(on_closed_, nullptr), dead.why = reason_;
    return;
  }
  paused_ = false;
  parse_locked(dead);
  update_events_locked();
}

bool peer_link::send(const peer_wire::message& m) {
  graveyard dead;
  std::lock_guard g(mutex_);
  if (closed_) return false;
  writer_.seal(m, out_);
  if (!write_armed_) {
    flush_locked(dead);
    if (closed_) return false;
  }
  if (out_.size() - out_pos_ > max_unsent_) {
    end_locked(fmt::format("the peer left {} bytes of this daemon's messages unread (more than "
                           "{} MiB): it does not read its peer channel",
                           out_.size() - out_pos_, max_unsent_ >> 20),
               dead);
    return false;
  }
  return true;
}

void peer_link::close(const std::string& why) {
  graveyard dead;
  std::lock_guard g(mutex_);
  if (closed_) return;
  closed_ = closed_here_ = true;
  closed_at_ = std::chrono::steady_clock::now();
  reason_ = why.empty() ? "closed by this daemon" : why;
  dead.message = std::exchange(on_message_, nullptr);  // not told: it asked
  dead.closed = std::exchange(on_closed_, nullptr);
  // What is queued still goes (a refusal, an outcome), then the end of the stream; the gate
  // reads until the peer closes too (or `linger` passes), so no reset discards it.
  if (!write_armed_) flush_locked(dead);
  if (out_pos_ == out_.size()) shut_write_locked();
  update_events_locked();
}

bool peer_link::closed() const {
  std::lock_guard g(mutex_);
  return closed_;
}

bool peer_link::lingered(std::chrono::steady_clock::time_point now) const {
  std::lock_guard g(mutex_);
  return closed_here_ && fd_ >= 0 && now - closed_at_ > linger;
}

bool peer_link::on_event(uint32_t events) {
  const bool hangup = events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
  {
    graveyard dead;
    std::lock_guard g(mutex_);
    if (closed_ && !closed_here_) return false;
    if (events & EPOLLOUT) flush_locked(dead);
    if (closed_here_) {
      if (out_pos_ == out_.size()) shut_write_locked();
      return !drain_locked();
    }
    if (closed_) return false;
  }
  if (!(events & EPOLLIN) && !hangup) return true;
  uint8_t buf[read_chunk];
  for (int i = 0; i < reads_per_event; ++i) {
    {
      graveyard dead;
      std::lock_guard g(mutex_);
      if (closed_) return closed_here_ && !drain_locked();
      // Paused (awaiting its owner's judgement of a first message): read nothing more; a
      // hang-up then ends the link, which is all a peer that went meanwhile can mean.
      if (paused_) {
        if (hangup) end_locked("the peer closed the connection", dead);
        return !closed_;
      }
    }
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    graveyard dead;
    std::lock_guard g(mutex_);
    if (closed_) return closed_here_;
    if (n > 0) {
      reader_.feed(buf, size_t(n));
      parse_locked(dead);
      if (size_t(n) < sizeof buf) break;
      continue;
    }
    if (n == 0) {
      end_locked("the peer closed the connection", dead);
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) break;
    end_locked(std::string("the peer connection failed: ") + std::strerror(errno), dead);
    return false;
  }
  std::lock_guard g(mutex_);
  return !closed_;
}

void peer_link::finish() {
  graveyard dead;
  std::lock_guard g(mutex_);
  if (fd_ < 0) return;
  if (!closed_) {
    closed_ = closed_here_ = true;
    reason_ = "the daemon is stopping";
  }
  dead.message = std::exchange(on_message_, nullptr);
  dead.closed = std::exchange(on_closed_, nullptr);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd_, nullptr);
  ::close(fd_);
  fd_ = -1;
}

void peer_link::parse_locked(graveyard& dead) {
  while (!paused_ && !closed_) {
    peer_wire::message m;
    std::string error;
    const auto r = reader_.next(m, error);
    if (r == peer_wire::frame_reader::result_kind::more) return;
    if (r == peer_wire::frame_reader::result_kind::failed)
      return end_locked("the peer sent a frame that does not check: " + error, dead);
    ++frames_in_;
    if (on_message_) on_message_(std::move(m));
    if (one_message_) {
      paused_ = true;
      update_events_locked();
    }
  }
}

void peer_link::flush_locked(graveyard& dead) {
  while (out_pos_ < out_.size() && fd_ >= 0) {
    const ssize_t n =
        ::send(fd_, out_.data() + out_pos_, out_.size() - out_pos_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_pos_ += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // A peer that reads slowly but steadily: what it took is dropped from the front, so the
      // output holds only what is unsent (which max_unsent bounds).
      if (out_pos_ >= compact_after && out_pos_ * 2 >= out_.size()) {
        out_.erase(out_.begin(), out_.begin() + static_cast<std::ptrdiff_t>(out_pos_));
        out_pos_ = 0;
      }
      if (!write_armed_) {
        write_armed_ = true;
        update_events_locked();
      }
      return;
    }
    if (closed_here_) {  // closing anyway: what is left cannot go
      out_.clear();
      out_pos_ = 0;
      return;
    }
    return end_locked(std::string("the peer connection failed: ") + std::strerror(errno), dead);
  }
  out_.clear();
  out_pos_ = 0;
  if (write_armed_) {
    write_armed_ = false;
    update_events_locked();
  }
}

void peer_link::shut_write_locked() {
  if (shut_ || fd_ < 0) return;
  shut_ = true;
  ::shutdown(fd_, SHUT_WR);
}

bool peer_link::drain_locked() {
  if (fd_ < 0) return true;
  uint8_t buf[4096];
  for (int i = 0; i < reads_per_event; ++i) {
    const ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) continue;  // after our close, what the peer sends is read and dropped
    if (n < 0 && errno == EINTR) continue;
    return !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));  // end of stream, or failed
  }
  return false;
}

void peer_link::update_events_locked() {
  if (fd_ < 0 || (closed_ && !closed_here_)) return;
  epoll_event ev{};
  ev.data.fd = fd_;
  // Once closed here: read (and drop) until the peer's end, and write what is left.
  const bool read = closed_here_ || !paused_;
  ev.events =
      EPOLLRDHUP | (read ? uint32_t{EPOLLIN} : 0u) | (write_armed_ ? uint32_t{EPOLLOUT} : 0u);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, fd_, &ev);
}

void peer_link::end_locked(const std::string& why, graveyard& dead) {
  if (closed_) return;
  closed_ = true;
  reason_ = why;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
  dead.tell = std::exchange(on_closed_, nullptr);
  dead.why = why;
  dead.message = std::exchange(on_message_, nullptr);
}

}  // namespace ferry
