// No actor worker waits on the network or the fabric (docs/architecture.md, threads): with one
// worker (runtime.workers: 1) and a connect to a black-holed address pending, a thousand rooms to
// a live peer all commit, byte-exact, while that connect is still pending. A worker held by the
// connect, or by a memory registration or an address insertion waiting on the progress thread,
// would stall them all.
//
// The black hole is a loopback listener whose accept queue is full and which never accepts:
// Linux drops a SYN to such a listener, so the connect neither succeeds nor fails until the
// handshake deadline (here two minutes).

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// A loopback port whose SYNs go unanswered.
class black_hole {
 public:
  black_hole() {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(listener_ >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    REQUIRE(::listen(listener_, 0) == 0);  // room for one connection in the accept queue
    socklen_t len = sizeof a;
    REQUIRE(::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    // Fill the queue: once this connect returns, the connection waits there, never accepted.
    filler_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(::connect(filler_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    // A listener's tcpi_unacked is its accept queue's length, tcpi_sacked the queue's limit.
    tcp_info info{};
    socklen_t il = sizeof info;
    REQUIRE(::getsockopt(listener_, IPPROTO_TCP, TCP_INFO, &info, &il) == 0);
    REQUIRE(info.tcpi_unacked > info.tcpi_sacked);  // full: the next SYN is dropped
  }
  ~black_hole() {
    close(filler_);
    close(listener_);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int listener_ = -1, filler_ = -1;
  uint16_t port_ = 0;
};

}  // namespace

TEST_CASE(
    "one actor worker: a connect to a black-holed peer pending, 1000 rooms to a live peer all "
    "commit byte-exact",
    "[e2e][workers]") {
  shape s;
  s.pages = 64;
  s.kv_layers = 2;
  s.mamba_layers = 1;
  s.temporal_heads = 2;
  shape ds = s;
  ds.workers = 1;
  // Every bound the stuck room or its connect could reach is far beyond the test's length, so
  // the check below cannot race the clock however slow the machine is.
  ds.handshake_ms = 120000;
  ds.bootstrapping_ms = 120000;
  ds.transfer_ms = 600000;
  ds.peer_preamble_ms = 600000;
  pair c(s, ds);
  CHECK_THAT(c.decode.log_text(), Catch::Contains("actor workers: 1"));

  black_hole hole;
  constexpr uint64_t stuck = 1;
  auto ok = c.d->prepare({stuck, {hole.address()}, range(60, 4), 7, 63});
  INFO(ok.message);
  REQUIRE(ok);

  for (uint64_t i = 0; i < 1000; ++i) {
    room_spec r;
    r.room = 1000 + i;
    r.src_pages = range(static_cast<uint32_t>(i % 8) * 4, 4);
    r.dst_pages = range(static_cast<uint32_t>((i + 3) % 8) * 4, 4);
    r.src_slot = static_cast<uint32_t>(i % 4);
    r.dst_slot = static_cast<uint32_t>(i % 4);
    r.src_row = r.dst_row = static_cast<uint32_t>(i % 32);
    run_and_verify(c, r);
  }

  // The connect is still pending: the room that needs it has neither failed nor moved on.
  auto p = c.d->poll(stuck);
  INFO(p.message << " / " << p.value.reason);
  REQUIRE(p);
  CHECK(p.value.status == room_status::bootstrapping);
  REQUIRE(c.d->cancel(stuck));
  const auto end = wait_for_status_or_end(*c.d, stuck, room_status::success);
  CHECK(end.status == room_status::failed);
  CHECK(end.code == errc::cancelled);
}
