// Bad input from clients, peers and configs: a clear error to that caller, nothing written, and
// the daemon keeps serving the next good request.

#include <cstring>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

void good_request_still_works(pair& c, uint64_t room) {
  room_spec r;
  r.room = room;
  r.src_pages = range(0, 8);
  r.dst_pages = range(8, 8);
  run_and_verify(c, r);
}

std::string error_of(const ferry::result<>& o) {
  REQUIRE_FALSE(o);
  return o.message;
}

}  // namespace

TEST_CASE("bad client requests get errors naming the problem, and the daemon keeps serving",
          "[e2e][bad-input]") {
  pair c;
  const auto peer = c.prefill.control();

  SECTION("destination page outside the pool") {
    CHECK(error_of(c.d->prepare({5, {peer}, {1, 2, 4096}, 0, 0})) ==
          "room 5: dst page 4096 (position 2) is outside the pool of 4096 pages");
  }
  SECTION("source page outside the pool") {
    CHECK(error_of(c.p->send({5, {4100}, false, no_index, no_index})) ==
          "room 5: src page 4100 (position 0) is outside the pool of 4096 pages");
  }
  SECTION("state slot outside the pool") {
    CHECK(error_of(c.d->prepare({5, {peer}, {1}, 8, 0})) ==
          "room 5: dst state slot 8 is outside the pool of 8 slots");
  }
  SECTION("zero state slots on either side") {
    CHECK(error_of(c.d->prepare({5, {peer}, {1}, no_index, 0})) ==
          "mamba requires single state index: room 5 got dst=none (exactly one dst state slot is "
          "required)");
    CHECK(error_of(c.p->send({5, {}, true, no_index, 0})) ==
          "mamba requires single state index: room 5 got src=none (exactly one src state slot is "
          "required)");
  }
  SECTION("several state slots cannot be expressed: extra bytes are rejected") {
    auto frame = proto::encode(proto::send{5, {}, true, 1, 0}, 99);
    for (int i = 0; i < 4; ++i) frame.push_back(2);  // a second "slot"
    uint32_t len = static_cast<uint32_t>(frame.size() - 4);
    std::memcpy(frame.data(), &len, 4);
    auto r = c.p->raw_exchange(frame);
    REQUIRE(r);
    auto* e = std::get_if<proto::error>(&r.value);
    REQUIRE(e);
    CHECK(e->code == errc::malformed_frame);
    CHECK(e->message == "malformed send frame: 4 unexpected bytes after the last field");
  }
  SECTION("state slot or aux row on a non-last chunk") {
    CHECK(error_of(c.p->send({5, {1}, false, 0, no_index})) ==
          "room 5: state slot, state pages and aux row go only with the last chunk");
  }
  SECTION("aux row that does not carry the room id") {
    REQUIRE(client::clear_room(*c.p, {}, 0, 3).message == "");
    CHECK(error_of(c.p->send({5, {}, true, 0, 3})) ==
          "room 5: src aux row 3 carries room id 0, expected 5");
  }
  SECTION("duplicate room") {
    room_spec r;
    r.room = 77;
    r.dst_pages = range(0, 4);
    prepare(c, r);
    CHECK(error_of(c.d->prepare({77, {peer}, {9}, 1, 1})) ==
          "duplicate room 77: it is already active on this decode daemon");
    REQUIRE(c.d->cancel(77));
    REQUIRE(wait_done(*c.d, 77).status == room_status::failed);  // releases its slot and row
  }
  SECTION("unknown room") {
    auto p = c.d->poll(4242);
    REQUIRE_FALSE(p);
    CHECK(p.code == errc::unknown_room);
    CHECK(p.message == "unknown room 4242");
    CHECK(error_of(c.d->cancel(4242)) == "unknown room 4242");
  }
  SECTION("send after Success") {
    good_request_still_works(c, 900);
    REQUIRE(client::fill_state_and_aux(*c.p, 900, 0, 0).message == "");
    auto o = c.p->send({900, {}, true, 0, 0});
    REQUIRE_FALSE(o);
    CHECK(o.code == errc::room_finished);
    CHECK(o.message == "room 900 already finished (Success); send after Success is rejected");
  }
  SECTION("chunk pages beyond the decode's page list") {
    room_spec r;
    r.room = 60;
    r.src_pages = range(0, 6);
    r.dst_pages = range(0, 4);
    stage(c, r);
    prepare(c, r);
    // Wait until the prefill knows the prepare, so the overrun is caught synchronously.
    wait_status(*c.d, r.room, room_status::waiting_for_input);
    CHECK(error_of(c.p->send({60, r.src_pages, false, no_index, no_index})) ==
          "room 60: chunk of 6 pages at position 0 goes beyond the decode's page list of 4 pages");
    // Nothing was written: the destination is still zero.
    CHECK(client::verify_room(*c.d, 60, r.dst_pages, 0, 0)
              .message.find("kv K layer 3 page 0 (position 0) token 0 head 0 differs at byte 0") !=
          std::string::npos);
    REQUIRE(c.d->cancel(60));
    REQUIRE(wait_done(*c.d, 60).status == room_status::failed);  // releases its slot and row
  }
  SECTION("the client library refuses indices outside the mapped pools, touching nothing") {
    const std::vector<uint32_t> pages{1, 4096};
    CHECK(client::fill_kv(*c.p, 1, pages, 0).message ==
          "kv page 4096 (position 1) is outside the pool of 4096 pages");
    CHECK(client::fill_state_and_aux(*c.p, 1, 8, 0).message ==
          "state slot 8 is outside the pool of 8 slots");
    CHECK(client::fill_state_and_aux(*c.p, 1, 0, 64).message ==
          "aux row 64 is outside the pool of 64 rows");
    CHECK(client::verify_room(*c.d, 1, pages, 0, 0).message ==
          "kv page 4096 (position 1) is outside the pool of 4096 pages");
    CHECK(c.p->item(pool_kind::state, 0, 8) == nullptr);
  }
  SECTION("wrong role, and fields outside the pools: refused on the gateway's thread") {
    const auto before = status_of(*c.p)["requests_refused_at_once"].get<uint64_t>();
    CHECK(error_of(c.p->prepare({5, {peer}, {1}, 0, 0})) ==
          "room 5: prepare is a decode operation; this daemon's role is prefill");
    CHECK(error_of(c.d->send({5, {1}, true, 0, 0})) ==
          "room 5: send is a prefill operation; this daemon's role is decode");
    CHECK(status_of(*c.p)["requests_refused_at_once"] == before + 1);
    CHECK(status_of(*c.d)["requests_refused_at_once"].get<uint64_t>() >= 1);
  }
  SECTION("malformed frame keeps the connection usable") {
    auto frame = proto::encode(proto::poll{1}, 5);
    frame[4] = 99;  // unknown type
    auto r = c.d->raw_exchange(frame);
    REQUIRE(r);
    CHECK(std::get<proto::error>(r.value).message == "unknown message type 99");
    CHECK(c.d->info(proto::info_topic::status));
  }
  SECTION("oversized frame closes only that connection") {
    std::vector<uint8_t> frame{0x00, 0x00, 0x00, 0x7f, 1, 0, 0, 0, 0, 0, 0, 0};
    auto r = c.d->raw_exchange(frame);
    REQUIRE(r);
    CHECK(std::get<proto::error>(r.value).message ==
          "frame of 2130706432 bytes exceeds the limit of 16777216 bytes");
    CHECK_FALSE(c.d->info(proto::info_topic::status));  // closed
    c.d = c.decode.connect();
  }
  good_request_still_works(c, 1);
}

TEST_CASE("a config with a bad key is refused with the key path", "[e2e][bad-input]") {
  temp_dir dir;
  auto path = (dir.path / "bad.yaml").string();
  std::string text = make_config("x", "decode", 7000, (dir.path / "x.sock").string(), shape{});
  text.replace(text.find("page_tokens"), 11, "page_tokenz");
  std::ofstream(path) << text;
  auto cmd = bin("ferryd") + " --check-config " + path + " 2>&1";
  FILE* f = popen(cmd.c_str(), "r");
  REQUIRE(f);
  char buf[512] = {};
  auto n = fread(buf, 1, sizeof(buf) - 1, f);
  int st = pclose(f);
  CHECK(WEXITSTATUS(st) == exit_code::usage);
  CHECK(std::string(buf, n) == "ferryd: invalid config: pools.kv.page_tokenz: unknown key\n");
}

TEST_CASE("ferryd --check-config refuses what the daemon would refuse at start",
          "[e2e][bad-input]") {
  temp_dir dir;
  shape s;
  s.secret_file = (dir.path / "secret").string();
  std::ofstream(s.secret_file) << "too short";
  chmod(s.secret_file.c_str(), 0600);
  const auto path = (dir.path / "x.yaml").string();
  std::ofstream(path) << make_config("x", "decode", 7000, (dir.path / "x.sock").string(), s);
  auto r = run_ferryd({"--check-config", path}, dir.path / "check.log");
  CHECK(r.code == exit_code::usage);
  CHECK(r.output == "ferryd: invalid config: security.cluster_secret_file '" + s.secret_file +
                        "': holds 9 bytes; at least 16 are required\n");
  // The same refusal at start.
  auto start = run_ferryd({"--config", path}, dir.path / "start.log");
  CHECK(start.code == exit_code::usage);
  CHECK(start.output == r.output);
  // A node name too long for its shared-memory objects is refused by both, before shm_open.
  std::ofstream(path) << make_config(std::string(300, 'n'), "decode", 7000,
                                     (dir.path / "x.sock").string(), shape{});
  r = run_ferryd({"--check-config", path}, dir.path / "check.log");
  CHECK(r.code == exit_code::usage);
  CHECK(r.output ==
        "ferryd: invalid config: node.name: expected at most 128 characters (it names the "
        "daemon's shared-memory objects), got 300\n");
}

TEST_CASE("a malformed FERRY_FAILPOINTS stops ferryd before it starts, naming the item",
          "[e2e][bad-input]") {
  temp_dir dir;
  const auto path = (dir.path / "x.yaml").string();
  std::ofstream(path) << make_config("x", "decode", 7000, (dir.path / "x.sock").string(), shape{});
  auto r = run_ferryd({"--config", path}, dir.path / "start.log", 30s,
                      [] { setenv("FERRY_FAILPOINTS", "receiver_throw_on_accepted=once", 1); });
  CHECK(r.code == exit_code::usage);
  CHECK_THAT(r.output, Catch::Contains("FERRY_FAILPOINTS='receiver_throw_on_accepted=once': item "
                                       "'receiver_throw_on_accepted=once': the count after '=' "
                                       "must be a whole number of firings (0..999999999)"));
  CHECK_THAT(r.output, !Catch::Contains("ready"));
}

TEST_CASE("incompatible peers fail the room with the first difference", "[e2e][bad-input]") {
  temp_dir dir;
  shape ps, ds;
  ds.page_tokens = 16;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", ps);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", ds);
  await_ready(prefill, decode);
  auto d = decode.connect();
  REQUIRE(d->prepare({3, {prefill.control()}, {1}, 0, 0}));
  auto e = wait_done(*d, 3);
  CHECK(e.status == room_status::failed);
  CHECK(e.reason == "could not use peer " + prefill.control() +
                        ": peer refused the handshake: incompatible layouts: kv.page_tokens "
                        "differs: prefill has 1, decode has 16");
}

TEST_CASE("admission bounds the active rooms per side and frees the place on completion",
          "[e2e][bad-input]") {
  shape s;
  s.max_active_rooms = 2;
  pair c(s);
  const auto peer = c.prefill.control();
  REQUIRE(c.d->prepare({1, {peer}, {0}, 0, 0}));
  REQUIRE(c.d->prepare({2, {peer}, {1}, 1, 1}));
  // WaitingForInput on the decode means the prefill accepted the prepare and holds the room too.
  wait_status(*c.d, 1, room_status::waiting_for_input);
  wait_status(*c.d, 2, room_status::waiting_for_input);
  CHECK(error_of(c.d->prepare({3, {peer}, {2}, 2, 2})) ==
        "room 3: admission refused: 2 rooms already active on the decode side "
        "(limits.max_active_rooms = 2)");
  REQUIRE(c.d->cancel(1));
  REQUIRE(c.d->cancel(2));
  // The decode's prepares created rooms on the prefill too; the cancel reaches them
  // asynchronously, so wait until both sides have freed their places.
  for (uint64_t room : {1, 2}) {
    REQUIRE(wait_done(*c.d, room).status == room_status::failed);
    auto p = wait_done(*c.p, room);
    CHECK(p.status == room_status::failed);
    CHECK_THAT(p.reason, Catch::StartsWith("decode decode-") &&
                             Catch::EndsWith(" reported: cancelled by client"));
  }
  good_request_still_works(c, 4);
}

TEST_CASE("a prepare naming an address where no ferryd listens fails the room with the reason",
          "[e2e][bad-input]") {
  pair c;
  const auto dead = "127.0.0.1:" + std::to_string(free_port());
  REQUIRE(c.d->prepare({70, {dead}, {1}, 0, 0}));
  auto e = wait_done(*c.d, 70);
  CHECK(e.status == room_status::failed);
  CHECK(e.reason.rfind("could not use peer " + dead + ": cannot connect to " + dead + ": ", 0) ==
        0);
  good_request_still_works(c, 71);
}

TEST_CASE("only the daemon's user may connect to its socket or map its pools", "[e2e][security]") {
  pair c;
  struct stat sb {};
  REQUIRE(stat(c.decode.socket().c_str(), &sb) == 0);
  CHECK(S_ISSOCK(sb.st_mode));
  CHECK((sb.st_mode & 0077) == 0);  // no group or other access
  for (const auto& pool : c.d->daemon().pools) {
    if (!pool.present) continue;
    INFO(pool.shm_name);
    REQUIRE(stat(("/dev/shm" + pool.shm_name).c_str(), &sb) == 0);
    CHECK((sb.st_mode & 0077) == 0);
  }
}

namespace {

/// A bare unix-socket connection to a daemon (no hello), to act as a broken or hostile client.
struct raw_socket {
  int fd = -1;
  explicit raw_socket(const std::string& path) {
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~raw_socket() {
    if (fd >= 0) close(fd);
  }
  /// Everything the daemon sends until it closes the connection (bounded wait).
  std::vector<uint8_t> read_until_closed(std::chrono::milliseconds bound) {
    std::vector<uint8_t> got;
    const auto deadline = std::chrono::steady_clock::now() + bound;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      REQUIRE(left.count() > 0);
      pollfd p{fd, POLLIN, 0};
      REQUIRE(::poll(&p, 1, static_cast<int>(left.count())) > 0);
      uint8_t buf[4096];
      ssize_t n = recv(fd, buf, sizeof buf, 0);
      if (n <= 0) return got;
      got.insert(got.end(), buf, buf + n);
    }
  }
};

std::string error_text(const std::vector<uint8_t>& bytes) {
  proto::frame_reader r;
  r.feed(bytes);
  auto d = r.next();
  REQUIRE(d);
  REQUIRE(d->msg);
  auto* e = std::get_if<proto::error>(&*d->msg);
  REQUIRE(e);
  return e->message;
}

}  // namespace

TEST_CASE("a client that starts a frame and stalls is disconnected while others are served",
          "[e2e][bad-input]") {
  shape s;
  s.client_frame_ms = 500;
  pair c(s);
  raw_socket loris(c.decode.socket());
  const uint8_t partial[5] = {40, 0, 0, 0, 2};  // a 40-byte frame header, then nothing
  REQUIRE(send(loris.fd, partial, sizeof partial, MSG_NOSIGNAL) == 5);
  // Everyone else is served meanwhile.
  room_spec r;
  r.room = 901;
  r.src_pages = range(0, 16);
  r.dst_pages = range(16, 16);
  run_and_verify(c, r);
  // The stalled client is told why and closed.
  auto got = loris.read_until_closed(std::chrono::seconds(30));
  CHECK(error_text(got) ==
        "incomplete frame: 5 bytes received and nothing more for 500 ms (limits.client_frame_ms); "
        "closing");
  CHECK(c.d->info(proto::info_topic::status));
}

TEST_CASE("connections beyond limits.max_clients are refused with the reason", "[e2e][bad-input]") {
  shape s;
  s.max_clients = 2;
  pair c(s);  // one client connection on each daemon
  auto second = c.decode.connect();
  raw_socket third(c.decode.socket());
  auto got = third.read_until_closed(std::chrono::seconds(30));
  CHECK(error_text(got) == "too many clients: 2 connections already open (limits.max_clients)");
  // Existing clients are unaffected, and a place freed is usable again.
  CHECK(c.d->info(proto::info_topic::status));
  second.reset();
  CHECK(c.d->info(proto::info_topic::status));  // the gateway has seen the close by now
  auto again = client::client::connect(c.decode.socket(), "again");
  INFO(again.message);
  CHECK(again);
}

TEST_CASE("pages named twice, or held by another active room, are refused naming them",
          "[e2e][bad-input]") {
  pair c;
  const auto peer = c.prefill.control();

  SECTION("the same destination page twice in one prepare") {
    CHECK(error_of(c.d->prepare({5, {peer}, {400, 400}, 0, 0})) ==
          "room 5: dst page 400 is named twice (positions 0 and 1)");
  }
  SECTION("the same source page twice in one send") {
    CHECK(error_of(c.p->send({5, {9, 3, 9}, false, no_index, no_index})) ==
          "room 5: src page 9 is named twice (positions 0 and 2)");
  }
  SECTION("a source page in two chunks of one room") {
    REQUIRE(c.p->send({5, {1, 2}, false, no_index, no_index}));
    CHECK(error_of(c.p->send({5, {3, 2}, false, no_index, no_index})) ==
          "room 5: src page 2 (position 1) was already sent in an earlier chunk of this room");
    REQUIRE(c.p->cancel(5));
  }
  SECTION("destination pages, slot and row held by another active decode room") {
    REQUIRE(c.d->prepare({10, {peer}, {100, 101, 102, 103}, 1, 1}));
    CHECK(error_of(c.d->prepare({11, {peer}, {104, 103}, 2, 2})) ==
          "room 11: dst page 103 (position 1) is held by active room 10");
    CHECK(error_of(c.d->prepare({12, {peer}, {200}, 1, 3})) ==
          "room 12: dst state slot 1 is held by active room 10");
    CHECK(error_of(c.d->prepare({13, {peer}, {201}, 3, 1})) ==
          "room 13: dst aux row 1 is held by active room 10");
    // Released at the room's terminal state.
    REQUIRE(c.d->cancel(10));
    REQUIRE(wait_done(*c.d, 10).status == room_status::failed);
    REQUIRE(c.d->prepare({11, {peer}, {104, 103}, 1, 1}));
    REQUIRE(c.d->cancel(11));
    REQUIRE(wait_done(*c.d, 11).status == room_status::failed);
  }
  SECTION("requests before hello, a second hello and non-zero flags") {
    raw_conn r(c.decode.socket());
    auto error_for = [&](uint32_t seq) {
      auto d = r.next();
      REQUIRE(d.msg);
      CHECK(d.seq == seq);
      auto* e = std::get_if<proto::error>(&*d.msg);
      REQUIRE(e);
      return e->message;
    };
    r.send_frame(proto::poll{1}, 1);
    CHECK(error_for(1) == "poll before hello: hello must be the first request of a connection");
    r.send_frame(proto::hello{proto::protocol_version, "t", false}, 2);
    auto h = r.next();
    REQUIRE(h.msg);
    CHECK(std::holds_alternative<proto::hello_reply>(*h.msg));
    r.send_frame(proto::hello{proto::protocol_version, "t", false}, 3);
    CHECK(error_for(3) == "a second hello: this connection already said hello");
    auto frame = proto::encode(proto::poll{1}, 4);
    frame[6] = 1;  // flags
    r.send_raw(frame);
    CHECK(error_for(4) == "frame flags must be 0, got 0x0001");
  }
  good_request_still_works(c, 1);
}
