// The info documents (status, rooms, peers, pools) of real daemons around a verified room.

#include <catch2/catch.hpp>

#include "harness.hpp"
#include "info.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

using topic = proto::info_topic;

json position(uint32_t rank, uint32_t size) { return {{"rank", rank}, {"size", size}}; }

/// Bytes a TP1 -> TP1 room moves: whole pages, the one state slot and the aux row.
uint64_t room_bytes(const json& pools, uint64_t pages) {
  return pages * pools["kv"]["item_bytes"].get<uint64_t>() +
         pools["state"]["item_bytes"].get<uint64_t>() + pools["aux"]["item_bytes"].get<uint64_t>();
}

}  // namespace

TEST_CASE("info documents follow a verified room: counters, rooms, peers and pools",
          "[e2e][info]") {
  pair c;
  room_spec r;
  r.room = 31;
  r.src_pages = range(0, 64);
  r.dst_pages = range(1000, 64);
  r.chunks = {40, 24};
  r.src_slot = 1, r.dst_slot = 3;
  r.src_row = 2, r.dst_row = 5;

  const auto pools = info_of(*c.d, topic::pools);
  INFO("pools: " << pools.dump());
  REQUIRE(pools.size() == 3);
  const std::pair<const char*, uint64_t> items[] = {{"kv", 4096}, {"state", 8}, {"aux", 64}};
  for (const auto& [kind, n] : items) {
    const auto& p = pools[kind];
    const auto& hello = c.d->daemon().pools[kind == std::string("kv")      ? 0
                                            : kind == std::string("state") ? 1
                                                                           : 2];
    uint64_t item_bytes = 0;
    for (const auto& b : hello.layout.buffers) item_bytes += b.item_bytes;
    CHECK(p["memory"] == "daemon");
    CHECK(p["registered"] == true);
    CHECK(p["shm_name"] == hello.shm_name);
    CHECK(p["bytes"] == hello.layout.total_bytes);
    CHECK(p["items"] == n);
    CHECK(p["item_bytes"] == item_bytes);
    CHECK(p["in_use"] == 0);
    CHECK(p["free"] == n);
  }
  CHECK(pools["kv"]["buffers"] ==
        json::parse(R"([{"kind":"K","tensor":0,"buffers":4,"items":4096,"item_bytes":1024},
                        {"kind":"V","tensor":0,"buffers":4,"items":4096,"item_bytes":1024}])"));

  // A prepared room holds its destination pages, slot and row until it is terminal.
  stage(c, r);
  prepare(c, r);
  const auto held = info_of(*c.d, topic::pools);
  CHECK(held["kv"]["in_use"] == 64);
  CHECK(held["kv"]["free"] == 4096 - 64);
  CHECK(held["state"]["in_use"] == 1);
  CHECK(held["state"]["free"] == 7);
  CHECK(held["aux"]["in_use"] == 1);
  CHECK(held["aux"]["free"] == 63);
  const auto listed = info_of(*c.d, topic::rooms);
  REQUIRE(listed.size() == 1);
  CHECK(listed[0]["room"] == 31);
  CHECK(listed[0]["side"] == "decode");
  CHECK(listed[0]["peer"] == c.prefill.control());
  CHECK(listed[0]["status"].get<std::string>() != "Failed");

  send_and_verify(c, r);

  const uint64_t bytes = room_bytes(pools, 64);
  const auto ds = status_of(*c.d);
  INFO("decode status: " << ds.dump());
  CHECK(ds["node"] == "decode-0");
  CHECK(ds["role"] == "decode");
  CHECK(ds["listen"]["control"] == c.decode.control());
  CHECK(ds["listen"]["client"] == c.decode.socket());
  CHECK(ds["decode"] == json{{"active", 0}, {"succeeded", 1}, {"failed", 0}, {"bytes", bytes}});
  CHECK(ds["prefill"]["succeeded"] == 0);
  CHECK(ds["stray_writes"] == 0);
  CHECK(ds["staging"]["in_use"] == 0);
  const auto ps = status_of(*c.p);
  INFO("prefill status: " << ps.dump());
  CHECK(ps["prefill"] == json{{"active", 0}, {"succeeded", 1}, {"failed", 0}, {"bytes", bytes}});
  CHECK(info_of(*c.d, topic::rooms) == json::array());
  CHECK(info_of(*c.p, topic::rooms) == json::array());

  // The decode's peer is the prefill it dialled, connected, at its TP/PP position.
  const auto peers = info_of(*c.d, topic::peers);
  INFO("decode peers: " << peers.dump());
  REQUIRE(peers.size() == 1);
  CHECK(peers[0]["address"] == c.prefill.control());
  CHECK(peers[0]["state"] == "connected");
  CHECK(peers[0]["node"] == "prefill-0");
  CHECK(peers[0]["instance"] == c.p->daemon().instance);
  CHECK(peers[0]["tp"] == position(0, 1));
  CHECK(peers[0]["pp"] == position(0, 1));
  const auto back = info_of(*c.p, topic::peers);
  REQUIRE(back.size() == 1);
  CHECK(back[0]["node"] == "decode-0");
  CHECK(back[0]["state"] == "connected");

  // Terminal means reusable: every item is free again.
  const auto after = info_of(*c.d, topic::pools);
  for (const auto& [kind, n] : items) {
    CHECK(after[kind]["in_use"] == 0);
    CHECK(after[kind]["free"] == n);
  }
}
