// Fragmented page lists packed through staging (core/pack.hpp), between two real ferryd on tcp
// and on shm: the prefill gathers small runs of a fragmented source, the decode lands a
// fragmented destination in staging and scatters it on commit. Every destination byte is
// checked, and so are the pages between the room's pages (nothing lands beside them); the
// daemons' staging counters say which side copied.

#include <set>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// `n` pages from `first` on, in runs of 1..`longest` pages with gaps of 1..3 (a fixed
/// pattern).
std::vector<uint32_t> fragmented(uint32_t first, uint32_t n, uint32_t longest = 3) {
  std::vector<uint32_t> v;
  uint32_t p = first;
  for (uint32_t i = 0; v.size() < n; ++i) {
    for (uint32_t k = 0; k < 1 + i % longest && v.size() < n; ++k) v.push_back(p++);
    p += 1 + (i * 7) % 3;
  }
  return v;
}

/// The pages between the first and the last of `pages` that are not among them.
std::vector<uint32_t> gaps(const std::vector<uint32_t>& pages) {
  const std::set<uint32_t> in(pages.begin(), pages.end());
  std::vector<uint32_t> out;
  for (uint32_t p = *in.begin(); p < *in.rbegin(); ++p)
    if (!in.count(p)) out.push_back(p);
  return out;
}

constexpr uint64_t canary = 0xC0FFEE;

/// Fill the pages around the room's destination with a pattern of their own.
void fill_canaries(client::client& d, const room_spec& r) {
  REQUIRE(client::fill_kv(d, canary, gaps(r.dst_pages), 0).message == "");
}
void check_canaries(client::client& d, const room_spec& r) {
  CHECK(client::verify_room(d, canary, canary, gaps(r.dst_pages), no_index, no_index).message ==
        "");
}

struct copied {
  uint64_t packed = 0, unpacked = 0;
};
copied staging_copies(client::client& c) {
  const auto s = status_of(c)["staging"];
  return {s["packed_bytes"].get<uint64_t>(), s["unpacked_bytes"].get<uint64_t>()};
}

room_spec room_of(uint64_t id, std::vector<uint32_t> src, std::vector<uint32_t> dst) {
  room_spec r;
  r.room = id;
  r.src_pages = std::move(src);
  r.dst_pages = std::move(dst);
  r.src_slot = 1, r.dst_slot = 6;
  r.src_row = 2, r.dst_row = 9;
  return r;
}

}  // namespace

TEST_CASE("fragmented page lists are packed on the side that is fragmented, byte for byte",
          "[e2e][pack]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  // 700 pages of 8 KV buffers × 1 KiB: runs of 1..3 KiB, far below the default threshold.
  const auto frag_src = fragmented(100, 700), frag_dst = fragmented(1900, 700);
  const auto flat_src = range(100, 700), flat_dst = range(1900, 700);
  room_spec r;
  enum class part { none, some, all };
  part src_packs = part::all;
  bool dst_scatters = true;
  SECTION("both sides fragmented: gathered at the prefill, scattered at the decode") {
    r = room_of(11, frag_src, frag_dst);
  }
  SECTION("only the source: the prefill gathers, the decode's pages take whole writes") {
    r = room_of(12, frag_src, flat_dst);
    dst_scatters = false;
  }
  SECTION("only the destination: the decode scatters, the prefill writes its runs into staging") {
    r = room_of(13, flat_src, frag_dst);
    src_packs = part::none;
  }
  SECTION(
      "staging of 1 MiB: no room for a landing block; the prefill gathers 128 KiB at a time "
      "the runs that fall in one destination run") {
    s.staging_bytes = 1 << 20;
    r = room_of(15, frag_src, fragmented(1900, 700, 8));
    src_packs = part::some;
    dst_scatters = false;
  }
  SECTION("packing off: one write per run, the same bytes") {
    s.pack_threshold_bytes = 0;
    r = room_of(14, frag_src, frag_dst);
    src_packs = part::none;
    dst_scatters = false;
  }
  pair c(s);
  fill_canaries(*c.d, r);
  const auto p0 = staging_copies(*c.p), d0 = staging_copies(*c.d);
  run_and_verify(c, r);
  check_canaries(*c.d, r);
  const auto p1 = staging_copies(*c.p), d1 = staging_copies(*c.d);
  const uint64_t kv_bytes = 700 * 8 * 1024;
  const uint64_t packed = p1.packed - p0.packed;
  if (src_packs == part::some) {
    CHECK(packed > 0);
    CHECK(packed < kv_bytes);
  } else {
    CHECK(packed == (src_packs == part::all ? kv_bytes : 0));
  }
  CHECK(d1.unpacked - d0.unpacked == (dst_scatters ? kv_bytes : 0));
  check_nothing_held(*c.p);
  check_nothing_held(*c.d);
}

TEST_CASE("a packed room in chunks commits byte for byte", "[e2e][pack]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  pair c(s);
  auto r = room_of(21, fragmented(10, 900), fragmented(2000, 900));
  r.chunks = {250, 1, 300, 349};  // a one-page chunk too: a run of its own
  fill_canaries(*c.d, r);
  run_and_verify(c, r);
  check_canaries(*c.d, r);
  CHECK(staging_copies(*c.p).packed == 899 * 8 * 1024);  // the one-page chunk goes direct
  CHECK(staging_copies(*c.d).unpacked == 900 * 8 * 1024);
  // Rooms in chunks at once, sharing both staging areas.
  std::vector<room_spec> rooms;
  for (uint32_t i = 0; i < 4; ++i) {
    rooms.push_back(
        room_of(30 + i, fragmented(10 + 500 * i, 240), fragmented(2000 + 500 * i, 240)));
    rooms.back().chunks = {100, 140};
    rooms.back().src_slot = rooms.back().dst_slot = i;
    rooms.back().src_row = rooms.back().dst_row = i;
    stage(c, rooms.back());
    prepare(c, rooms.back());
  }
  for (const auto& x : rooms) send_chunk(*c.p, x, 0);
  for (const auto& x : rooms) send_chunk(*c.p, x, 1);
  for (const auto& x : rooms) {
    INFO("room " << x.room);
    auto de = wait_done(*c.d, x.room);
    INFO(de.reason);
    REQUIRE(de.status == room_status::success);
    CHECK(wait_done(*c.p, x.room).status == room_status::success);
    CHECK(client::verify_room(*c.d, x.room, x.dst_pages, x.dst_slot, x.dst_row).message == "");
  }
  check_nothing_held(*c.p);
  check_nothing_held(*c.d);
}

TEST_CASE(
    "a packed room cancelled mid-transfer drains, frees its staging, and its pages are "
    "reused at once",
    "[e2e][pack]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  pair c(s);
  // Two chunks: the room cannot commit before the second is sent.
  auto a = room_of(41, fragmented(0, 1024), fragmented(2040, 1024));
  a.chunks = {512, 512};
  stage(c, a);
  prepare(c, a);
  send_chunk(*c.p, a, 0);
  wait_status(*c.d, a.room, room_status::transferring);
  CHECK(status_of(*c.d)["staging"]["in_use"] > 0);  // its landing block

  SECTION("cancelled by the decode client") { cancel_and_check(*c.d, *c.p, a.room); }
  SECTION("cancelled by the prefill client") { cancel_and_check(*c.p, *c.d, a.room); }
  // Failed came only once nothing of the room could land or be copied any more: both staging
  // areas are free, and no write arrives afterwards (it would count as stray).
  check_nothing_held(*c.p);
  check_nothing_held(*c.d);

  // The very same destination pages, slot and row, at once, for a new packed room.
  auto b = room_of(42, fragmented(100, 1024), a.dst_pages);
  b.src_slot = a.src_slot, b.dst_slot = a.dst_slot;
  b.src_row = a.src_row, b.dst_row = a.dst_row;
  fill_canaries(*c.d, b);
  run_and_verify(c, b);
  check_canaries(*c.d, b);
  check_nothing_held(*c.d);
}

TEST_CASE(
    "a decode whose staging is full does not wait for a landing block: that room goes one "
    "write per run",
    "[e2e][pack]") {
  auto provider = GENERATE(as<std::string>{}, "tcp", "shm");
  require_provider(provider);
  shape s;
  s.provider = provider;
  s.staging_bytes = 4 << 20;  // two landing blocks of 250 pages (2 000 KiB each), not three
  pair c(s);
  std::vector<room_spec> rooms;
  for (uint32_t i = 0; i < 3; ++i) {
    rooms.push_back(
        room_of(50 + i, fragmented(10 + 600 * i, 250), fragmented(2000 + 600 * i, 250)));
    auto& r = rooms.back();
    r.src_slot = r.dst_slot = r.src_row = r.dst_row = i;
    fill_canaries(*c.d, r);
    stage(c, r);
    prepare(c, r);
  }
  // Every room has reserved what it could and sent its prepares before any is sent: no block
  // is freed meanwhile.
  for (const auto& r : rooms) wait_status(*c.d, r.room, room_status::waiting_for_input);
  for (const auto& r : rooms) send_chunks(c, r);
  for (const auto& r : rooms) {
    INFO("room " << r.room);
    auto de = wait_done(*c.d, r.room);
    INFO(de.reason);
    REQUIRE(de.status == room_status::success);
    CHECK(wait_done(*c.p, r.room).status == room_status::success);
    CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
    check_canaries(*c.d, r);
  }
  const auto st = status_of(*c.d)["staging"];
  CHECK(st["unpacked_bytes"] == 2 * 250 * 8 * 1024);  // two rooms landed in staging
  CHECK(st["waits"] == 0);                            // and the third did not wait
  // Its destination runs follow none of its source runs: nothing to gather either.
  CHECK(staging_copies(*c.p).packed == 2 * 250 * 8 * 1024);
  check_nothing_held(*c.p);
  check_nothing_held(*c.d);
}
