// Many rooms at once: thousands prepared and waiting together, then sent, each moving its own
// bytes; afterwards nothing is left behind (rooms, claims, staging, deadlines). The rates and the
// memory per room are ferry-bench's (--hold, docs/performance.md); this checks the outcome.

#include <unordered_map>
#include <unordered_set>

#include "harness.hpp"
#include "info.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// Reads `c`'s events until every room of `left` reached `at_least` (a terminal status counts
/// for anything); returns the terminal events seen, by room. Each wait is bounded.
std::unordered_map<uint64_t, proto::event> await_all(client::client& c,
                                                     std::unordered_set<uint64_t> left,
                                                     room_status at_least) {
  std::unordered_map<uint64_t, proto::event> ended;
  const size_t events_bound = 8 * left.size() + 64;
  for (size_t i = 0; i < events_bound && !left.empty(); ++i) {
    auto e = c.next_event(60s);
    INFO(e.message);
    REQUIRE(e);
    if (is_terminal(e.value.status)) ended.emplace(e.value.room, e.value);
    if (is_terminal(e.value.status) || e.value.status >= at_least) left.erase(e.value.room);
  }
  INFO(left.size() << " rooms never reached " << to_string(at_least));
  REQUIRE(left.empty());
  return ended;
}

}  // namespace

TEST_CASE("2000 rooms held at once all commit their own bytes and leave nothing behind", "[e2e]") {
  require_provider("tcp");
  constexpr uint32_t rooms = 2000, pages = 2;
  shape s;
  s.pages = rooms * pages;
  s.kv_layers = 2;
  s.slots = rooms;
  s.aux_rows = rooms;
  s.mamba_layers = 1;
  s.temporal_heads = 1;
  s.conv_dim = 512;  // 3 KiB of conv and 1 KiB of temporal state per slot
  s.temporal_dim = 16;
  s.max_active_rooms = rooms;
  pair c(s);

  std::vector<room_spec> specs;
  std::unordered_set<uint64_t> ids;
  for (uint32_t i = 0; i < rooms; ++i) {
    room_spec r;
    r.room = 700000 + i;
    r.src_pages = range(i * pages, pages);
    r.dst_pages = range((rooms - 1 - i) * pages, pages);  // reversed placement on the decode
    r.src_slot = i, r.dst_slot = (i + 13) % rooms;
    r.src_row = i, r.dst_row = (i + 7) % rooms;
    stage(c, r);
    specs.push_back(r);
    ids.insert(r.room);
  }
  // Every room prepared and subscribed to before any is sent; all of them wait at once on both
  // sides (a prefill room exists once the decode's prepare reached it).
  for (auto& r : specs) {
    prepare(c, r);
    REQUIRE(c.d->subscribe(r.room));
  }
  auto early = await_all(*c.d, ids, room_status::waiting_for_input);
  CHECK(early.empty());
  {
    auto ps = status_of(*c.p), ds = status_of(*c.d);
    CHECK(ps["prefill"]["active"] == rooms);
    CHECK(ds["decode"]["active"] == rooms);
    CHECK(ds["timers"].get<uint64_t>() >= rooms);  // each waiting room holds its deadlines
  }
  for (auto& r : specs) {
    send_chunks(c, r);
    REQUIRE(c.p->subscribe(r.room));
  }
  auto decoded = await_all(*c.d, ids, room_status::success);
  auto prefilled = await_all(*c.p, ids, room_status::success);
  REQUIRE(decoded.size() == rooms);
  REQUIRE(prefilled.size() == rooms);
  for (const auto& [room, e] : decoded) {
    INFO("room " << room << ": " << e.reason);
    REQUIRE(e.status == room_status::success);
    REQUIRE(prefilled.at(room).status == room_status::success);
  }
  for (auto& r : specs)
    REQUIRE(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");

  // Nothing left behind: no room active, every destination page, slot and row free again, no
  // staging reserved, no deadline armed, no stray write; every room counted once.
  for (auto* cl : {c.p.get(), c.d.get()}) {
    auto st = status_of(*cl);
    INFO(st.dump());
    CHECK(st["prefill"]["active"] == 0);
    CHECK(st["decode"]["active"] == 0);
    CHECK(st["staging"]["in_use"] == 0);
    CHECK(st["timers"] == 0);
    CHECK(st["stray_writes"] == 0);
  }
  CHECK(status_of(*c.p)["prefill"]["succeeded"] == rooms);
  CHECK(status_of(*c.d)["decode"]["succeeded"] == rooms);
  auto pools = info_of(*c.d, proto::info_topic::pools);
  INFO(pools.dump());
  for (const auto& p : pools) CHECK(p["in_use"] == 0);
  CHECK(c.prefill.stop() == 0);
  CHECK(c.decode.stop() == 0);
}
