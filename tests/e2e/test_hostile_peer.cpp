// A misbehaving decode peer against a real prefill ferryd: the test process speaks the peer
// protocol itself (the peer preamble, then CAF's BASP; its own libfabric endpoint and registered
// memory) and sends
// what a buggy or hostile daemon might: indices outside the pools it declared, a staging offset
// outside its staging region, a config that does not validate, a room message before the
// handshake. The prefill must refuse each with a reason, post no write, and keep serving.

#include <caf/all.hpp>
#include <caf/io/all.hpp>

#include "actors/messages.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "harness.hpp"
#include "peer_dial.hpp"
#include "transport/engine.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

class peer_system_config : public caf::actor_system_config {
 public:
  peer_system_config() {
    load<caf::io::middleman>();
    add_ferry_message_types(*this);
    set("logger.verbosity", caf::atom("quiet"));
  }
};

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

/// Connect to the prefill's Scheduler (preamble, then BASP) and complete the handshake; returns
/// the prefill's Connection actor (or the refusal reason in `refused`).
caf::actor handshake(caf::actor_system& sys, caf::scoped_actor& self, const daemon_proc& prefill,
                     peer_hello hello, std::string& refused) {
  std::string error;
  auto remote = reach_scheduler(sys, prefill.control(), hello.node, "", error);
  if (!remote) FAIL("cannot reach the prefill: " << error);
  hello.connection = caf::actor_cast<caf::actor>(self);
  self->send(remote, hello);
  caf::actor connection;
  self->receive([&](peer_hello& h) { connection = h.connection; },
                [&](peer_refused& r) { refused = r.reason; },
                caf::after(std::chrono::seconds(20)) >> [&] { FAIL("no answer to the hello"); });
  return connection;
}

/// Send a prepare and return the prefill's acknowledgement.
peer_prepare_ack prepare_and_wait(caf::scoped_actor& self, const caf::actor& connection,
                                  peer_prepare p) {
  self->send(connection, p);
  peer_prepare_ack ack;
  bool got = false;
  while (!got)
    self->receive([&](peer_prepare_ack& a) { ack = a, got = true; },
                  [&](peer_outcome&) {},  // the refused room's own failure, if any
                  [&](heartbeat_atom) {},
                  caf::after(std::chrono::seconds(20)) >> [&] { FAIL("no prepare ack"); });
  return ack;
}

}  // namespace

TEST_CASE("a decode peer naming indices outside its declared pools is refused, nothing written",
          "[e2e][security][hostile]") {
  temp_dir dir;
  shape s;
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  const auto decode_yaml = make_config("evil-decode", "decode", 1, "/tmp/unused.sock", s);
  fake_decode evil(decode_yaml, 1 << 20);  // while the daemon starts
  prefill.await_ready();
  auto cp = prefill.connect();

  peer_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::string refused;
  auto conn = handshake(sys, self, prefill, evil.hello, refused);
  INFO(refused);
  REQUIRE(conn);

  // The prefill client already sent the whole room: a wrongly accepted prepare would be
  // written at once.
  room_spec r;
  r.room = 801;
  r.src_pages = range(0, 4);
  REQUIRE(client::fill_kv(*cp, r.room, r.src_pages, 0).message == "");
  REQUIRE(client::fill_state_and_aux(*cp, r.room, r.src_slot, r.src_row).message == "");
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
  auto ack = prepare_and_wait(self, conn, p);
  CHECK_FALSE(ack.ok);
  CHECK(ack.token == 77);
  CHECK_THAT(ack.reason, Catch::Contains(expect));
  // Nothing was written into the fake decode's memory, and the prefill still serves.
  CHECK(evil.untouched());
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

  peer_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
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
  auto conn = handshake(sys, self, prefill, hello, refused);
  CHECK_FALSE(conn);
  CHECK_THAT(refused, Catch::Contains(expect));
  CHECK(evil.untouched());
  CHECK(status_of(*cp)["role"] == "prefill");
}
