// Unauthenticated input on a real prefill's peer port (listen.control), issue 9 item 5: random
// bytes, BASP headers claiming a 4 GiB payload, idle and half-open connections, and floods past
// the per-source and total limits of connections in the preamble. Meanwhile and afterwards a
// real decode handshakes with the prefill and rooms move byte-exact; the daemon closes every
// hostile connection itself, and exits 0 on SIGTERM in the middle of a flood.
// Source addresses other than 127.0.0.1 are other loopback addresses (all of 127/8 is local).

#include <arpa/inet.h>
#include <fmt/format.h>

#include <atomic>
#include <random>
#include <regex>
#include <thread>

#include "harness.hpp"
#include "peer_dial.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

using clock_type = std::chrono::steady_clock;

/// TCP connections the test holds open; closed on destruction.
struct sockets {
  std::vector<int> fds;
  ~sockets() {
    for (int fd : fds) close(fd);
  }
  /// Connect to 127.0.0.1:port from the loopback address `from` (bounded: 10 s).
  int open(const std::string& from, uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    fds.push_back(fd);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    sockaddr_in src{};
    src.sin_family = AF_INET;
    REQUIRE(inet_pton(AF_INET, from.c_str(), &src.sin_addr) == 1);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) == 0);
    sockaddr_in dst{};
    dst.sin_family = AF_INET;
    dst.sin_port = htons(port);
    dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    INFO("connect from " << from << ": " << std::strerror(errno));
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&dst), sizeof dst) == 0);
    return fd;
  }
  /// Send all of `data` (the daemon may already have reset the connection: that is fine).
  static void send_all(int fd, const std::vector<uint8_t>& data) {
    size_t off = 0;
    while (off < data.size()) {
      auto n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += size_t(n);
    }
  }
  /// How many of these connections the daemon has closed (EOF or reset) by `deadline`; what
  /// it sent first (a refusal frame) is read and dropped.
  size_t closed_by_daemon(clock_type::time_point deadline) {
    std::vector<bool> closed(fds.size(), false);
    size_t count = 0;
    while (count < fds.size() && clock_type::now() < deadline) {
      std::vector<pollfd> p;
      std::vector<size_t> which;
      for (size_t i = 0; i < fds.size(); ++i)
        if (!closed[i]) {
          p.push_back({fds[i], POLLIN, 0});
          which.push_back(i);
        }
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      if (::poll(p.data(), p.size(), static_cast<int>(std::max<int64_t>(left.count(), 1))) <= 0)
        continue;
      for (size_t k = 0; k < p.size(); ++k) {
        if (!p[k].revents) continue;
        uint8_t buf[512];
        auto n = recv(p[k].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
          closed[which[k]] = true;
          ++count;
        }
      }
    }
    return count;
  }
};

/// A room of 64 pages in 32 runs, in two chunks.
room_spec room(uint64_t id) {
  room_spec r;
  r.room = id;
  for (uint32_t i = 0; i < 32; ++i) {
    r.src_pages.push_back(100 + 3 * i);
    r.src_pages.push_back(101 + 3 * i);
    r.dst_pages.push_back(3000 - 2 * i);
    r.dst_pages.push_back(3001 - 2 * i);
  }
  r.chunks = {32, 32};
  r.src_slot = 2, r.dst_slot = 3;
  r.src_row = 4, r.dst_row = 5;
  return r;
}

/// A BASP header (CAF 0.17, 32 bytes, big-endian) claiming a payload of 0xFFFFFFFF bytes:
/// operation 1 (client handshake) or 2 (direct message to actor 1).
std::vector<uint8_t> huge_basp_header(bool direct) {
  std::vector<uint8_t> h(32, 0);
  h[0] = direct ? 2 : 1;
  h[4] = h[5] = h[6] = h[7] = 0xff;
  if (direct) h[31] = 1;
  return h;
}

/// The first `n` bytes of a well-formed HELLO (no secret, node "slow-peer").
std::vector<uint8_t> partial_hello(size_t n) {
  std::vector<uint8_t> h(176, 0);
  std::memcpy(h.data(), "FERRY-PP\x00\x02H", 11);
  std::memcpy(h.data() + 44, "slow-peer", 9);
  h.resize(n);
  return h;
}

/// The gate's counters from the daemon's last "peer port:" log line.
struct gate_counts {
  uint64_t accepted = 0, admitted = 0, garbage = 0, refused = 0, timed_out = 0, evicted = 0;
};
gate_counts counts_in(const std::string& log) {
  static const std::regex line(
      R"(peer port: (\d+) connections accepted, (\d+) admitted, (\d+) not a preamble, (\d+) )"
      R"(refused, (\d+) timed out, (\d+) evicted)");
  gate_counts c;
  for (auto it = std::sregex_iterator(log.begin(), log.end(), line); it != std::sregex_iterator();
       ++it) {
    const auto& m = *it;
    c = {std::stoull(m[1]), std::stoull(m[2]), std::stoull(m[3]),
         std::stoull(m[4]), std::stoull(m[5]), std::stoull(m[6])};
  }
  return c;
}

/// A relay on 127.0.0.1 in front of a daemon's peer port. It resets the first `resets`
/// connections once their first bytes arrived (what a flooded peer's gate does to a pending
/// preamble it evicts), then relays the next one both ways until it ends or the relay stops.
class resetting_relay {
 public:
  resetting_relay(uint16_t target, int resets) : target_(target), resets_(resets) {
    thread_ = std::thread([this] { run(); });
  }
  ~resetting_relay() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return listener_.port; }
  int resets_done() const { return done_.load(); }

 private:
  /// Wait (at most 100 ms, so a stop is seen) for `fd` to be readable.
  bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 100) > 0;
  }
  void run() {
    while (!stop_) {
      if (!readable(listener_.fd)) continue;
      const int c = accept4(listener_.fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      if (done_ < resets_) {
        for (int i = 0; i < 50 && !stop_ && !readable(c); ++i) {
        }
        uint8_t buf[256];
        [[maybe_unused]] auto n = recv(c, buf, sizeof buf, MSG_DONTWAIT);
        linger l{1, 0};
        setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        close(c);
        ++done_;
        continue;
      }
      relay(c);
      close(c);
    }
  }
  void relay(int c) {
    sockets up;
    const int u = up.open("127.0.0.1", target_);
    uint8_t buf[65536];
    while (!stop_) {
      pollfd p[2] = {{c, POLLIN, 0}, {u, POLLIN, 0}};
      if (::poll(p, 2, 100) <= 0) continue;
      for (int k = 0; k < 2; ++k) {
        if (!p[k].revents) continue;
        const auto n = recv(p[k].fd, buf, sizeof buf, 0);
        if (n <= 0) return;
        sockets::send_all(p[1 - k].fd, std::vector<uint8_t>(buf, buf + n));
      }
    }
  }
  uint16_t target_;
  int resets_;
  held_port listener_{16};
  std::atomic<bool> stop_{false};
  std::atomic<int> done_{0};
  std::thread thread_;
};

}  // namespace

TEST_CASE("a decode whose preamble is reset mid-way dials again up to a bound",
          "[e2e][security][peer-port]") {
  // A prefill under a flood from the decode's own address (or from many) evicts the oldest
  // pending preambles; the decode's Connection dials again (at most 6 dials, within
  // timeouts.handshake_ms) rather than fail the room at the first reset.
  temp_dir dir;
  shape s;
  daemon_proc p(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc d(launch_only, dir, "decode-0", "decode", s);
  await_ready(p, d);
  auto cp = p.connect();
  auto cd = d.connect();
  SECTION("two resets: the third dial gets through and the room is byte-exact") {
    resetting_relay relay(p.control_port(), 2);
    run_and_verify(*cp, *cd, "127.0.0.1:" + std::to_string(relay.port()), room(9101));
    CHECK(relay.resets_done() == 2);
    CHECK_THAT(d.log_text(), Catch::Contains("dial 2 of 6: ") && Catch::Contains("dialing again"));
  }
  SECTION("reset at every dial: the room fails with the reason after 6 dials") {
    resetting_relay relay(p.control_port(), 100);
    const auto peer = "127.0.0.1:" + std::to_string(relay.port());
    room_spec r = room(9102);
    stage(*cp, *cd, r);
    prepare(*cd, peer, r);
    auto de = wait_done(*cd, r.room);
    CHECK(de.status == room_status::failed);
    CHECK_THAT(de.reason, Catch::StartsWith("could not use peer " + peer + ": cannot connect to " +
                                            peer + ": ") &&
                              Catch::Contains("during the peer preamble"));
    CHECK(relay.resets_done() == 6);
  }
  // And the decode still serves: a room straight to the prefill.
  run_and_verify(*cp, *cd, p.control(), room(9103));
}

TEST_CASE("unauthenticated input on the peer port does not impair the daemon",
          "[e2e][security][peer-port]") {
  temp_dir secrets;
  const auto secret_path = (secrets.path / "secret").string();
  const std::string secret_text = "correct horse battery staple";
  std::ofstream(secret_path) << secret_text << "\n";
  REQUIRE(chmod(secret_path.c_str(), 0600) == 0);
  shape s;
  std::string secret;
  SECTION("with a cluster secret") {
    s.secret_file = secret_path;
    secret = secret_text;
  }
  SECTION("without a cluster secret") {}
  temp_dir dir;
  daemon_proc p(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc d(launch_only, dir, "decode-0", "decode", s);
  await_ready(p, d);
  auto cp = p.connect();
  auto cd = d.connect();
  const auto port = p.control_port();

  // Held open while the room below runs: idle connections past the per-source limit (8) from
  // one address, past the total limit (64) from 25 more, and preambles that stop halfway.
  sockets idle_one_source, idle_many_sources, half_open;
  for (int i = 0; i < 20; ++i) idle_one_source.open("127.0.0.2", port);
  for (int i = 0; i < 100; ++i) idle_many_sources.open(fmt::format("127.0.1.{}", 1 + i % 25), port);
  for (int i = 0; i < 10; ++i) {
    const int fd = half_open.open("127.0.0.3", port);
    sockets::send_all(fd, partial_hello(100));
    if (i % 2) shutdown(fd, SHUT_WR);  // half-closed: the daemon reads its end of file
  }
  // 50 connections of 1-4096 random bytes and 50 BASP headers claiming 4 GiB payloads.
  sockets garbage, huge;
  std::mt19937 rng(9005);
  for (int i = 0; i < 50; ++i) {
    std::vector<uint8_t> bytes(1 + rng() % 4096);
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    sockets::send_all(garbage.open("127.0.0.4", port), bytes);
    sockets::send_all(huge.open("127.0.0.5", port), huge_basp_header(i % 2));
  }

  // A real decode handshakes with the prefill meanwhile; the room is byte-exact.
  run_and_verify(*cp, *cd, p.control(), room(9001));

  // The daemon closed every hostile connection itself: garbage and huge headers at once,
  // idle ones by eviction or the preamble deadline (limits.peer_preamble_ms, 3000 ms).
  const auto deadline = clock_type::now() + 15s;
  CHECK(garbage.closed_by_daemon(deadline) == 50);
  CHECK(huge.closed_by_daemon(deadline) == 50);
  CHECK(half_open.closed_by_daemon(deadline) == 10);
  CHECK(idle_one_source.closed_by_daemon(deadline) == 20);
  CHECK(idle_many_sources.closed_by_daemon(deadline) == 100);

  {
    // What reaches the port without the preamble, or with the wrong secret, is refused with
    // a reason, and never reaches the channel.
    test_peer intruder(p.control(), "intruder");
    if (secret.empty()) {
      // Without a secret the preamble is a filter, not a lock: whoever speaks it reaches the
      // channel (docs/reliability.md section 7; configure security.cluster_secret_file).
      CHECK(intruder.ok());
      CHECK(intruder.error() == "");
    } else {
      CHECK_FALSE(intruder.ok());
      CHECK_THAT(intruder.error(),
                 Catch::Contains("peer refused the preamble: this daemon requires "
                                 "peers to prove the cluster secret"));
    }
    test_peer wrong(p.control(), "intruder", "a wrong secret, 16+ bytes");
    CHECK_FALSE(wrong.ok());
    if (secret.empty())
      CHECK_THAT(wrong.error(), Catch::Contains("peer refused the preamble: the peer requires a "
                                                "cluster secret but this daemon has none"));
    else
      CHECK(wrong.error() == "peer failed the cluster-secret challenge (different secrets?)");
  }

  // Afterwards: a second room on the same connection, and a new decode daemon's first
  // handshake.
  run_and_verify(*cp, *cd, p.control(), room(9002));
  daemon_proc d2(dir, "decode-1", "decode", s);
  auto cd2 = d2.connect();
  run_and_verify(*cp, *cd2, p.control(), room(9003));

  // SIGTERM in the middle of a flood: pending preambles do not hold the daemon up.
  sockets last;
  for (int i = 0; i < 40; ++i) last.open(fmt::format("127.0.2.{}", 1 + i % 10), port);
  for (int i = 0; i < 10; ++i) sockets::send_all(last.open("127.0.0.6", port), huge_basp_header(1));
  cp.reset();
  REQUIRE(p.stop() == 0);
  const auto c = counts_in(p.log_text());
  INFO(p.log_text().substr(p.log_text().size() > 4000 ? p.log_text().size() - 4000 : 0));
  CHECK(c.accepted >= 230);
  // Which connection ends how depends on the order the gate sees them in (garbage still unread
  // may be evicted by the total limit first); that each one ended is checked above.
  CHECK(c.garbage >= 1);
  CHECK(c.evicted >= 12);  // at least the 20 idle ones from one source over its limit of 8
  CHECK(c.timed_out >= 1);
  CHECK(c.admitted >= 2);  // the two decodes (and the intruder without a secret)
}
