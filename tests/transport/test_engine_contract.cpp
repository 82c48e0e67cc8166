// The contract of transport::engine (transport/engine.hpp), one set of checks run against the
// libfabric engine, against the fault-injecting wrapper with no fault armed
// (transport/fault_engine.hpp) and against an engine of several rails (two bulk rails and an
// express rail, transport/rail_engine.hpp), for tcp and shm, two engines in this process on
// loopback. A
// wrapper that forwards faithfully passes exactly what the engine passes, so a fault test
// (test_fault_engine.cpp) differs from a healthy run only by the fault it arms.
#include <map>
#include <set>
#include <thread>

#include "engine_rig.hpp"

using namespace ferry::transport;
using ferry::errc;
using ferry::result;
using namespace ferry::test;

namespace {

/// One test case per provider and engine: a missing provider skips only its own cases.
#define FERRY_CONTRACT_CASE(title, body)                                                   \
  TEST_CASE("fabric contract " title " (tcp, fabric engine)", "[fabric][contract][tcp]") { \
    body("tcp", flavour::fabric);                                                          \
  }                                                                                        \
  TEST_CASE("fabric contract " title " (tcp, rails)", "[fabric][contract][tcp][rails]") {  \
    body("tcp", flavour::rails);                                                           \
  }                                                                                        \
  TEST_CASE("fabric contract " title " (shm, rails)", "[fabric][contract][shm][rails]") {  \
    body("shm", flavour::rails);                                                           \
  }                                                                                        \
  TEST_CASE("fabric contract " title " (tcp, fault wrapper)", "[fabric][contract][tcp]") { \
    body("tcp", flavour::wrapped);                                                         \
  }                                                                                        \
  TEST_CASE("fabric contract " title " (shm, fabric engine)", "[fabric][contract][shm]") { \
    body("shm", flavour::fabric);                                                          \
  }                                                                                        \
  TEST_CASE("fabric contract " title " (shm, fault wrapper)", "[fabric][contract][shm]") { \
    body("shm", flavour::wrapped);                                                         \
  }

void registers_and_deregisters(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [a, a_mem] = r.add_region(1 << 20);
  auto [l, l_mem] = r.add_region(1 << 20, region_access::local);
  const region_desc da = r.target->describe(a), dl = r.target->describe(l);
  CHECK(da.length == (1u << 20));
  CHECK(dl.length == (1u << 20));
  CHECK(da.key != 0);
  CHECK(da.key != dl.key);
  CHECK(a != l);

  auto closed = r.target->deregister_region(a);
  INFO(closed.message);
  REQUIRE(closed);
  CHECK(closed.value);  // this call closed it
  const region_desc gone = r.target->describe(a);
  CHECK(gone.length == 0);
  CHECK(gone.key == 0);
  CHECK(gone.remote_base == 0);
  auto again = r.target->deregister_region(a);
  CHECK(again);
  CHECK_FALSE(again.value);  // already closed: a no-op
  auto unknown = r.target->deregister_region(l + 1000);
  CHECK_FALSE(unknown);
  CHECK(unknown.message ==
        "deregister_region: unknown region " + std::to_string(l + 1000) + " (never registered)");
  auto empty = r.target->register_region(nullptr, 0, region_access::local);
  CHECK_FALSE(empty);
  CHECK_THAT(empty.message, Catch::StartsWith("register_region: expected a non-empty region"));
  // A new registration of the same memory gets a new id and a new key.
  auto anew = r.target->register_region(a_mem->data(), a_mem->size(), region_access::remote_write);
  REQUIRE(anew);
  CHECK(anew.value != a);
  CHECK(r.target->describe(anew.value).key != da.key);
}
FERRY_CONTRACT_CASE("registers and deregisters", registers_and_deregisters)

void batch_lands_byte_exact(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [d, dst] = r.add_region(4 << 20);
  const region_desc dd = r.target->describe(d);
  // Inline-sized to 256 KiB, three immediate values to be aggregated; gaps stay zero.
  const uint64_t sizes[] = {8, 64, 100, 4096, 4097, 65536, 262144};
  std::vector<write_op> ops;
  std::map<uint64_t, uint64_t> expected;
  uint64_t off = 0;
  for (int i = 0; i < 42; ++i) {
    const uint64_t len = sizes[i % 7];
    ops.push_back(r.op(dd, off, (off * 3) % (1 << 20), len, 1000 + i % 3));
    ++expected[1000 + i % 3];
    off += len + 24;
  }
  REQUIRE(off < dst->size());
  auto t = r.submit(ops);
  REQUIRE(t->wait());
  const batch_result res = t->get();
  INFO(res.message);
  CHECK(res.ok());
  CHECK(res.completed == 42);
  CHECK(res.failed == 0);
  // A local completion is not arrival; the counted immediates are.
  REQUIRE(r.imms.wait_total(42));
  CHECK(r.imms.counts() == expected);
  CHECK_FALSE(r.imms.duplicate_in_batch());
  std::vector<uint8_t> image(dst->size(), 0);
  for (const auto& o : ops)
    std::memcpy(image.data() + (o.remote_addr - dd.remote_base), r.src.data() + o.local_offset,
                o.length);
  CHECK(*dst == image);
  CHECK(t->count() == 1);
}
FERRY_CONTRACT_CASE("a write batch lands byte-exact with its immediates counted",
                    batch_lands_byte_exact)

void batch_end_notifies_once_after_every_write(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [d, dst] = r.add_region(8 << 20);
  const region_desc dd = r.target->describe(d);
  // Many small writes and a few large ones; one batch per round, each with its own immediate.
  const uint64_t sizes[] = {64, 1300, 4096, 65536, 1 << 20};
  // tcp orders writes (one notification per rail a batch is striped across); shm notifies every
  // write.
  for (uint64_t round = 0; round < 8; ++round) {
    std::vector<write_op> ops;
    uint64_t off = 0;
    for (int i = 0; i < 29; ++i) {
      const uint64_t len = sizes[(i + round) % 5];
      ops.push_back(r.op(dd, off, (off * 7 + round) % (1 << 20), len, 2000 + round));
      off += len + 64;
    }
    REQUIRE(off < dst->size());
    std::fill(dst->begin(), dst->end(), 0);
    auto t = r.submit(ops, {}, notify::batch_end);
    const uint32_t notes = r.last_notifications;
    CHECK(notes == r.batch_end_notes(29));
    // The notifications' arrival alone says the batch is placed: every byte is there when the
    // last one is counted, before the initiator's local completion is even looked at.
    REQUIRE(r.imms.wait_count(2000 + round, notes));
    std::vector<uint8_t> image(dst->size(), 0);
    for (const auto& o : ops)
      std::memcpy(image.data() + (o.remote_addr - dd.remote_base), r.src.data() + o.local_offset,
                  o.length);
    CHECK(*dst == image);
    REQUIRE(t->wait());
    const batch_result res = t->get();
    INFO(res.message);
    CHECK(res.ok());
    CHECK(res.completed == notes);
    CHECK(res.failed == 0);
    CHECK(r.imms.counts()[2000 + round] == notes);
  }
  CHECK_FALSE(r.imms.duplicate_in_batch());
}
FERRY_CONTRACT_CASE("a batch_end batch is counted once where writes are ordered, after every byte",
                    batch_end_notifies_once_after_every_write)

/// `n` writes of `len` bytes, each to its own place of `dst`, all with immediate `imm`.
std::vector<write_op> spread_ops(const rig& r, const region_desc& dst, size_t n, uint64_t len,
                                 uint64_t imm) {
  std::vector<write_op> ops;
  for (size_t i = 0; i < n; ++i)
    ops.push_back(r.op(dst, i * len, (i * len) % (r.src.size() - len), len, imm));
  return ops;
}

/// How many of `ops` landed whole; every other one must not have landed at all (still zero).
size_t landed_whole(const rig& r, const std::vector<uint8_t>& dst, const region_desc& dd,
                    const std::vector<write_op>& ops) {
  size_t whole = 0;
  for (const auto& o : ops) {
    const uint64_t at = o.remote_addr - dd.remote_base;
    if (r.same(dst, at, o.local_offset, o.length)) {
      ++whole;
      continue;
    }
    INFO("write at " << at << " landed in part");
    CHECK(std::all_of(dst.begin() + static_cast<ptrdiff_t>(at),
                      dst.begin() + static_cast<ptrdiff_t>(at + o.length),
                      [](uint8_t x) { return x == 0; }));
  }
  return whole;
}

void cancelled_before_submit_posts_nothing(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  auto cancel = std::make_shared<write_cancel>();
  r.initiator->cancel_writes(cancel);
  for (auto mode : {notify::every_write, notify::batch_end}) {
    const uint64_t imm = mode == notify::every_write ? 3100 : 3101;
    auto t = r.submit(spread_ops(r, dd, 16, 4096, imm), {}, mode, cancel);
    REQUIRE(t->wait());
    const batch_result res = t->get();
    INFO(res.message);
    CHECK(res.ok());
    CHECK(res.completed == 0);
    CHECK(res.failed == 0);
    CHECK(res.skipped == 16);
    CHECK(t->count() == 1);
  }
  // A batch without the cancel goes on; once it has landed, nothing of the others has.
  r.write_until_landed(dd, *dst, 512 << 10, 0, 4096, 3102);
  CHECK(r.imms.counts()[3100] == 0);
  CHECK(r.imms.counts()[3101] == 0);
  CHECK(std::all_of(dst->begin(), dst->begin() + (16 * 4096), [](uint8_t x) { return x == 0; }));
}
FERRY_CONTRACT_CASE("a batch whose cancel came first posts nothing and completes as skipped",
                    cancelled_before_submit_posts_nothing)

void cancelled_mid_batch_stops_posting(const std::string& provider, flavour f) {
  // One write in flight at a time, so that the batch is still posting when the cancel comes.
  rig r(provider, f, 1);
  const size_t n = 16384;
  const uint64_t len = 1024;
  for (auto mode : {notify::every_write, notify::batch_end}) {
    INFO((mode == notify::every_write ? "every_write" : "batch_end"));
    auto [d, dst] = r.add_region(n * len);
    const region_desc dd = r.target->describe(d);
    const uint64_t imm = mode == notify::every_write ? 3200 : 3201;
    auto cancel = std::make_shared<write_cancel>();
    const auto ops = spread_ops(r, dd, n, len, imm);
    auto t = r.submit(ops, {}, mode, cancel);
    // Cancel once the first write has landed.
    const auto deadline = std::chrono::steady_clock::now() + wait_limit;
    while (!r.same(*dst, 0, ops[0].local_offset, len) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::yield();
    REQUIRE(r.same(*dst, 0, ops[0].local_offset, len));
    r.initiator->cancel_writes(cancel);
    REQUIRE(t->wait());
    const batch_result res = t->get();
    INFO(res.message);
    CHECK(res.ok());
    CHECK(res.failed == 0);
    CHECK(res.skipped > 0);
    CHECK(res.skipped < n);
    CHECK(t->count() == 1);
    // Each completed notification arrives, and then every posted write has landed whole and no
    // skipped one in any part (where one notification stands for a batch, it still comes, after
    // the part that was posted).
    REQUIRE(r.imms.wait_count(imm, res.completed));
    if (mode == notify::every_write) CHECK(res.completed + res.skipped == n);
    CHECK(landed_whole(r, *dst, dd, ops) == n - res.skipped);
    // Nothing more arrives: a later batch over the same path lands, and the count stands.
    r.write_until_landed(dd, *dst, 0, 0, 64, 3202 + static_cast<uint64_t>(mode));
    CHECK(r.imms.counts()[imm] == res.completed);
  }
}
FERRY_CONTRACT_CASE("a batch cancelled mid-way posts no more, and its target counts what it did",
                    cancelled_mid_batch_stops_posting)

void expect_writes_is_only_a_hint(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  // Before any traffic, repeatedly, and with a window already passed: writes land as ever.
  r.target->expect_writes(std::chrono::milliseconds(100));
  r.target->expect_writes(std::chrono::milliseconds(0));
  r.write_until_landed(dd, *dst, 0, 0, 65536, 31);
  r.target->expect_writes(std::chrono::milliseconds(100));
  r.write_until_landed(dd, *dst, 65536, 65536, 4096, 32);
  r.target->stop();
  r.target->expect_writes(std::chrono::milliseconds(100));  // after stop: nothing to wake
}
FERRY_CONTRACT_CASE("expect_writes is a hint: writes land with and without it, also after stop",
                    expect_writes_is_only_a_hint)

void removed_peer_fails_batches(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  // Removed before anything was written to it (on shm a cut after writes renews the endpoint,
  // which stale_write_does_not_land covers).
  r.initiator->remove_peer(r.peer);
  auto t = r.submit({r.op(dd, 0, 0, 4096, 5), r.op(dd, 4096, 4096, 4096, 5)});
  REQUIRE(t->wait());
  const batch_result res = t->get();
  CHECK_FALSE(res.ok());
  CHECK(res.completed == 0);
  CHECK(res.failed == 2);
  CHECK(res.message == "peer removed (peer " + std::to_string(r.peer) + ")");
  // Inserted again, the peer is usable; what the failed batch named never arrived.
  r.peer = must(r.initiator->insert_peer(r.target->local_address()));
  r.write_until_landed(dd, *dst, 65536, 0, 4096, 6);
  CHECK(all_zero(*dst, 0, 8192));
  CHECK(r.imms.counts()[5] == 0);
  CHECK(t->count() == 1);
}
FERRY_CONTRACT_CASE("a batch to a removed peer fails naming it", removed_peer_fails_batches)

void fenced_registration_takes_nothing(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [a, a_mem] = r.add_region(1 << 20);
  auto [b, b_mem] = r.add_region(1 << 20);
  const region_desc da = r.target->describe(a);
  r.write_until_landed(da, *a_mem, 0, 0, 4096, 1);  // the path is up and A took a write
  // The fence, as a daemon does when the initiator's connection ends: A's key closed and the
  // initiator cut, in one step; `done` once both have happened.
  done_probe fenced;
  r.target->fence_peer(r.back, {a}, fenced.callback());
  REQUIRE(fenced.wait());
  CHECK(r.target->describe(a).length == 0);
  // The initiator comes back (a new connection), with B registered for it.
  r.reinsert_back();
  r.stale_write_does_not_land(da, *a_mem, r.target->describe(b), *b_mem, 2, 3);
  CHECK(r.same(*a_mem, 0, 0, 4096));  // what landed before the fence stays
  CHECK(fenced.count() == 1);
}
FERRY_CONTRACT_CASE("a fenced registration takes no bytes of a later write",
                    fenced_registration_takes_nothing)

void deregistration_fences_late_writes(const std::string& provider, flavour f) {
  rig r(provider, f);
  auto [a, a_mem] = r.add_region(1 << 20);
  auto [b, b_mem] = r.add_region(1 << 20);
  const region_desc da = r.target->describe(a);
  r.write_until_landed(da, *a_mem, 0, 0, 4096, 1);
  REQUIRE(r.target->deregister_region(a));
  r.stale_write_does_not_land(da, *a_mem, r.target->describe(b), *b_mem, 2, 3);
}
FERRY_CONTRACT_CASE("deregistration fences later writes", deregistration_fences_late_writes)

void async_calls_answer_once(const std::string& provider, flavour f) {
  std::vector<uint8_t> a(64 << 10, 0), b(64 << 10, 0);  // before the rig: outlive its engines
  rig r(provider, f);
  // Two regions in one call: ids in order, distinct keys, the second writable with its key.
  auto made = std::make_shared<probe<result<std::vector<region_id>>>>();
  r.target->register_regions({{a.data(), a.size(), region_access::remote_write},
                              {b.data(), b.size(), region_access::remote_write}},
                             probe<result<std::vector<region_id>>>::recorder(made));
  REQUIRE(made->wait());
  const auto ids = made->get();
  INFO(ids.message);
  REQUIRE(ids);
  REQUIRE(ids.value.size() == 2);
  const region_desc da = r.target->describe(ids.value[0]), db = r.target->describe(ids.value[1]);
  CHECK(da.length == a.size());
  CHECK(db.length == b.size());
  CHECK(da.key != db.key);
  r.write_until_landed(db, b, 512, 4096, 8192, 77);
  CHECK(all_zero(a));

  // A failure part-way leaves nothing registered.
  auto failed = std::make_shared<probe<result<std::vector<region_id>>>>();
  r.target->register_regions(
      {{a.data(), a.size(), region_access::remote_write}, {nullptr, 0, region_access::local}},
      probe<result<std::vector<region_id>>>::recorder(failed));
  REQUIRE(failed->wait());
  CHECK_FALSE(failed->get());
  CHECK_THAT(failed->get().message, Catch::Contains("expected a non-empty region"));
  CHECK(failed->get().value.empty());
  CHECK(r.target->describe(ids.value[1] + 1).length == 0);

  // An address inserted again answers the same handle; an empty one is refused by name.
  auto again = std::make_shared<probe<result<peer_handle>>>();
  auto empty = std::make_shared<probe<result<peer_handle>>>();
  r.initiator->insert_peer_async(r.target->local_address(),
                                 probe<result<peer_handle>>::recorder(again));
  r.initiator->insert_peer_async({}, probe<result<peer_handle>>::recorder(empty));
  REQUIRE(again->wait());
  REQUIRE(empty->wait());
  INFO(again->get().message);
  CHECK(again->get());
  CHECK(again->get().value == r.peer);
  CHECK_FALSE(empty->get());
  CHECK(empty->get().message == "insert_peer: empty fabric address");
  for (int n : {made->count(), failed->count(), again->count(), empty->count()}) CHECK(n == 1);
}
FERRY_CONTRACT_CASE("async registration and insertion answer through their callbacks once",
                    async_calls_answer_once)

void shutdown_completes_every_callback_once(const std::string& provider, flavour f) {
  std::vector<uint8_t> extra(64 << 10, 0);  // before the rig: outlives its engines
  rig r(provider, f, 4);
  const region_id d = r.add_region(1 << 20).first;
  const region_desc dd = r.target->describe(d);
  // 20 batches of 16 writes with 4 in flight: most still queued or posted at the stop.
  std::vector<std::shared_ptr<batch_probe>> batches;
  for (int b = 0; b < 20; ++b) {
    std::vector<write_op> ops;
    for (uint64_t i = 0; i < 16; ++i) ops.push_back(r.op(dd, i * 4096, i * 4096, 4096, 9));
    batches.push_back(r.submit(std::move(ops)));
  }
  r.initiator->stop();
  uint32_t completed = 0;
  for (auto& b : batches) {
    REQUIRE(b->wait());
    const batch_result res = b->get();
    CHECK(res.completed + res.failed == 16);
    if (!res.ok()) CHECK_THAT(res.message, Catch::Contains("engine stopped"));
    completed += res.completed;
  }
  // shm's same-process fast path: let the target see every completed write before it closes.
  REQUIRE(r.imms.wait_total(completed));
  // The asynchronous calls, queued on the target just before its stop.
  auto made = std::make_shared<probe<result<std::vector<region_id>>>>();
  auto inserted = std::make_shared<probe<result<peer_handle>>>();
  done_probe fenced;
  r.target->register_regions({{extra.data(), extra.size(), region_access::remote_write}},
                             probe<result<std::vector<region_id>>>::recorder(made));
  r.target->insert_peer_async(r.initiator->local_address(),
                              probe<result<peer_handle>>::recorder(inserted));
  r.target->fence_peer(r.back, {d}, fenced.callback());
  r.target->stop();
  REQUIRE(made->wait());
  REQUIRE(inserted->wait());
  REQUIRE(fenced.wait());
  // After stop: a batch fails at once, a fence still completes, stop again is a no-op.
  auto late = r.submit({r.op(dd, 0, 0, 64, 10)});
  REQUIRE(late->wait());
  CHECK_THAT(late->get().message, Catch::Contains("engine stopped"));
  done_probe late_fence;
  r.target->fence_peer(std::nullopt, {}, late_fence.callback());
  REQUIRE(late_fence.wait());
  r.initiator->stop();
  r.target->stop();
  for (auto& b : batches) CHECK(b->count() == 1);
  CHECK(made->count() == 1);
  CHECK(inserted->count() == 1);
  CHECK(fenced.count() == 1);
  CHECK(late->count() == 1);
  CHECK(late_fence.count() == 1);
}
FERRY_CONTRACT_CASE("shutdown with work in flight completes every callback exactly once",
                    shutdown_completes_every_callback_once)

}  // namespace
