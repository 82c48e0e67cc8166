// Client protocol version 4 against real daemons (docs/protocol.md, "Versions"): version
// negotiation, error codes on every Failed poll and event, poll_many, and a prefill's
// Bootstrapping for rooms it has not seen yet. Version 3 clients keep their semantics.

#include <thread>
#include <vector>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

TEST_CASE(
    "protocol: a client speaking 3..10 gets 10, a 3..5 client gets 5, a 3..4 client gets 4, a v3 "
    "client gets 3, a range above ours is refused and closed",
    "[e2e][protocol]") {
  temp_dir dir;
  shape s;
  daemon_proc decode(dir, "decode-0", "decode", s);
  auto c10 = decode.connect();
  CHECK(c10->version() == 10);
  CHECK(c10->daemon().min_version == 3);
  CHECK(c10->daemon().max_version == 10);
  // A checked room (v10) on a v9 connection is refused by the client: an older daemon would
  // not check it, and its Success would claim what was not proven.
  auto c9 = decode.connect(9);
  CHECK(c9->version() == 9);
  proto::prepare checked{9, {"127.0.0.1:1"}, {1}, 0, 0};
  checked.checksum = true;
  auto unchecked = c9->prepare(checked);
  CHECK(unchecked.code == errc::unsupported_version);
  CHECK(unchecked.message == "a checked room needs protocol version 10; this connection speaks 9");
  // Shard units (v9) on a v8 connection are refused by the client before anything is sent: an
  // older daemon would slice the groups every rank holds whole.
  auto c8 = decode.connect(8);
  CHECK(c8->version() == 8);
  proto::register_memory units;
  units.pool = pool_kind::state;
  units.buffers = {{0, 0, 64, 1, 0, 0, buffer_kind::state, 8, 0, 1, {8, 4, 4}, {8, 1, 1}}};
  auto refused = c8->register_memory(units, {});
  CHECK(refused.code == errc::unsupported_version);
  CHECK(refused.message == "shard units need protocol version 9; this connection speaks 8");
  auto c5 = decode.connect(5);
  CHECK(c5->version() == 5);
  // A layer range on a v5 connection is refused by the client before it is sent: the daemon
  // would read it as a whole send.
  auto ranged = c5->send({9, {1}, false, no_index, no_index, 3, 1});
  CHECK(ranged.code == errc::unsupported_version);
  CHECK(ranged.message == "a layer range needs protocol version 6; this connection speaks 5");
  auto piped = c5->pipeline({proto::send{9, {1}, false, no_index, no_index, 3, 1}});
  REQUIRE(piped.size() == 1);
  CHECK(piped[0].code == errc::unsupported_version);
  // So are a paged state pool's pages (v8), which an older encoding would drop.
  proto::send paged{9, {1}, true, no_index, no_index};
  paged.state_pages = {4};
  auto dropped = c5->send(paged);
  CHECK(dropped.code == errc::unsupported_version);
  CHECK(dropped.message == "state pages need protocol version 8; this connection speaks 5");
  auto c4 = decode.connect(4);
  CHECK(c4->version() == 4);
  CHECK(c4->daemon().max_version == 10);
  // A v5 request on a v4 connection is refused by the client before it is sent.
  CHECK(c4->drain().code == errc::unsupported_version);
  auto c3 = decode.connect(3);
  CHECK(c3->version() == 3);

  raw_conn raw(decode.socket());
  raw.send_frame(proto::hello{12, "future", true, 11}, 1);
  auto d = raw.next();
  REQUIRE(d.msg);
  auto* e = std::get_if<proto::error>(&*d.msg);
  REQUIRE(e);
  CHECK(d.seq == 1);
  CHECK(e->code == errc::unsupported_version);
  CHECK(e->message == "client speaks protocol versions 11..12, ferryd speaks 3..10");
  CHECK(raw.closed_by_peer());
  // The daemon serves on.
  CHECK(c4->poll_many({}).value.empty());
}

TEST_CASE(
    "protocol v4: Failed polls and events carry the error code, and v3 gets the same reason "
    "without it",
    "[e2e][protocol]") {
  pair c;
  auto d3 = c.decode.connect(3);
  room_spec r;
  r.room = 700;
  r.src_pages = range(0, 4);
  r.dst_pages = range(10, 4);
  stage(c, r);
  prepare(c, r);
  REQUIRE(c.d->subscribe(r.room));
  REQUIRE(c.d->cancel(r.room));
  auto ev = c.d->wait_terminal(r.room, 30s);
  REQUIRE(ev);
  CHECK(ev.value.status == room_status::failed);
  CHECK(ev.value.code == errc::cancelled);
  CHECK(ev.value.reason == "cancelled by client");
  auto p4 = c.d->poll(r.room);
  REQUIRE(p4);
  CHECK(p4.value.code == errc::cancelled);
  auto p3 = d3->poll(r.room);
  REQUIRE(p3);
  CHECK(p3.value.status == room_status::failed);
  CHECK(p3.value.code == errc::ok);  // not on the v3 wire
  CHECK(p3.value.reason == "cancelled by client");

  // A room whose prefill is gone: peer_lost on both the event and the poll.
  room_spec r2;
  r2.room = 701;
  r2.src_pages = range(0, 4);
  r2.dst_pages = range(20, 4);
  stage(c, r2);
  prepare(c, r2);
  wait_status(*c.d, r2.room, room_status::waiting_for_input);
  c.prefill.signal(SIGKILL);
  auto lost = wait_done(*c.d, r2.room);
  INFO(lost.reason);
  CHECK(lost.status == room_status::failed);
  CHECK(lost.code == errc::peer_lost);
  CHECK(c.d->poll(r2.room).value.code == errc::peer_lost);
}

TEST_CASE("protocol v4: a prepare naming an unreachable prefill fails with peer_unreachable",
          "[e2e][protocol]") {
  temp_dir dir;
  shape s;
  daemon_proc decode(dir, "decode-0", "decode", s);
  auto d = decode.connect();
  const auto nobody = "127.0.0.1:" + std::to_string(free_port());
  REQUIRE(d->prepare({702, {nobody}, range(0, 2), 1, 1}));
  auto ev = wait_done(*d, 702);
  INFO(ev.reason);
  CHECK(ev.status == room_status::failed);
  CHECK(ev.code == errc::peer_unreachable);
}

TEST_CASE("protocol v4: poll_many answers 1000 rooms in one round trip, in order",
          "[e2e][protocol]") {
  temp_dir dir;
  shape s;
  s.pages = 4096;
  s.slots = 1024;
  s.aux_rows = 1024;
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  await_ready(decode, prefill);
  auto d = decode.connect();
  std::vector<uint64_t> rooms;
  for (uint32_t i = 0; i < 1000; ++i) {
    const uint64_t room = 10000 + i;
    REQUIRE(d->prepare({room, {prefill.control()}, {i}, i, i}));
    rooms.push_back(room);
  }
  REQUIRE(d->cancel(10001));
  rooms.push_back(424242);  // never seen on this decode
  // The cancelled room's Failed must be settled before the batch is compared with single polls.
  REQUIRE(d->subscribe(10001));
  REQUIRE(d->wait_terminal(10001, 30s));
  auto all = d->poll_many(rooms);
  INFO(all.message);
  REQUIRE(all);
  REQUIRE(all.value.size() == rooms.size());
  for (size_t i = 0; i < 1000; ++i) {
    CHECK(all.value[i].room == rooms[i]);
    // A single poll afterwards: the same room, a status at least as far (they only advance).
    auto one = d->poll(rooms[i]);
    REQUIRE(one);
    if (i == 1) continue;
    CHECK((all.value[i].status == room_status::bootstrapping ||
           all.value[i].status == room_status::waiting_for_input));
    CHECK(all.value[i].status <= one.value.status);
    CHECK(all.value[i].code == errc::ok);
  }
  CHECK(all.value[1].status == room_status::failed);
  CHECK(all.value[1].code == errc::cancelled);
  CHECK(all.value[1000].status == room_status::failed);
  CHECK(all.value[1000].code == errc::unknown_room);
  CHECK(all.value[1000].reason == "unknown room 424242");
  // A v3 connection cannot ask it.
  auto d3 = decode.connect(3);
  auto refused = d3->poll_many({10000});
  CHECK_FALSE(refused);
  CHECK(refused.code == errc::unsupported_version);
}

TEST_CASE(
    "protocol v4: a prefill answers Bootstrapping for a room it has not seen, until the "
    "bootstrapping deadline",
    "[e2e][protocol]") {
  temp_dir dir;
  shape s;
  s.bootstrapping_ms = 300;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  auto p = prefill.connect();
  auto first = p->poll(900);
  REQUIRE(first);
  CHECK(first.value.status == room_status::bootstrapping);
  CHECK(first.value.code == errc::ok);
  // v3 keeps its answer: the room is unknown.
  auto p3 = prefill.connect(3);
  auto old = p3->poll(900);
  CHECK_FALSE(old);
  CHECK(old.code == errc::unknown_room);

  // The decode's prepare arrives: the room is real and goes on (no deadline from the polls).
  auto d = decode.connect();
  room_spec r;
  r.room = 901;
  r.src_pages = range(0, 4);
  r.dst_pages = range(0, 4);
  r.chunks = {4};
  CHECK(p->poll(901).value.status == room_status::bootstrapping);
  REQUIRE(client::fill_kv(*p, r.room, r.src_pages, 0).message == "");
  REQUIRE(client::fill_state_and_aux(*p, r.room, r.src_slot, r.src_row).message == "");
  REQUIRE(client::clear_room(*d, r.dst_pages, r.dst_slot, r.dst_row).message == "");
  prepare(*d, prefill.control(), r);
  send_rest(*p, r, 0);
  auto done = wait_done(*d, r.room);
  INFO(done.reason);
  REQUIRE(done.status == room_status::success);
  CHECK(wait_done(*p, r.room).status == room_status::success);
  CHECK(p->poll(901).value.status == room_status::success);

  // Room 900 never came: once the deadline has passed since its first poll, it is Failed.
  // Polled again until then (bounded: the deadline is 300 ms).
  proto::poll_reply late;
  const auto until = std::chrono::steady_clock::now() + 10s;
  do {
    auto x = p->poll(900);
    REQUIRE(x);
    late = x.value;
  } while (late.status == room_status::bootstrapping && std::chrono::steady_clock::now() < until);
  CHECK(late.status == room_status::failed);
  CHECK(late.code == errc::timed_out);
  CHECK(late.reason ==
        "timed out in Bootstrapping after 300 ms: no prepare from a decode and no send arrived "
        "(timeouts.bootstrapping_ms)");
}

TEST_CASE(
    "protocol v4: the decode's prefix_tokens reaches the prefill's poll and events, and one that "
    "is not whole pages is refused",
    "[e2e][protocol]") {
  temp_dir dir;
  shape s;
  s.page_tokens = 16;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  auto p = prefill.connect();
  auto d = decode.connect();
  room_spec r;
  r.room = 950;
  r.src_pages = range(0, 3);
  r.dst_pages = range(20, 3);
  r.chunks = {3};
  REQUIRE(client::fill_kv(*p, r.room, r.src_pages, 0).message == "");
  REQUIRE(client::fill_state_and_aux(*p, r.room, r.src_slot, r.src_row).message == "");

  auto bad = d->prepare({r.room, {prefill.control()}, r.dst_pages, r.dst_slot, r.dst_row, 40});
  CHECK_FALSE(bad);
  CHECK(bad.code == errc::invalid_request);
  CHECK(bad.message ==
        "room 950: prefix_tokens 40 is not a multiple of the page size 16 (pools.kv.page_tokens)");

  CHECK(p->poll(r.room).value.prefix_tokens == 0);  // Bootstrapping: no prepare yet
  auto ok = d->prepare({r.room, {prefill.control()}, r.dst_pages, r.dst_slot, r.dst_row, 64});
  INFO(ok.message);
  REQUIRE(ok);
  proto::poll_reply got;  // polled until the prepare has reached the prefill (bounded)
  const auto until = std::chrono::steady_clock::now() + 30s;
  do {
    auto x = p->poll(r.room);
    REQUIRE(x);
    got = x.value;
  } while (got.status == room_status::bootstrapping && std::chrono::steady_clock::now() < until);
  CHECK(got.status == room_status::waiting_for_input);
  CHECK(got.prefix_tokens == 64);
  CHECK(d->poll(r.room).value.prefix_tokens == 0);  // only the prefill answers it
  REQUIRE(p->subscribe(r.room));
  send_rest(*p, r, 0);
  auto done = p->wait_terminal(r.room, 30s);
  REQUIRE(done);
  CHECK(done.value.status == room_status::success);
  CHECK(done.value.prefix_tokens == 64);
  CHECK(p->poll(r.room).value.prefix_tokens == 64);  // kept with the finished room
  CHECK(wait_done(*d, r.room).status == room_status::success);
  CHECK(client::verify_room(*d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

namespace {

/// A ferryd that speaks only version 3, on a real unix socket: it refuses a hello above v3 with
/// `refusal` (as such a daemon does) and answers a v3 hello in v3. It takes up to `connections`
/// connections, one hello each, and records the versions offered; bounded: it stops waiting
/// for a client after 10 s.
class v3_only_daemon {
 public:
  v3_only_daemon(const std::filesystem::path& at, errc refusal, int connections)
      : path(at / "v3.sock") {
    fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0);
    REQUIRE(::listen(fd_, 4) == 0);
    thread_ = std::thread([this, refusal, connections] { serve(refusal, connections); });
  }
  ~v3_only_daemon() {
    if (thread_.joinable()) thread_.join();
    ::close(fd_);
  }
  /// The versions the client's hellos offered, once it is done.
  std::vector<uint16_t> offered() {
    thread_.join();
    return offered_;
  }
  const std::filesystem::path path;

 private:
  void serve(errc refusal, int connections) {
    for (int i = 0; i < connections; ++i) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 10000) != 1) return;
      const int c = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      proto::frame_reader r;
      std::optional<proto::decoded> d;
      uint8_t buf[4096];
      while (!(d = r.next())) {
        pollfd q{c, POLLIN, 0};
        const ssize_t n = ::poll(&q, 1, 10000) == 1 ? ::recv(c, buf, sizeof(buf), 0) : 0;
        if (n <= 0) break;
        r.feed({buf, static_cast<size_t>(n)});
      }
      const auto* h = d && d->msg ? std::get_if<proto::hello>(&*d->msg) : nullptr;
      offered_.push_back(h ? h->version : 0);
      std::vector<uint8_t> answer;
      if (h && h->version == 3) {
        proto::hello_reply reply;
        reply.version = 3;
        reply.node = "old-daemon";
        answer = proto::encode(reply, d->seq, 3);
      } else {
        answer = proto::encode(proto::error{refusal, "unsupported protocol version"}, 1, 3);
      }
      (void)!::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
      pollfd q{c, POLLIN, 0};  // until the client closes (or 10 s)
      while (::poll(&q, 1, 10000) == 1 && ::recv(c, buf, sizeof(buf), 0) > 0) {
      }
      ::close(c);
    }
  }
  int fd_ = -1;
  std::vector<uint16_t> offered_;
  std::thread thread_;
};

}  // namespace

TEST_CASE(
    "protocol: the C++ client says hello again in version 3 to a daemon that cannot read a v4 "
    "hello, as the Python client does, and not after another refusal",
    "[e2e][protocol]") {
  for (errc refusal : {errc::unsupported_version, errc::malformed_frame}) {
    INFO(to_string(refusal));
    temp_dir dir;
    v3_only_daemon old(dir.path, refusal, 2);
    {
      auto c = client::client::connect(old.path, "fallback", std::chrono::seconds(10));
      REQUIRE(c);
      CHECK(c.value->version() == 3);
      CHECK(c.value->daemon().node == "old-daemon");
    }
    CHECK(old.offered() == std::vector<uint16_t>{10, 3});
  }
  temp_dir dir;
  v3_only_daemon denying(dir.path, errc::access_denied, 1);
  auto c = client::client::connect(denying.path, "fallback", std::chrono::seconds(10));
  CHECK(c.code == errc::access_denied);
  CHECK(c.message == "unsupported protocol version");
  CHECK(denying.offered() == std::vector<uint16_t>{10});
}
