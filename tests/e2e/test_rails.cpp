// Rails between real daemons (fabric.rails, fabric.express_bytes; docs/architecture.md,
// "Transport"): the two Connections exchange their endpoints (peer_rails, protocol version 7),
// the prefill stripes a room's batches across the bulk rails both have and sends small ones on
// the express rail, every room commits byte for byte, and the status document counts each
// rail's writes. Rail counts may differ between the daemons, and a daemon speaking the previous
// protocol version (the failpoint peer_protocol_6) is sent no rails: the pair uses one endpoint.

#include <catch2/catch.hpp>
#include <map>
#include <thread>

#include "ferryctl.hpp"
#include "harness.hpp"
#include "info.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

using topic = proto::info_topic;

/// Writes each rail of `c` has posted since its start, by rail name.
std::map<std::string, uint64_t> posted(client::client& c) {
  std::map<std::string, uint64_t> out;
  const auto doc = status_of(c);
  for (const auto& r : doc["rails"])
    out[r["rail"].get<std::string>()] = r["writes_posted"].get<uint64_t>();
  return out;
}

/// The peer's rails as `c`'s peers document gives them, once they are `n` (bounded wait: the
/// exchange follows the handshake on its own); the last count seen.
uint64_t wait_peer_rails(client::client& c, uint64_t n) {
  uint64_t seen = 0;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    const auto peers = info_of(c, topic::peers);
    if (peers.size() == 1 && peers[0].contains("rails")) seen = peers[0]["rails"].get<uint64_t>();
    if (seen == n) break;
    std::this_thread::sleep_for(10ms);  // polling a document: nothing notifies its change
  }
  return seen;
}

/// Rooms of 192 pages in chunks of 8 (32 KiB of KV: express-sized), 120 and 64, the last with
/// the state slot and aux row (more than 1 MiB: striped), each verified byte for byte.
void rooms(pair& c, uint64_t first, uint32_t count) {
  for (uint32_t i = 0; i < count; ++i) {
    room_spec r;
    r.room = first + i;
    r.src_pages = range(i * 192, 192);
    r.dst_pages = range(4096 - (i + 1) * 192, 192);
    r.chunks = {8, 120, 64};
    r.src_slot = i % 8, r.dst_slot = (i + 3) % 8;
    r.src_row = i, r.dst_row = 63 - i;
    run_and_verify(c, r);
  }
}

shape railed(const std::string& provider, uint32_t rails, uint64_t express) {
  shape s;
  s.provider = provider;
  s.rails = rails;
  s.express_bytes = express;
  return s;
}

}  // namespace

TEST_CASE("rooms stripe across the rails both daemons have and take express when small",
          "[e2e][rails]") {
  const auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  pair c(railed(provider, 2, 256 << 10));
  rooms(c, 100, 1);  // connects; the rails follow the handshake
  REQUIRE(wait_peer_rails(*c.p, 3) == 3);
  REQUIRE(wait_peer_rails(*c.d, 3) == 3);
  const auto before = posted(*c.p);
  rooms(c, 200, 4);
  const auto after = posted(*c.p);
  INFO("prefill status: " << status_of(*c.p).dump());
  CHECK(after.at("0") > before.at("0"));
  CHECK(after.at("1") > before.at("1"));
  CHECK(after.at("express") > before.at("express"));
  // The decode writes nothing; its rails only receive.
  for (const auto& [rail, n] : posted(*c.d)) CHECK(n == 0);
  // ferryctl shows both.
  const auto text = ferryctl(c.dir, c.prefill.socket(), {"status"});
  CHECK(text.code == 0);
  CHECK_THAT(text.out, Catch::Contains("rail 1: ") && Catch::Contains("rail express: "));
  const auto peers = ferryctl(c.dir, c.decode.socket(), {"peers"});
  CHECK_THAT(peers.out, Catch::Contains(" rails=3 "));
}

TEST_CASE("daemons with different rail counts use the rails both have", "[e2e][rails]") {
  const auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  // The prefill has three bulk rails and express, the decode one endpoint: rail 0 alone.
  pair c(railed(provider, 3, 256 << 10), railed(provider, 1, 0));
  rooms(c, 300, 1);
  // The exchange has happened once the prefill logged what it uses with the decode.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (c.prefill.log_text().find("fabric endpoints: 1 of ours in use") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);  // polling a log: nothing notifies its change
  REQUIRE_THAT(c.prefill.log_text(), Catch::Contains("fabric endpoints: 1 of ours in use"));
  rooms(c, 400, 3);
  const auto p = posted(*c.p);
  CHECK(p.at("0") > 0);
  CHECK(p.at("1") == 0);
  CHECK(p.at("2") == 0);
  CHECK(p.at("express") == 0);
  CHECK(wait_peer_rails(*c.p, 1) == 1);
}

TEST_CASE("a daemon of the previous peer protocol gets no rails and the pair uses one endpoint",
          "[e2e][rails][protocol]") {
  // Either side may be the old one: a version-6 prefill never lists its rails, and a version-6
  // decode is never sent a list it could not read (CAF would drop the connection).
  const bool old_prefill = GENERATE(true, false);
  shape s = railed("tcp", 2, 256 << 10);
  shape old = s;
  old.env.push_back({"FERRY_FAILPOINTS", "peer_protocol_6"});
  pair c(old_prefill ? old : s, old_prefill ? s : old);
  rooms(c, 500, 4);
  const auto p = posted(*c.p);
  CHECK(p.at("0") > 0);
  CHECK(p.at("1") == 0);
  CHECK(p.at("express") == 0);
  for (auto* d : {&c.prefill, &c.decode})
    CHECK_THAT(d->log_text(), !Catch::Contains("fabric endpoints:"));
  CHECK(wait_peer_rails(*c.p, 1) == 1);
  CHECK(wait_peer_rails(*c.d, 1) == 1);
}
