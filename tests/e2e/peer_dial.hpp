#pragma once
// A peer of a ferryd written for the tests, independently of the daemon's peer gate and links:
// a blocking TCP socket, Ferry's peer preamble (core/peer_preamble.hpp), then frames of the peer
// channel (core/peer_wire.hpp). It speaks the protocol as a daemon would, and can also break
// it: raw bytes, replayed or reordered frames, frames sealed with the wrong key.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/peer_preamble.hpp"
#include "core/peer_wire.hpp"

namespace ferry::test {

class test_peer {
 public:
  /// Connect to `control` ("127.0.0.1:port") as node `node`, with `secret` (empty: none), and
  /// run the preamble; `error()` says why not (then `ok()` is false).
  test_peer(const std::string& control, const std::string& node, const std::string& secret = {})
      : writer_(bytes{}), reader_(bytes{}) {
    const auto colon = control.rfind(':');
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(control.substr(colon + 1))));
    inet_pton(AF_INET, control.substr(0, colon).c_str(), &a.sin_addr);
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    timeval tv{20, 0};  // a preamble that never completes fails the test, not hangs it
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      error_ = std::string("connect: ") + std::strerror(errno);
      return;
    }
    preamble::dialer d(node, cluster_secrets(secret));
    if (!write_all(d.hello())) return;
    for (;;) {
      std::vector<uint8_t> in(d.want());
      if (in.empty() || !read_exact(in.data(), in.size())) {
        if (error_.empty()) error_ = "the preamble ended early";
        return;
      }
      auto s = d.feed(in.data(), in.size());
      if (!s.out.empty() && !write_all(s.out)) return;
      if (s.next == preamble::outcome::failed) {
        error_ = s.error;
        return;
      }
      if (s.next == preamble::outcome::finished) break;
    }
    keys_ = d.keys();
    writer_ = peer_wire::frame_writer(keys_.send);
    reader_ = peer_wire::frame_reader(keys_.recv);
    ok_ = true;
  }
  ~test_peer() {
    if (fd_ >= 0) ::close(fd_);
  }
  test_peer(const test_peer&) = delete;
  test_peer& operator=(const test_peer&) = delete;

  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }
  const peer_wire::link_keys& keys() const { return keys_; }

  /// The frame of `m`, sealed with this side's key and next sequence number (not sent).
  std::vector<uint8_t> seal(const peer_wire::message& m) {
    std::vector<uint8_t> f;
    writer_.seal(m, f);
    return f;
  }
  bool send(const peer_wire::message& m) { return write_all(seal(m)); }
  bool send_raw(const std::vector<uint8_t>& bytes) { return write_all(bytes); }

  /// The next message within `timeout`, skipping heartbeats; none on timeout, on the daemon's
  /// close (then `closed()`), or on a frame that does not check (`error()`).
  std::optional<peer_wire::message> receive(std::chrono::milliseconds timeout,
                                            bool skip_heartbeats = true) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      peer_wire::message m;
      std::string e;
      const auto r = reader_.next(m, e);
      if (r == peer_wire::frame_reader::result_kind::failed) {
        error_ = e;
        return std::nullopt;
      }
      if (r == peer_wire::frame_reader::result_kind::message) {
        if (skip_heartbeats && std::holds_alternative<peer_heartbeat>(m)) continue;
        return m;
      }
      if (!wait_readable(deadline)) return std::nullopt;
      uint8_t buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        closed_ = true;
        return std::nullopt;
      }
      reader_.feed(buf, size_t(n));
    }
  }
  /// The next message of type T within `timeout` (others are skipped), or none.
  template <class T>
  std::optional<T> receive_a(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      auto m = receive(std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now()));
      if (!m) return std::nullopt;
      if (auto* x = std::get_if<T>(&*m)) return *x;
    }
    return std::nullopt;
  }
  /// Whether the daemon closed the connection within `timeout` (what arrives before is read and
  /// dropped).
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!closed_ && std::chrono::steady_clock::now() < deadline) {
      if (!wait_readable(deadline)) break;
      uint8_t buf[65536];
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) closed_ = true;
    }
    return closed_;
  }
  bool closed() const { return closed_; }

 private:
  bool wait_readable(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) return false;
    pollfd p{fd_, POLLIN, 0};
    return ::poll(&p, 1, static_cast<int>(left)) > 0;
  }
  bool write_all(const std::vector<uint8_t>& b) {
    size_t off = 0;
    while (off < b.size()) {
      const ssize_t n = ::send(fd_, b.data() + off, b.size() - off, MSG_NOSIGNAL);
      if (n <= 0) {
        error_ = std::string("send: ") + std::strerror(errno);
        return false;
      }
      off += size_t(n);
    }
    return true;
  }
  bool read_exact(uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t r = ::recv(fd_, p, n, 0);
      if (r <= 0) return false;
      p += r;
      n -= size_t(r);
    }
    return true;
  }

  int fd_ = -1;
  bool ok_ = false, closed_ = false;
  std::string error_;
  peer_wire::link_keys keys_;
  peer_wire::frame_writer writer_;
  peer_wire::frame_reader reader_;
};

}  // namespace ferry::test
