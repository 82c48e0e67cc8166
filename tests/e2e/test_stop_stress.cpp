// Stop-and-resume stress: a prefill frozen (SIGSTOP) at a random point of a large transfer, the
// decode's room failing by the heartbeat bound, a sentinel written over the room's pages, slot
// and row the moment it is Failed (as an engine reusing them would), the prefill resumed
// (SIGCONT), and then the sentinel checked byte for byte: no byte of the old room may land once
// it was reported Failed (docs/reliability.md section 4). Judged by the bytes, not by the
// stray_writes counter: a cut write never delivers its immediate.
//
// FERRY_STOP_ROUNDS sets the number of stops (CI runs the default; docs/reliability.md records
// a run of 100 or more).

#include <fmt/format.h>

#include <random>

#include "harness.hpp"
#include "http.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

constexpr uint8_t sentinel = 0xA5;

/// Every byte of the room's destination pages (all KV buffers), state slot and aux row.
template <class F>
void for_each_dst_item(client::client& d, const room_spec& r, F f) {
  const auto& pools = d.daemon().pools;
  for (size_t b = 0; b < pools[0].layout.buffers.size(); ++b)
    for (auto page : r.dst_pages)
      f(d.item(pool_kind::kv, b, page), pools[0].layout.buffers[b].item_bytes);
  for (size_t b = 0; b < pools[1].layout.buffers.size(); ++b)
    f(d.item(pool_kind::state, b, r.dst_slot), pools[1].layout.buffers[b].item_bytes);
  f(d.item(pool_kind::aux, 0, r.dst_row), pools[2].layout.buffers[0].item_bytes);
}

/// How many bytes of the room's destination differ from the sentinel.
uint64_t not_sentinel(client::client& d, const room_spec& r) {
  uint64_t n = 0;
  for_each_dst_item(d, r, [&](const uint8_t* p, uint64_t len) {
    for (uint64_t i = 0; i < len; ++i) n += p[i] != sentinel;
  });
  return n;
}

/// A room of `pages` contiguous pages (sources first, destinations after them), state slot 1 to
/// 2, aux row 1 to 2: large enough that a stop or a cancel comes mid-transfer.
room_spec large_room(uint64_t id, uint32_t pages) {
  room_spec r;
  r.room = id;
  r.src_pages = range(0, pages);
  r.dst_pages = range(pages, pages);
  r.src_slot = 1, r.dst_slot = 2;
  r.src_row = 1, r.dst_row = 2;
  return r;
}

/// Wait (at most 30 s) until the first bytes at `p` are no longer zero: a write has landed there.
void wait_landed(const uint8_t* p) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::all_of(p, p + 64, [](uint8_t x) { return x == 0; }) &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::yield();
}

/// The last 6000 characters of a daemon's log.
std::string tail_of(const std::string& log) {
  return log.size() > 6000 ? log.substr(log.size() - 6000) : log;
}

/// wait_done, but a room that does not end within its bound fails the test with the tail of
/// both daemons' logs (a hang must say where it is).
proto::event wait_done_or_logs(client::client& c, uint64_t room, pair& p) {
  auto s = c.subscribe(room);
  INFO(s.message);
  REQUIRE(s);
  auto e = c.wait_terminal(room, 60s);
  if (!e)
    FAIL("room " << room << ": " << e.message << "\n--- prefill log (tail):\n"
                 << tail_of(p.prefill.log_text()) << "\n--- decode log (tail):\n"
                 << tail_of(p.decode.log_text()));
  return e.value;
}

int rounds() {
  const char* v = std::getenv("FERRY_STOP_ROUNDS");
  return v ? std::max(1, std::atoi(v)) : 12;
}

/// The milliseconds a reason "... (not retried for another N ms)" announces, else 0.
int retry_after_ms(const std::string& reason) {
  const auto at = reason.find("not retried for another ");
  return at == std::string::npos ? 0 : std::atoi(reason.c_str() + at + 24);
}

/// The stress for one fabric provider. shm: the resumed prefill's writes into the fenced
/// decode are rejected and never answered; its endpoint is renewed when it cuts the decode, and
/// the next room must go through (transport/fabric_peers.cpp, renew_on_cut_).
void stop_stress(const std::string& provider) {
  require_provider(provider);
  shape s;
  s.provider = provider;
  s.heartbeat_ms = 200;
  s.heartbeat_misses = 3;
  s.drain_ms = 1000;
  // shm copies a write by cross-memory attach on the target's side, which goes on while the
  // prefill is stopped: only writes not yet posted wait for it. A few in flight at a time leave
  // most of the room unposted at the stop, so nearly every stop is mid-transfer, and rails with
  // writes still queued are cut (docs/reliability.md section 4, the shm renewal).
  if (provider == "shm") s.max_inflight_bytes = 256 << 10;
  pair c(s);
  std::mt19937_64 rng(std::random_device{}());
  const int n = rounds();
  int stopped_mid = 0;
  int wedged = 0;        // shm: rounds whose decode waited for the stopped prefill (see below)
  int outcome_lost = 0;  // rounds that ended Success on the decode, peer_lost on the prefill
  uint64_t late_bytes = 0;
  for (int i = 0; i < n; ++i) {
    INFO("round " << i);
    // 2048 contiguous pages: each KV buffer goes as 2 MiB in 256 KiB pieces, 16 MiB of KV,
    // plus the 1.7 MiB state slot.
    room_spec r = large_room(5000 + static_cast<uint64_t>(i), 2048);
    stage(c, r);
    // The prefill may still be in the decode's unresponsive window from the previous stop:
    // such a prepare fails at once, naming how long; wait that long and prepare again.
    for (int attempt = 0;; ++attempt) {
      REQUIRE(attempt < 20);
      prepare(c, r);
      auto ev = wait_for_status_or_end(*c.d, r.room, room_status::waiting_for_input);
      if (ev.status != room_status::failed) break;
      const int wait_ms = retry_after_ms(ev.reason);
      INFO(ev.reason);
      REQUIRE(wait_ms > 0);
      std::this_thread::sleep_for(std::chrono::milliseconds(wait_ms + 5));  // its stated window
    }
    send_chunks(c, r);
    // Stop the prefill once a random page of a random KV buffer has landed.
    const auto& bufs = c.d->daemon().pools[0].layout.buffers;
    // In the first half of the buffers, so that most stops come mid-transfer.
    const size_t b = rng() % (bufs.size() / 2);
    const uint32_t page = r.dst_pages[rng() % r.dst_pages.size()];
    wait_landed(c.d->item(pool_kind::kv, b, page));
    c.prefill.signal(SIGSTOP);
    bool resumed = false;
    if (provider == "shm") {
      // libfabric 1.17's shm guards its shared queues with spinlocks in shared memory: a
      // prefill stopped inside one holds up the decode's progress thread until it resumes
      // (docs/reliability.md section 4). Wait well past the heartbeat bound, then resume it;
      // the fence guarantee below (no byte after Failed) must hold either way.
      auto sub = c.d->subscribe(r.room);
      INFO(sub.message);
      REQUIRE(sub);
      auto e = c.d->wait_terminal(r.room, 10s);
      if (!e) {
        ++wedged;
        c.prefill.signal(SIGCONT);
        resumed = true;
      } else {
        c.d->discard_events(r.room);
      }
    }
    auto de = wait_done_or_logs(*c.d, r.room, c);
    if (de.status == room_status::success) {  // every write had landed, or did on resume
      CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
      if (!resumed) c.prefill.signal(SIGCONT);
      const auto pe = wait_done_or_logs(*c.p, r.room, c);
      INFO("prefill: " << pe.reason << "\n--- prefill log (tail):\n"
                       << tail_of(c.prefill.log_text()) << "\n--- decode log (tail):\n"
                       << tail_of(c.decode.log_text()));
      // The prefill learns the outcome if it still reaches it. When the decode judged the
      // stopped prefill dead first, it closed the link: its room can still end in Success,
      // since the fence waits for the progress thread and the completions read before it
      // count (shm's spinlocks hold that thread until the prefill resumes), but the outcome
      // has no way back, and the prefill reports the peer lost (docs/reliability.md §4).
      if (pe.status != room_status::success) {
        ++outcome_lost;
        CHECK(pe.code == errc::peer_lost);
        CHECK_THAT(pe.reason, Catch::Contains("lost"));
      }
      continue;
    }
    ++stopped_mid;
    INFO(de.reason);
    CHECK_THAT(de.reason, Catch::Contains("unresponsive"));
    // Failed: the engine reuses the pages at once.
    for_each_dst_item(*c.d, r, [](uint8_t* p, uint64_t len) { std::memset(p, sentinel, len); });
    if (!resumed) c.prefill.signal(SIGCONT);
    auto pe = wait_done_or_logs(*c.p, r.room, c);
    CHECK(pe.status == room_status::failed);
    // The resumed prefill's connection to the decode is gone; its next room goes over a new
    // one (next round), behind whatever it still had to send of this one.
    const auto late = not_sentinel(*c.d, r);
    late_bytes += late;
    CHECK(late == 0);
  }
  // One more room proves the last round's leftovers are gone and the pair still works.
  room_spec last;
  last.room = 9999;
  last.src_pages = range(0, 64);
  last.dst_pages = range(100, 64);
  for (int attempt = 0;; ++attempt) {
    REQUIRE(attempt < 20);
    stage(c, last);
    prepare(c, last);
    auto ev = wait_for_status_or_end(*c.d, last.room, room_status::waiting_for_input);
    if (ev.status != room_status::failed) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(retry_after_ms(ev.reason) + 5));
  }
  send_chunks(c, last);
  REQUIRE(wait_done_or_logs(*c.d, last.room, c).status == room_status::success);
  CHECK(client::verify_room(*c.d, last.room, last.dst_pages, last.dst_slot, last.dst_row).message ==
        "");
  WARN(fmt::format(
      "{} rounds, {} stopped mid-transfer, {} late bytes{}{}", n, stopped_mid, late_bytes,
      wedged ? fmt::format(", {} decode(s) held up until the prefill resumed", wedged) : "",
      outcome_lost ? fmt::format(", {} Success on the decode only", outcome_lost) : ""));
  CHECK(stopped_mid > 0);  // the stop came mid-transfer at least once (usually most times)
}

}  // namespace

TEST_CASE("a prefill stopped at random points of large transfers lands nothing after Failed",
          "[e2e][failure][stress]") {
  stop_stress("tcp");
}

TEST_CASE(
    "shm: a prefill stopped at random points of large transfers lands nothing after "
    "Failed and goes on",
    "[e2e][failure][stress][shm]") {
  stop_stress("shm");
}

TEST_CASE("a cancelled room whose prefill does not drain is fenced at the drain deadline",
          "[e2e][failure]") {
  shape s;
  s.heartbeat_ms = 2000;  // the heartbeat would take 20 s: the drain deadline comes first
  s.heartbeat_misses = 10;
  s.drain_ms = 300;
  pair c(s);
  room_spec r = large_room(77, 2048);
  stage(c, r);
  prepare(c, r);
  send_chunks(c, r);
  wait_landed(c.d->item(pool_kind::kv, 0, r.dst_pages[100]));
  c.prefill.signal(SIGSTOP);
  auto cancelled = c.d->cancel(r.room);
  auto de = wait_done(*c.d, r.room);
  if (!cancelled) {  // the room had committed before the stop: nothing to drain
    c.prefill.signal(SIGCONT);
    SUCCEED("the room finished before the stop; nothing to test this time");
    return;
  }
  INFO(de.reason);
  REQUIRE(de.status == room_status::failed);
  CHECK_THAT(de.reason, Catch::StartsWith("cancelled by client; drain incomplete after 300 ms "
                                          "(timeouts.drain_ms), fenced: 127.0.0.1:"));
  for_each_dst_item(*c.d, r, [](uint8_t* p, uint64_t len) { std::memset(p, sentinel, len); });
  c.prefill.signal(SIGCONT);
  CHECK(wait_done(*c.p, r.room).status == room_status::failed);
  CHECK(not_sentinel(*c.d, r) == 0);
  // The fenced prefill is a new peer for the next room, which succeeds byte-exact.
  room_spec next;
  next.room = 78;
  next.src_pages = range(0, 64);
  next.dst_pages = range(100, 64);
  run_and_verify(c, next);
}

TEST_CASE(
    "a room cancelled on the prefill mid-transfer posts nothing more, and drains without a fence",
    "[e2e][failure]") {
  // The decode is frozen once it has prepared, before the first chunk, so it can neither take
  // the room's writes nor commit it, however loaded the machine: much of the room is still
  // unposted when the prefill's client cancels it. The drain waits only for the writes already
  // posted, which complete once the decode resumes; each decode rank waits for exactly those to
  // land, and the link stays up for the next room. Before the cancel stopped the posting, the
  // rest of the room (queued behind every other room to that decode) went out first, and a
  // loaded prefill could miss timeouts.drain_ms: the decode then fenced the link, failing its
  // other rooms with it.
  const uint16_t metrics_port = free_port();
  shape s;
  s.pages = 8192;
  s.max_inflight_bytes = 256 << 10;
  s.heartbeat_ms = 2000;  // the freeze never lasts the 20 s that would declare the decode dead
  s.heartbeat_misses = 10;
  shape ps = s;
  ps.metrics_listen = fmt::format("127.0.0.1:{}", metrics_port);
  pair c(ps, s);
  room_spec r = large_room(81, 4096);  // 32 MiB of KV: more than loopback's socket buffers hold
  stage(c, r);
  prepare(c, r);
  wait_status(*c.d, r.room, room_status::waiting_for_input);  // the prefill accepted it
  c.decode.signal(SIGSTOP);
  send_chunks(c, r);
  auto cancelled = c.p->cancel(r.room);
  c.decode.signal(SIGCONT);
  REQUIRE(cancelled);  // the decode was frozen before the room could commit
  auto pe = wait_done(*c.p, r.room);
  auto de = wait_done(*c.d, r.room);
  INFO("prefill: " << pe.reason << "\ndecode: " << de.reason);
  CHECK(pe.status == room_status::failed);
  CHECK(pe.reason == "cancelled by client");
  REQUIRE(de.status == room_status::failed);
  CHECK(de.code == errc::cancelled);
  CHECK(de.reason == "prefill " + c.prefill.control() + " reported: cancelled by client");
  // What was never posted is counted as such; nothing is left in flight.
  auto m = http_get(metrics_port, "/metrics");
  REQUIRE(m.status == 200);
  INFO(m.body);
  CHECK(series(m.body, "ferry_writes_total", {{"event", "skipped"}}).value_or(0) > 0);
  CHECK(series(m.body, "ferry_writes_total", {{"event", "failed"}}).value_or(0) == 0);
  CHECK(series(m.body, "ferry_writes_in_flight").value_or(-1) == 0);
  // The link was not fenced: the next room goes over it, byte-exact.
  room_spec next;
  next.room = 82;
  next.src_pages = range(0, 64);
  next.dst_pages = range(100, 64);
  run_and_verify(c, next);
  CHECK(c.decode.log_text().find("fenced") == std::string::npos);
}

TEST_CASE("a decode room whose actor dies is failed only after its prefill links are fenced",
          "[e2e][failure]") {
  // The Receiver throws once every prefill rank accepted its prepare (a failpoint: nothing from
  // outside can make a room actor die), so the prefill may write into the room from then on and
  // nobody is left to drain it. The Scheduler fences the room's links and reports Failed only
  // then; the engine reuses the pages at once (a sentinel), and the prefill's engine sends its
  // chunks regardless: nothing of them may land. Without the fence they land in full.
  shape s;
  s.heartbeat_ms = 2000;  // the heartbeat would take 20 s: only the fence can end the link
  s.heartbeat_misses = 10;
  shape ds = s;
  ds.env = {{"FERRY_FAILPOINTS", "receiver_throw_on_accepted=1"}};
  pair c(s, ds);
  room_spec r;
  r.room = 88;
  r.src_pages = range(0, 256);
  r.dst_pages = range(2048, 256);
  r.src_slot = 1, r.dst_slot = 2;
  r.src_row = 1, r.dst_row = 2;
  stage(c, r);
  prepare(c, r);
  auto de = wait_done(*c.d, r.room);
  INFO(de.reason);
  REQUIRE(de.status == room_status::failed);
  CHECK(de.code == errc::internal);
  CHECK_THAT(de.reason, Catch::StartsWith("internal error: room actor ended: ") &&
                            Catch::EndsWith("; its prefill links were fenced"));
  for_each_dst_item(*c.d, r, [](uint8_t* p, uint64_t len) { std::memset(p, sentinel, len); });
  // The prefill learned of the fence (its connection ended): its room fails, whether the send
  // is refused or accepted first.
  [[maybe_unused]] auto sent = c.p->send({r.room, r.src_pages, true, r.src_slot, r.src_row});
  CHECK(wait_done(*c.p, r.room).status == room_status::failed);
  CHECK(not_sentinel(*c.d, r) == 0);
  // The pages were released: a new room on them succeeds byte-exact over a new connection.
  room_spec next;
  next.room = 89;
  next.src_pages = range(0, 64);
  next.dst_pages = range(2048, 64);
  run_and_verify(c, next);
}
