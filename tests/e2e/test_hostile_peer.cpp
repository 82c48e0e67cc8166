// A misbehaving decode peer against a real prefill ferryd: the test process speaks the peer
// protocol itself (the peer preamble, then the peer channel's frames; its own libfabric endpoint
// and registered memory) and sends what a buggy or hostile daemon might: indices outside the
// pools it declared, a staging offset outside its staging region, a config that does not
// validate. The prefill must refuse each with a reason, post no write, and keep serving.
// tests/e2e/test_peer_channel.cpp breaks the channel itself.

#include <fmt/format.h>

#include <cstring>
#include <thread>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "harness.hpp"
#include "peer_dial.hpp"
#include "transport/engine.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// The fake decode: a fabric endpoint with its pools registered (so a wrongly accepted write
/// would really land, and be seen), and the hello a real decode daemon would send.
struct fake_decode {
  std::unique_ptr<transport::engine> engine;
  std::vector<std::vector<uint8_t>> memory;  // per pool kind, then staging
  peer_hello hello;

  fake_decode(const std::string& config_yaml, uint64_t staging_bytes) {
    auto opened = transport::engine::open(transport::engine_config{});  // tcp on 127.0.0.1
    INFO(opened.message);
    REQUIRE(opened);
    engine = std::move(opened.value);
    auto parsed = parse_config_text(config_yaml);
    REQUIRE(parsed);
    const auto& cfg = parsed.value;
    const auto layout = make_layout(cfg.pools);
    hello.node = "evil-decode";
    hello.instance = "0001";
    hello.role = "decode";
    hello.config_yaml = config_yaml;
    hello.compat_hash = compatibility_hash(cfg.pools);
    hello.regions.resize(pool_kind_count);
    for (int k = 0; k < pool_kind_count; ++k) {
      if (!layout.pools[k].present) continue;
      memory.emplace_back(layout.pools[k].total_bytes, 0);
      auto reg = engine->register_region(memory.back().data(), memory.back().size());
      REQUIRE(reg);
      auto d = engine->describe(reg.value);
      hello.regions[k] = {true, d.remote_base, d.key, d.length};
    }
    memory.emplace_back(staging_bytes, 0);
    auto reg = engine->register_region(memory.back().data(), memory.back().size());
    REQUIRE(reg);
    auto d = engine->describe(reg.value);
    hello.staging = {true, d.remote_base, d.key, d.length};
    hello.fabric_address = engine->local_address();
    engine->start([](transport::immediate_counts) {});
  }
  ~fake_decode() { engine->stop(); }

  bool untouched() const {
    for (const auto& m : memory)
      for (auto b : m)
        if (b) return false;
    return true;
  }
};

/// Dial the prefill and complete the handshake as a decode daemon would; the peer, or the
/// refusal reason in `refused`.
std::unique_ptr<test_peer> handshake(const daemon_proc& prefill, const peer_hello& hello,
                                     std::string& refused) {
  auto p = std::make_unique<test_peer>(prefill.control(), hello.node);
  if (!p->ok()) FAIL("cannot reach the prefill: " << p->error());
  REQUIRE(p->send(hello));
  auto answer = p->receive(std::chrono::seconds(20));
  if (!answer) FAIL("no answer to the hello: " << p->error());
  if (auto* r = std::get_if<peer_refused>(&*answer)) {
    refused = r->reason;
    return nullptr;
  }
  REQUIRE(std::holds_alternative<peer_hello>(*answer));
  return p;
}

/// Send a prepare and return the prefill's acknowledgement.
peer_prepare_ack prepare_and_wait(test_peer& peer, peer_prepare p) {
  REQUIRE(peer.send(p));
  auto ack = peer.receive_a<peer_prepare_ack>(std::chrono::seconds(20));
  if (!ack) FAIL("no prepare ack: " << peer.error());
  return *ack;
}

/// A real prefill ferryd, its client, and the fake decode that completed the handshake with it.
struct hostile_pair {
  temp_dir dir;
  shape s;
  daemon_proc prefill{launch_only, dir, "prefill-0", "prefill", s};
  fake_decode evil{make_config("evil-decode", "decode", 1, "/tmp/unused.sock", s),
                   1 << 20};  // while the daemon starts
  std::unique_ptr<client::client> cp;
  std::unique_ptr<test_peer> conn;

  hostile_pair() {
    prefill.await_ready();
    cp = prefill.connect();
    std::string refused;
    conn = handshake(prefill, evil.hello, refused);
    INFO(refused);
    REQUIRE(conn);
  }
  /// Room `id` on source pages 0..3, filled at the prefill.
  room_spec filled_room(uint64_t id) {
    room_spec r;
    r.room = id;
    r.src_pages = range(0, 4);
    REQUIRE(client::fill_kv(*cp, r.room, r.src_pages, 0).message == "");
    REQUIRE(client::fill_state_and_aux(*cp, r.room, r.src_slot, r.src_row).message == "");
    return r;
  }
};

}  // namespace

TEST_CASE("a decode peer naming indices outside its declared pools is refused, nothing written",
          "[e2e][security][hostile]") {
  hostile_pair h;
  const auto& s = h.s;
  auto& cp = h.cp;
  auto& conn = h.conn;
  auto& evil = h.evil;
  // The prefill client already sent the whole room: a wrongly accepted prepare would be
  // written at once.
  const auto r = h.filled_room(801);
  REQUIRE(cp->send({r.room, r.src_pages, true, 0, 0}));

  peer_prepare p;
  p.room = r.room;
  p.token = 77;
  p.dst_pages = {0, 1, 2, s.pages};  // one page past the declared pool
  p.dst_state_slot = 0;
  p.dst_aux_row = 0;
  std::string expect;
  SECTION("a page past the pool") {
    expect = "decode dst page " + std::to_string(s.pages) +
             " (position 3) is outside the pool of " + std::to_string(s.pages) + " pages";
  }
  SECTION("a state slot past the pool") {
    p.dst_pages = {0, 1, 2, 3};
    p.dst_state_slot = s.slots;
    expect = "decode dst state slot " + std::to_string(s.slots) + " is outside its mamba pool";
  }
  SECTION("an aux row past the pool") {
    p.dst_pages = {0, 1, 2, 3};
    p.dst_aux_row = s.aux_rows + 5;
    expect = "decode dst aux row " + std::to_string(s.aux_rows + 5) + " is outside its aux pool";
  }
  SECTION("no state slot for a model with Mamba state") {
    p.dst_pages = {0, 1, 2, 3};
    p.dst_state_slot = no_index;
    expect = "mamba requires single state index: room 801 got dst=none from the decode";
  }
  SECTION("a staging offset outside its staging region") {
    p.dst_pages = {0, 1, 2, 3};
    p.dst_staging = 1 << 30;
    expect = "is outside the decode's staging region";
  }
  auto ack = prepare_and_wait(*conn, p);
  CHECK_FALSE(ack.ok);
  CHECK(ack.token == 77);
  CHECK_THAT(ack.reason, Catch::Contains(expect));
  // Nothing was written into the fake decode's memory, and the prefill still serves.
  CHECK(evil.untouched());
  CHECK(status_of(*cp)["role"] == "prefill");
}

TEST_CASE(
    "a decode peer granting a staging offset outside its staging region fails the room, nothing "
    "written",
    "[e2e][security][hostile]") {
  hostile_pair h;
  auto& cp = h.cp;
  auto& conn = h.conn;
  const auto r = h.filled_room(811);
  // A version-10 prepare whose pages land in the decode's staging at an offset granted later.
  peer_prepare p;
  p.room = r.room;
  p.token = 78;
  p.dst_pages = {0, 1, 2, 3};
  p.dst_state_slot = 0;
  p.dst_aux_row = 0;
  p.dst_staging = staging_on_request;
  auto ack = prepare_and_wait(*conn, p);
  INFO(ack.reason);
  REQUIRE(ack.ok);
  // The send starts the writes: the prefill asks first, and posts nothing before the answer.
  REQUIRE(cp->send({r.room, r.src_pages, true, 0, 0}));
  auto asked = conn->receive_a<peer_staging_request>(std::chrono::seconds(20));
  if (!asked) FAIL("no staging request: " << conn->error());
  CHECK(asked->room == r.room);
  CHECK(asked->token == 78);
  CHECK(h.evil.untouched());
  REQUIRE(conn->send(peer_staging_grant{r.room, 78, uint64_t{1} << 30}));
  auto told = conn->receive_a<peer_outcome>(std::chrono::seconds(20));
  if (!told) FAIL("no outcome: " << conn->error());
  CHECK_FALSE(told->ok);
  CHECK(told->to_decode);
  CHECK_THAT(told->reason, Catch::Contains("room 811: staging offset 1073741824 (") &&
                               Catch::Contains("is outside the decode's staging region of 1048576 "
                                               "bytes"));
  auto e = wait_done(*cp, r.room);
  CHECK(e.status == room_status::failed);
  CHECK(e.code == errc::invalid_request);
  CHECK_THAT(e.reason, Catch::Contains("is outside the decode's staging region"));
  CHECK(h.evil.untouched());
  CHECK(status_of(*cp)["role"] == "prefill");
}

TEST_CASE("a peer whose config does not validate is refused at handshake, and the daemon serves on",
          "[e2e][security][hostile]") {
  temp_dir dir;
  shape s;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  const auto decode_yaml = make_config("evil-decode", "decode", 1, "/tmp/unused.sock", s);
  fake_decode evil(decode_yaml, 1 << 20);  // while the daemon starts
  prefill.await_ready();
  auto cp = prefill.connect();

  auto hello = evil.hello;
  std::string expect;
  SECTION("page size zero") {
    auto y = decode_yaml;
    y.replace(y.find("page_tokens: 1"), 14, "page_tokens: 0");
    hello.config_yaml = y;
    expect = "peer config is invalid: pools.kv.page_tokens";
  }
  SECTION("not YAML") {
    hello.config_yaml = "{{{";
    expect = "peer config could not be read";
  }
  SECTION("protocol versions above ours") {
    hello.version = 99;
    hello.min_version = 98;
    expect = fmt::format("peer speaks protocol versions 98..99, this daemon speaks {}..{}",
                         peer_protocol_min_version, peer_protocol_version);
  }
  SECTION("protocol versions below ours") {
    hello.version = 4;
    hello.min_version = 3;
    expect = fmt::format("peer speaks protocol versions 3..4, this daemon speaks {}..{}",
                         peer_protocol_min_version, peer_protocol_version);
  }
  SECTION("a TP position its config does not have") {
    hello.tp_rank = 3;
    expect = "peer declared a TP/PP position that differs from its config";
  }
  SECTION("fewer memory regions than pools") {
    hello.regions.resize(1);
    expect = "peer sent 1 memory regions, expected 3";
  }
  std::string refused;
  auto conn = handshake(prefill, hello, refused);
  CHECK_FALSE(conn);
  CHECK_THAT(refused, Catch::Contains(expect));
  CHECK(evil.untouched());
  CHECK(status_of(*cp)["role"] == "prefill");
}

namespace {

/// A room between the real prefill and decode, every destination byte checked.
void real_room(client::client& p, client::client& d, const std::string& control, uint64_t id) {
  room_spec r;
  r.room = id;
  r.src_pages = range(0, 4);
  r.dst_pages = range(4, 4);
  r.chunks = {4};
  r.src_slot = 1, r.dst_slot = 2;
  r.src_row = 3, r.dst_row = 4;
  run_and_verify(p, d, control, r);
}

/// Whether the prefill closed `peer`'s connection (bounded: 10 s).
bool cut_off(test_peer& peer) { return peer.closed_within(std::chrono::seconds(10)); }

}  // namespace

TEST_CASE(
    "a peer that passes the preamble and then breaks the channel is cut off, and rooms between "
    "honest daemons stay byte-exact",
    "[e2e][security][hostile][channel]") {
  temp_dir dir;
  shape s;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  const auto decode_yaml = make_config("evil-decode", "decode", 1, "/tmp/unused.sock", s);
  fake_decode evil(decode_yaml, 1 << 20);  // while the daemons start
  await_ready(prefill, decode);
  auto cp = prefill.connect();
  auto cd = decode.connect();
  real_room(*cp, *cd, prefill.control(), 901);

  std::string expect;
  std::unique_ptr<test_peer> peer;
  SECTION("garbage where the first frame belongs") {
    peer = std::make_unique<test_peer>(prefill.control(), "evil-decode");
    REQUIRE(peer->ok());
    std::vector<uint8_t> junk(4096);
    for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 131 + 7);
    peer->send_raw(junk);
    expect =
        "peer port: 127.0.0.1 (evil-decode) ended before its hello: the peer sent a frame "
        "that does not check: peer frame of unknown kind";
  }
  SECTION("a header claiming a 4 GiB body") {
    peer = std::make_unique<test_peer>(prefill.control(), "evil-decode");
    REQUIRE(peer->ok());
    std::vector<uint8_t> h(peer_wire::header_bytes, 0);
    h[0] = h[1] = h[2] = h[3] = 0xff;
    h[4] = static_cast<uint8_t>(peer_wire::kind::hello);
    peer->send_raw(h);
    expect = "claims a body of 4294967295 bytes";
  }
  SECTION("a room message before the hello") {
    peer = std::make_unique<test_peer>(prefill.control(), "evil-decode");
    REQUIRE(peer->ok());
    peer->send(peer_prepare{901, 1, {0}, 0, 0, no_staging, 0});
    // Refused from its header: an inbound link's first frame may only be a hello.
    expect =
        "ended before its hello: the peer sent a frame that does not check: peer frame "
        "peer_prepare where only peer_hello may come";
  }
  SECTION("nothing at all after the preamble") {
    peer = std::make_unique<test_peer>(prefill.control(), "evil-decode");
    REQUIRE(peer->ok());
    expect = "sent no hello within";
  }
  SECTION("after the handshake: a replayed frame") {
    std::string refused;
    peer = handshake(prefill, evil.hello, refused);
    REQUIRE(peer);
    auto f = peer->seal(peer_heartbeat{});
    peer->send_raw(f);
    peer->send_raw(f);
    expect = "replayed or reordered";
  }
  SECTION("after the handshake: frames out of order") {
    std::string refused;
    peer = handshake(prefill, evil.hello, refused);
    REQUIRE(peer);
    auto first = peer->seal(peer_heartbeat{});
    auto second = peer->seal(peer_heartbeat{});
    peer->send_raw(second);
    peer->send_raw(first);
    expect = "replayed or reordered";
  }
  SECTION("after the handshake: a frame sealed with the wrong key") {
    std::string refused;
    peer = handshake(prefill, evil.hello, refused);
    REQUIRE(peer);
    peer_wire::frame_writer wrong(peer->keys().recv);  // the prefill's own direction: reflected
    std::vector<uint8_t> f;
    wrong.seal(peer_heartbeat{}, f);
    wrong.seal(peer_heartbeat{}, f);  // sequence 1, which the prefill expects next
    peer->send_raw(std::vector<uint8_t>(f.begin() + 32, f.end()));
    expect = "failed its MAC check";
  }
  SECTION("after the handshake: a second hello") {
    std::string refused;
    peer = handshake(prefill, evil.hello, refused);
    REQUIRE(peer);
    peer->send(evil.hello);
    expect = "peer sent a second hello";
  }
  INFO(prefill.log_text().substr(prefill.log_text().size() > 3000 ? prefill.log_text().size() - 3000
                                                                  : 0));
  CHECK(cut_off(*peer));
  CHECK(log_shows(prefill, expect));
  // Nothing landed in the hostile peer's memory; the prefill serves honest rooms as before.
  CHECK(evil.untouched());
  real_room(*cp, *cd, prefill.control(), 902);
}

namespace {

/// A HELLO of preamble version 1 (Ferry 0.5 and earlier), no secret, node `node`.
std::vector<uint8_t> hello_v1(const std::string& node) {
  std::vector<uint8_t> h(preamble::hello_size, 0);
  std::memcpy(h.data(), "FERRY-PP\x00\x01H", 11);
  std::memcpy(h.data() + 44, node.data(), node.size());
  return h;
}

}  // namespace

TEST_CASE(
    "a daemon of the release before the peer channel is refused at the preamble on both sides, "
    "naming the versions, and rooms that name it fail with that reason",
    "[e2e][upgrade][channel]") {
  temp_dir dir;
  shape s;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);

  // An old decode dials the new prefill: a CHALLENGE with the version status comes back, and the
  // prefill logs why, with both versions.
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(
        std::stoi(prefill.control().substr(prefill.control().rfind(':') + 1))));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    timeval tv{20, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const auto h = hello_v1("old-decode");
    REQUIRE(::send(fd, h.data(), h.size(), MSG_NOSIGNAL) == ssize_t(h.size()));
    std::vector<uint8_t> c(preamble::challenge_size);
    size_t got = 0;
    while (got < c.size()) {
      const ssize_t n = ::recv(fd, c.data() + got, c.size() - got, 0);
      if (n <= 0) break;
      got += size_t(n);
    }
    ::close(fd);
    REQUIRE(got == c.size());
    CHECK(c[10] == 'C');
    CHECK(c[15] == static_cast<uint8_t>(preamble::status::version));  // big-endian u32 at 12
    CHECK(log_shows(prefill,
                    "peer speaks preamble version 1, this daemon 2 (version 1 is an "
                    "earlier Ferry release, whose daemons talk over CAF's BASP"));
  }

  // The new decode dials an old prefill, which answers as 0.5 did: its own version, 1, and the
  // version status. The decode's room fails naming both versions.
  held_port old(4);
  std::thread old_prefill([&] {
    const int c = ::accept4(old.fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    timeval tv{20, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::vector<uint8_t> in(preamble::hello_size);
    size_t got = 0;
    while (got < in.size()) {
      const ssize_t n = ::recv(c, in.data() + got, in.size() - got, 0);
      if (n <= 0) break;
      got += size_t(n);
    }
    std::vector<uint8_t> refusal(preamble::challenge_size, 0);
    std::memcpy(refusal.data(),
                "FERRY-PP\x00\x01"
                "C",
                11);  // "\x01C" would be one byte
    refusal[15] = static_cast<uint8_t>(preamble::status::version);
    [[maybe_unused]] auto n = ::send(c, refusal.data(), refusal.size(), MSG_NOSIGNAL);
    ::close(c);
  });
  auto cd = decode.connect();
  room_spec r;
  r.room = 950;
  r.dst_pages = range(0, 4);
  prepare(*cd, "127.0.0.1:" + std::to_string(old.port), r);
  auto e = wait_done(*cd, r.room);
  old_prefill.join();
  CHECK(e.status == room_status::failed);
  CHECK_THAT(e.reason, Catch::Contains("peer speaks preamble version 1, this daemon 2 (version 1 "
                                       "is an earlier Ferry release"));
  CHECK(e.code == errc::peer_unreachable);
}

TEST_CASE(
    "peers that pass the preamble and never say hello are bounded like pending preambles, and "
    "honest rooms go on",
    "[e2e][security][hostile][channel]") {
  temp_dir dir;
  shape s;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  auto cp = prefill.connect();
  auto cd = decode.connect();
  // 80 silent links, over limits.max_pending_peers (64): the oldest are closed at once, the
  // rest when their hello is due (limits.peer_preamble_ms).
  std::vector<std::unique_ptr<test_peer>> silent;
  for (int i = 0; i < 80; ++i) {
    silent.push_back(std::make_unique<test_peer>(prefill.control(), "silent-" + std::to_string(i)));
    REQUIRE(silent.back()->ok());
  }
  real_room(*cp, *cd, prefill.control(), 921);
  int closed = 0;
  for (auto& p : silent) closed += p->closed_within(std::chrono::seconds(10));
  CHECK(closed == 80);
  CHECK(log_shows(prefill, "sent no hello within"));
  real_room(*cp, *cd, prefill.control(), 922);
}

TEST_CASE(
    "while a cluster rotates its secret the channel's keys agree across the two secrets, and a "
    "frame under any other key is cut off",
    "[e2e][security][hostile][channel]") {
  temp_dir dir;
  const auto old_secret = write_secret(dir, "old", "the old secret of this cluster");
  const auto new_secret = write_secret(dir, "new", "the new secret of this cluster");
  // The prefill already proves the new secret, the decode still the old one; each accepts both.
  shape ps, ds;
  ps.secret_file = new_secret, ps.accepted_secret_file = old_secret;
  ds.secret_file = old_secret, ds.accepted_secret_file = new_secret;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", ps);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", ds);
  await_ready(prefill, decode);
  auto cp = prefill.connect();
  auto cd = decode.connect();
  real_room(*cp, *cd, prefill.control(), 931);  // every frame of it under the derived keys

  // A peer that knows the secret but seals its first frame under another key (its own
  // direction's reversed: a reflection) is refused by the MAC and cut off.
  test_peer peer(prefill.control(), "evil-decode", "the new secret of this cluster");
  REQUIRE(peer.ok());
  peer_wire::frame_writer wrong(peer.keys().recv);
  std::vector<uint8_t> f;
  wrong.seal(peer_hello{}, f);
  peer.send_raw(f);
  CHECK(cut_off(peer));
  CHECK(log_shows(prefill,
                  "ended before its hello: the peer sent a frame that does not check: "
                  "peer frame peer_hello failed its MAC check"));
  real_room(*cp, *cd, prefill.control(), 932);
}
