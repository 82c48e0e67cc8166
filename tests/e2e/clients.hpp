#pragma once
// What the e2e tests do as clients of the daemons: a prefill and a decode daemon with one client
// each, the steps of a room (stage, prepare, send, wait, verify), and a connection that speaks
// raw frames.

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "daemons.hpp"
#include "ferry/client.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::test {

using namespace std::chrono_literals;

/// A prefill and a decode daemon with one connected client each; both start at once.
struct pair {
  temp_dir dir;
  shape s;
  daemon_proc prefill;
  daemon_proc decode;
  std::unique_ptr<client::client> p;  // prefill client
  std::unique_ptr<client::client> d;  // decode client

  explicit pair(shape sh = {}) : pair(sh, sh) {}
  /// The decode with its own shape (e.g. its own environment).
  pair(shape sh, const shape& decode_shape)
      : s(sh),
        prefill(launch_only, dir, "prefill-0", "prefill", s),
        decode(launch_only, dir, "decode-0", "decode", decode_shape) {
    await_ready(prefill, decode);
    p = prefill.connect();
    d = decode.connect();
  }
};

/// Everything one room needs; chunks are page counts (the last may be 0).
struct room_spec {
  uint64_t room = 1;
  std::vector<uint32_t> src_pages;
  std::vector<uint32_t> dst_pages;
  std::vector<uint32_t> chunks;  // empty: one chunk with all pages
  uint32_t src_slot = 0, dst_slot = 0;
  uint32_t src_row = 0, dst_row = 0;
  bool checksum = false;  ///< the decode asks for this room to be checked (v10)
};

/// The decode's prepare of a room from `prefill`.
inline proto::prepare prepare_of(const room_spec& r, const std::string& prefill) {
  proto::prepare p{r.room, {prefill}, r.dst_pages, r.dst_slot, r.dst_row};
  p.checksum = r.checksum;
  return p;
}

inline std::vector<uint32_t> range(uint32_t first, uint32_t count) {
  std::vector<uint32_t> v(count);
  for (uint32_t i = 0; i < count; ++i) v[i] = first + i;
  return v;
}

/// Fill the source and clear the destination of a room.
inline void stage(pair& c, const room_spec& r) {
  REQUIRE(client::fill_kv(*c.p, r.room, r.src_pages, 0).message == "");
  REQUIRE(client::fill_state_and_aux(*c.p, r.room, r.src_slot, r.src_row).message == "");
  REQUIRE(client::clear_room(*c.d, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

inline void prepare(pair& c, const room_spec& r) {
  auto ok = c.d->prepare(prepare_of(r, c.prefill.control()));
  INFO(ok.message);
  REQUIRE(ok);
}

inline void send_chunks(pair& c, const room_spec& r) {
  auto chunks = r.chunks.empty() ? std::vector<uint32_t>{static_cast<uint32_t>(r.src_pages.size())}
                                 : r.chunks;
  uint32_t pos = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const bool last = i + 1 == chunks.size();
    std::vector<uint32_t> pages(r.src_pages.begin() + pos, r.src_pages.begin() + pos + chunks[i]);
    pos += chunks[i];
    auto ok =
        c.p->send({r.room, pages, last, last ? r.src_slot : no_index, last ? r.src_row : no_index});
    INFO(ok.message);
    REQUIRE(ok);
  }
}

/// The same steps with explicit clients, for tests with more than one pair of daemons.
inline void stage(client::client& p, client::client& d, const room_spec& r) {
  REQUIRE(client::fill_kv(p, r.room, r.src_pages, 0).message == "");
  REQUIRE(client::fill_state_and_aux(p, r.room, r.src_slot, r.src_row).message == "");
  REQUIRE(client::clear_room(d, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

inline void prepare(client::client& d, const std::string& prefill, const room_spec& r) {
  auto ok = d.prepare(prepare_of(r, prefill));
  INFO(ok.message);
  REQUIRE(ok);
}

/// Send chunk `k` of the room's chunks (the last one carries the slot and the row).
inline void send_chunk(client::client& p, const room_spec& r, size_t k) {
  uint32_t pos = 0;
  for (size_t i = 0; i < k; ++i) pos += r.chunks[i];
  const bool last = k + 1 == r.chunks.size();
  std::vector<uint32_t> pages(r.src_pages.begin() + pos, r.src_pages.begin() + pos + r.chunks[k]);
  auto ok =
      p.send({r.room, pages, last, last ? r.src_slot : no_index, last ? r.src_row : no_index});
  INFO("room " << r.room << " chunk " << k << ": " << ok.message);
  REQUIRE(ok);
}

inline void send_rest(client::client& p, const room_spec& r, size_t from) {
  for (size_t k = from; k < r.chunks.size(); ++k) send_chunk(p, r, k);
}

/// After a fenced peer resumed: the room that reused its pages holds exactly its own bytes.
/// The fence closed the peer's keys and cut its fabric connection before its room reported
/// Failed, so nothing of the old room may land, not even the rest of a write it had begun to
/// send (docs/reliability.md section 4).
inline void check_exact_after_fence(client::client& d, const room_spec& r) {
  CHECK(client::verify_room(d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

/// A client connection that speaks raw frames, so the test sees every frame with its seq.
class raw_conn {
 public:
  explicit raw_conn(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~raw_conn() { close(fd_); }

  void send_frame(const proto::message& m, uint32_t seq) { send_raw(proto::encode(m, seq)); }
  void send_raw(const std::vector<uint8_t>& f) {
    REQUIRE(::send(fd_, f.data(), f.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(f.size()));
  }

  /// True once the daemon closed the connection (bounded wait; frames still unread are
  /// discarded).
  bool closed_by_peer(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    uint8_t buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      auto n = recv(fd_, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EINTR && errno != EAGAIN)) return true;
    }
    return false;
  }

  /// The next frame (bounded wait).
  proto::decoded next(std::chrono::milliseconds timeout = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    uint8_t buf[65536];
    for (;;) {
      if (auto d = reader_.next()) return *d;
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      REQUIRE(left.count() > 0);
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      auto n = recv(fd_, buf, sizeof(buf), 0);
      REQUIRE(n > 0);
      reader_.feed(std::span<const uint8_t>(buf, static_cast<size_t>(n)));
    }
  }

 private:
  int fd_ = -1;
  proto::frame_reader reader_;
};

/// Wait for the room's terminal status on one daemon (subscribe + bounded wait).
inline proto::event wait_done(client::client& c, uint64_t room) {
  auto s = c.subscribe(room);
  INFO(s.message);
  REQUIRE(s);
  auto e = c.wait_terminal(room, 60s);
  INFO(e.message);
  REQUIRE(e);
  return e.value;
}

/// Cancel the room through `by` and check it failed on both sides: `by` says "cancelled by
/// client", `other` that its peer reported it.
inline void cancel_and_check(client::client& by, client::client& other, uint64_t room) {
  REQUIRE(by.cancel(room));
  auto own = wait_done(by, room);
  CHECK(own.status == room_status::failed);
  CHECK(own.reason == "cancelled by client");
  auto far = wait_done(other, room);
  CHECK(far.status == room_status::failed);
  CHECK_THAT(far.reason, Catch::Contains("reported: cancelled by client"));
}

/// Subscribe and wait (bounded) until the room reaches at least `status` or fails; the event.
inline proto::event wait_for_status_or_end(client::client& c, uint64_t room, room_status status) {
  c.discard_events(room);  // the subscription pushes the current status first
  auto s = c.subscribe(room);
  INFO(s.message);
  REQUIRE(s);
  for (;;) {
    auto e = c.next_event(30s);
    INFO(e.message);
    REQUIRE(e);
    if (e.value.room != room) continue;
    if (e.value.status == room_status::failed || e.value.status >= status) return e.value;
  }
}

/// Subscribe and wait (bounded) until the room reaches at least `status` on that daemon.
inline void wait_status(client::client& c, uint64_t room, room_status status) {
  auto e = wait_for_status_or_end(c, room, status);
  INFO(e.reason);
  REQUIRE(e.status != room_status::failed);
}

/// Run a room end to end between two clients (the decode naming `peer`) and check the statuses
/// on both sides and every destination byte.
inline void run_and_verify(client::client& p, client::client& d, const std::string& peer,
                           const room_spec& r) {
  stage(p, d, r);
  prepare(d, peer, r);
  send_rest(p, r, 0);
  auto de = wait_done(d, r.room);
  INFO(de.reason);
  REQUIRE(de.status == room_status::success);
  auto pe = wait_done(p, r.room);
  INFO(pe.reason);
  REQUIRE(pe.status == room_status::success);
  CHECK(client::verify_room(d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

/// Send a prepared room's chunks, then check statuses on both sides and every destination byte.
inline void send_and_verify(pair& c, const room_spec& r) {
  send_chunks(c, r);
  auto de = wait_done(*c.d, r.room);
  INFO(de.reason);
  REQUIRE(de.status == room_status::success);
  auto pe = wait_done(*c.p, r.room);
  INFO(pe.reason);
  REQUIRE(pe.status == room_status::success);
  CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

/// Run a room end to end and check statuses on both sides and every destination byte.
inline void run_and_verify(pair& c, const room_spec& r) {
  stage(c, r);
  prepare(c, r);
  send_and_verify(c, r);
}

}  // namespace ferry::test
