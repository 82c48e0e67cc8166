// Layer-wise sends (protocol v6, docs/protocol.md "Layer-wise sends") between two real ferryds:
// a room sent one layer range at a time, in and out of order, lands exactly the bytes of the
// same room sent whole; duplicates, ranges outside the rank's layers and a second chunk while
// one is open are refused with their texts and leave the room as it was; a cancel in the middle
// of a layer-wise room (by either side) drains, and a prefill killed in the middle of one is
// fenced: the pages reused at once get only the new room's bytes.

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// Send chunk `k` of `r` as the layer ranges `ranges` ({first, count} each), in that order.
void send_layers(client::client& p, const room_spec& r, size_t k,
                 const std::vector<std::pair<uint32_t, uint32_t>>& ranges) {
  uint32_t pos = 0;
  for (size_t i = 0; i < k; ++i) pos += r.chunks[i];
  const bool last = k + 1 == r.chunks.size();
  std::vector<uint32_t> pages(r.src_pages.begin() + pos, r.src_pages.begin() + pos + r.chunks[k]);
  for (const auto& [first, count] : ranges) {
    auto ok = p.send({r.room, pages, last, last ? r.src_slot : no_index,
                      last ? r.src_row : no_index, first, count});
    INFO("room " << r.room << " chunk " << k << " layers " << first << "+" << count << ": "
                 << ok.message);
    REQUIRE(ok);
  }
}

/// One range per layer of the rank, ascending.
std::vector<std::pair<uint32_t, uint32_t>> each_layer(const client::client& p) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto id : p.layers()) out.emplace_back(id, 1);
  return out;
}

/// The destination bytes of two rooms are equal, item for item (the aux rows after the room
/// id, which each row carries for itself).
void check_same_destination(const client::client& d, const room_spec& one, const room_spec& two) {
  const auto& pools = d.daemon().pools;
  size_t differ = 0;
  std::string first;
  auto compare = [&](pool_kind k, size_t buffer, uint64_t ia, uint64_t ib, size_t skip) {
    const auto& buf = pools[static_cast<int>(k)].layout.buffers[buffer];
    const uint8_t* x = d.item(k, buffer, ia);
    const uint8_t* y = d.item(k, buffer, ib);
    REQUIRE(x);
    REQUIRE(y);
    if (std::memcmp(x + skip, y + skip, buf.item_bytes - skip) != 0 && differ++ == 0)
      first = fmt::format("{} buffer {} items {} and {}", to_string(k), buffer, ia, ib);
  };
  const auto& kv = pools[static_cast<int>(pool_kind::kv)].layout.buffers;
  for (size_t b = 0; b < kv.size(); ++b)
    for (size_t i = 0; i < one.dst_pages.size(); ++i)
      compare(pool_kind::kv, b, one.dst_pages[i], two.dst_pages[i], 0);
  const auto& st = pools[static_cast<int>(pool_kind::state)].layout.buffers;
  for (size_t b = 0; b < st.size(); ++b)
    compare(pool_kind::state, b, one.dst_slot, two.dst_slot, 0);
  compare(pool_kind::aux, 0, one.dst_row, two.dst_row, 8);
  INFO(first);
  CHECK(differ == 0);
}

/// Fragmented enough that many writes are in flight when a cancel or a kill comes: 2048
/// single-page runs per buffer, one chunk.
room_spec fragmented_room(uint64_t id) {
  room_spec a;
  a.room = id;
  for (uint32_t i = 0; i < 2048; ++i) {
    a.src_pages.push_back(2 * i);
    a.dst_pages.push_back(4095 - 2 * i);
  }
  a.chunks = {2048};
  a.src_slot = 1, a.dst_slot = 5;
  a.src_row = 2, a.dst_row = 7;
  return a;
}

void wait_success(pair& c, uint64_t room) {
  auto de = wait_done(*c.d, room);
  INFO(de.reason);
  REQUIRE(de.status == room_status::success);
  auto pe = wait_done(*c.p, room);
  INFO(pe.reason);
  REQUIRE(pe.status == room_status::success);
}

}  // namespace

TEST_CASE("a room sent layer by layer lands the bytes of the same room sent whole",
          "[e2e][layer_wise]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  pair c(s);
  REQUIRE(c.p->layers() == std::vector<uint32_t>{0, 3, 4, 7, 8, 11, 15});

  room_spec whole;
  whole.room = 100;
  whole.src_pages = range(0, 96);
  whole.dst_pages = range(1000, 96);
  whole.chunks = {40, 56};
  whole.src_slot = 1, whole.dst_slot = 2;
  whole.src_row = 1, whole.dst_row = 2;
  run_and_verify(c, whole);

  // The same source bytes (pattern key 100), its aux row saying room 101, to other pages.
  room_spec layered = whole;
  layered.room = 101;
  layered.src_pages = range(200, 96);
  layered.dst_pages = range(2000, 96);
  layered.src_slot = 3, layered.dst_slot = 4;
  layered.src_row = 3, layered.dst_row = 4;
  REQUIRE(client::fill_kv(*c.p, whole.room, layered.src_pages, 0).message == "");
  REQUIRE(
      client::fill_state_and_aux(*c.p, whole.room, layered.src_slot, layered.src_row, layered.room)
          .message == "");
  REQUIRE(client::clear_room(*c.d, layered.dst_pages, layered.dst_slot, layered.dst_row).message ==
          "");
  prepare(c, layered);
  // Chunk 0 one layer at a time in order; the last chunk out of order and in groups.
  send_layers(*c.p, layered, 0, each_layer(*c.p));
  send_layers(*c.p, layered, 1, {{8, 8}, {4, 4}, {0, 4}});
  wait_success(c, layered.room);
  CHECK(client::verify_room(*c.d, whole.room, layered.room, layered.dst_pages, layered.dst_slot,
                            layered.dst_row)
            .message == "");
  check_same_destination(*c.d, whole, layered);
  CHECK(c.prefill.stop() == 0);
  CHECK(c.decode.stop() == 0);
}

TEST_CASE(
    "a layer range sent before the decode's prepare waits, and a zero-page last chunk "
    "sends its state layer by layer",
    "[e2e][layer_wise]") {
  pair c;
  room_spec r;
  r.room = 110;
  r.src_pages = range(0, 16);
  r.dst_pages = range(300, 16);
  r.chunks = {16, 0};
  r.src_slot = 2, r.dst_slot = 5;
  r.src_row = 2, r.dst_row = 5;
  stage(c, r);
  send_layers(*c.p, r, 0, {{11, 5}, {0, 11}});
  send_layers(*c.p, r, 1, {{0, 1}});
  auto st = c.p->poll(r.room);
  REQUIRE(st);
  CHECK(st.value.status == room_status::bootstrapping);
  prepare(c, r);
  send_layers(*c.p, r, 1, {{4, 12}, {3, 1}});
  wait_success(c, r.room);
  CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}

TEST_CASE("layer ranges sent twice, outside the rank's layers or of another chunk are refused",
          "[e2e][layer_wise]") {
  pair c;
  room_spec r;
  r.room = 120;
  r.src_pages = range(0, 8);
  r.dst_pages = range(400, 8);
  r.chunks = {4, 4};
  stage(c, r);
  prepare(c, r);
  auto refused = [&](const proto::send& s) {
    auto e = c.p->send(s);
    REQUIRE_FALSE(e);
    CHECK(e.code == errc::invalid_request);
    return e.message;
  };
  const std::vector<uint32_t> chunk0 = range(0, 4), chunk1 = range(4, 4);
  CHECK(refused({120, chunk0, false, no_index, no_index, 12, 8}) ==
        "room 120: layers [12, 20) reach outside this rank's layers 0..15");
  CHECK(refused({120, chunk0, false, no_index, no_index, 1, 2}) ==
        "room 120: layers [1, 3) name none of this rank's 7 layers (0..15)");
  CHECK(refused({120, chunk0, false, no_index, no_index, 3, 0}) ==
        "room 120: first_layer 3 given with layer_count 0 (a layer_count of 0 sends every layer)");
  REQUIRE(c.p->send({120, chunk0, false, no_index, no_index, 0, 4}));  // 0 and 3
  CHECK(refused({120, chunk0, false, no_index, no_index, 3, 1}) ==
        "room 120: layer 3 of chunk 0 was already sent");
  CHECK(refused({120, chunk0, false, no_index, no_index}) ==
        "room 120: layer 0 of chunk 0 was already sent");
  CHECK(refused({120, chunk1, true, 0, 0, 4, 1}) ==
        "room 120: chunk 0 is still open (5 of its 7 layers to send, layer 4 first): send them, "
        "naming the same pages, before another chunk");
  CHECK(refused({120, chunk0, true, 0, 0, 4, 1}) ==
        "room 120: chunk 0 was opened with last=0; a layer range of it cannot say last=1");
  // The refusals changed nothing: the room completes with the rest of its layers.
  REQUIRE(c.p->send({120, chunk0, false, no_index, no_index, 4, 12}));
  REQUIRE(c.p->send({120, chunk1, true, 0, 0, 0, 16}));
  wait_success(c, r.room);
  CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
  auto late = c.p->send({120, chunk1, true, 0, 0, 0, 1});
  CHECK(late.code == errc::room_finished);
  CHECK(late.message == "room 120 already finished (Success); send after Success is rejected");
}

TEST_CASE(
    "a layer-wise room cancelled in the middle drains, and its pages reused at once get "
    "only the new bytes",
    "[e2e][layer_wise]") {
  auto [provider, by_prefill] =
      GENERATE(table<std::string, bool>({{"tcp", true}, {"tcp", false}, {"shm", true}}));
  require_provider(provider);
  shape s;
  s.provider = provider;
  s.drain_ms = 10000;  // 8192 writes drain within it even on a loaded machine
  pair c(s);
  auto a = fragmented_room(130);
  stage(c, a);
  prepare(c, a);
  send_layers(*c.p, a, 0, {{0, 4}, {4, 4}});  // layers 0, 3, 4, 7 of 7
  wait_status(*c.d, a.room, room_status::transferring);
  auto& canceller = by_prefill ? *c.p : *c.d;
  auto& told = by_prefill ? *c.d : *c.p;
  REQUIRE(canceller.cancel(a.room));
  auto own = wait_done(canceller, a.room);
  CHECK(own.status == room_status::failed);
  CHECK(own.reason == "cancelled by client");
  auto other = wait_done(told, a.room);
  CHECK(other.status == room_status::failed);
  CHECK_THAT(other.reason, Catch::Contains("reported: cancelled by client"));
  // Its remaining layers are refused, not queued.
  auto late = c.p->send({a.room, a.src_pages, true, a.src_slot, a.src_row, 8, 8});
  CHECK_FALSE(late);
  CHECK(status_of(*c.d)["stray_writes"] == 0);
  CHECK(status_of(*c.d)["decode"]["active"] == 0);
  CHECK(status_of(*c.p)["prefill"]["active"] == 0);

  // The same destination, at once, for a room sent whole.
  auto b = a;
  b.room = 131;
  b.src_pages = range(0, 2048);
  run_and_verify(c, b);
  CHECK(status_of(*c.d)["stray_writes"] == 0);
}

TEST_CASE(
    "a prefill killed in the middle of a layer-wise room is fenced, and the pages reused from "
    "another prefill get only the new bytes",
    "[e2e][layer_wise][failure]") {
  temp_dir dir;
  shape s;
  s.heartbeat_ms = 200;
  daemon_proc p1(dir, "prefill-1", "prefill", s), p2(dir, "prefill-2", "prefill", s),
      d(dir, "decode-0", "decode", s);
  auto c1 = p1.connect(), c2 = p2.connect(), cd = d.connect();
  auto a = fragmented_room(140);
  stage(*c1, *cd, a);
  prepare(*cd, p1.control(), a);
  send_layers(*c1, a, 0, {{0, 4}, {4, 4}});
  wait_status(*cd, a.room, room_status::transferring);
  p1.signal(SIGKILL);
  auto de = wait_done(*cd, a.room);
  CHECK(de.status == room_status::failed);
  CHECK_THAT(de.reason, Catch::Contains("lost"));
  // Failed came after the fence: nothing of the dead prefill lands on the reused pages.
  auto b = a;
  b.room = 141;
  b.src_pages = range(0, 2048);
  stage(*c2, *cd, b);
  prepare(*cd, p2.control(), b);
  send_layers(*c2, b, 0, {{8, 8}, {0, 8}});
  auto be = wait_done(*cd, b.room);
  INFO(be.reason);
  REQUIRE(be.status == room_status::success);
  CHECK(client::verify_room(*cd, b.room, b.dst_pages, b.dst_slot, b.dst_row).message == "");
  CHECK(status_of(*cd)["stray_writes"] == 0);
}
