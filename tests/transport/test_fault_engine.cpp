// The faults of transport::fault_engine, each against what it names: the error text (always
// "injected: ..."), the bytes that land and those that do not, the immediates the consumer sees,
// and every callback exactly once. Two wrapped engines in this process, tcp and shm. That the
// wrapper with nothing armed keeps the engine's contract is test_engine_contract.cpp's part.
#include <map>

#include "engine_rig.hpp"

using namespace ferry::transport;
using ferry::errc;
using ferry::result;
using namespace ferry::test;

namespace {

#define FERRY_FAULT_CASE(title, body)                                                \
  TEST_CASE("fabric fault " title " (tcp)", "[fabric][fault][tcp]") { body("tcp"); } \
  TEST_CASE("fabric fault " title " (shm)", "[fabric][fault][shm]") { body("shm"); }

using regions_probe = probe<result<std::vector<region_id>>>;
using peer_probe = probe<result<peer_handle>>;

void failed_registrations(const std::string& provider) {
  std::vector<uint8_t> a(64 << 10, 0);
  rig r(provider, flavour::wrapped);
  auto& fe = rig::faults(r.target);
  fe.arm(fault::of(fault::kind::fail_register, 2, "no memory for you"));
  auto sync = r.target->register_region(a.data(), a.size(), region_access::remote_write);
  CHECK_FALSE(sync);
  CHECK(sync.code == errc::fabric_error);
  CHECK(sync.message == "injected: no memory for you");
  auto async = std::make_shared<regions_probe>();
  r.target->register_regions({{a.data(), a.size(), region_access::remote_write}},
                             regions_probe::recorder(async));
  REQUIRE(async->wait());
  CHECK_FALSE(async->get());
  CHECK(async->get().message == "injected: no memory for you");
  CHECK(async->get().value.empty());
  // Used up: the third call registers, and its region takes writes.
  auto third = std::make_shared<regions_probe>();
  r.target->register_regions({{a.data(), a.size(), region_access::remote_write}},
                             regions_probe::recorder(third));
  REQUIRE(third->wait());
  INFO(third->get().message);
  REQUIRE(third->get());
  r.write_until_landed(r.target->describe(third->get().value.at(0)), a, 0, 0, 4096, 1);
  // Without a text the error names the call.
  fe.arm(fault::of(fault::kind::fail_register));
  CHECK(r.target->register_region(a.data(), a.size(), region_access::local).message ==
        "injected: register_region failed");
  const auto s = fe.stats();
  CHECK(s.failed_calls == 3);
  CHECK(s.calls.register_region == 2);
  CHECK(s.calls.register_regions == 2);
  CHECK(async->count() == 1);
  CHECK(third->count() == 1);
}
FERRY_FAULT_CASE("register_region and register_regions fail the next N calls", failed_registrations)

void failed_insertions(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [d, dst] = r.add_region(1 << 20);
  auto& fe = rig::faults(r.initiator);
  fe.arm(fault::of(fault::kind::fail_insert, 2, "address vector full"));
  auto sync = r.initiator->insert_peer(r.target->local_address());
  CHECK_FALSE(sync);
  CHECK(sync.message == "injected: address vector full");
  auto async = std::make_shared<peer_probe>();
  r.initiator->insert_peer_async(r.target->local_address(), peer_probe::recorder(async));
  REQUIRE(async->wait());
  CHECK(async->get().message == "injected: address vector full");
  // Used up: the next insertion answers the handle the peer already has.
  auto next = std::make_shared<peer_probe>();
  r.initiator->insert_peer_async(r.target->local_address(), peer_probe::recorder(next));
  REQUIRE(next->wait());
  INFO(next->get().message);
  REQUIRE(next->get());
  CHECK(next->get().value == r.peer);
  r.write_until_landed(r.target->describe(d), *dst, 0, 0, 4096, 1);
  CHECK(fe.stats().failed_calls == 2);
  CHECK(async->count() == 1);
  CHECK(next->count() == 1);
}
FERRY_FAULT_CASE("insert_peer and insert_peer_async fail the next N calls", failed_insertions)

void failed_batch_for_one_peer(const std::string& provider) {
  // Two targets: the fault names one of them.
  std::vector<uint8_t> other_mem(1 << 20, 0);
  rig r(provider, flavour::wrapped);
  imm_collector other_imms;
  auto other = make_engine(provider, flavour::wrapped);
  auto reg =
      other->register_region(other_mem.data(), other_mem.size(), region_access::remote_write);
  REQUIRE(reg);
  other_imms.attach(other.get());
  other->start(other_imms.callback());
  auto to_other = r.initiator->insert_peer(other->local_address());
  REQUIRE(to_other);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d), od = other->describe(reg.value);

  auto& fe = rig::faults(r.initiator);
  fe.arm(fault::of(fault::kind::fail_writes, 1, "link down").for_peer(r.peer));
  std::vector<write_op> ops;
  for (uint64_t i = 0; i < 4; ++i) ops.push_back(r.op(dd, i * 8192, i * 8192, 8192, 21));
  auto failed = r.submit(ops);
  std::vector<write_op> other_ops;
  for (uint64_t i = 0; i < 4; ++i) other_ops.push_back(r.op(od, i * 8192, i * 8192, 8192, 22));
  auto landed = r.submit(other_ops, to_other.value);
  REQUIRE(failed->wait());
  REQUIRE(landed->wait());
  const batch_result fr = failed->get(), lr = landed->get();
  CHECK_FALSE(fr.ok());
  CHECK(fr.completed == 0);
  CHECK(fr.failed == 4);
  CHECK(fr.code == errc::fabric_write_failed);
  CHECK(fr.message == "injected: link down");
  INFO(lr.message);
  CHECK(lr.ok());
  CHECK(lr.completed == 4);
  REQUIRE(other_imms.wait_count(22, 4));
  CHECK(std::memcmp(other_mem.data(), r.src.data(), 4 * 8192) == 0);
  // Used up: the same writes to the first target land now; before, nothing of them had.
  CHECK(all_zero(*dst));
  CHECK(r.imms.counts()[21] == 0);
  auto again = r.submit(ops);
  REQUIRE(again->wait());
  CHECK(again->get().ok());
  REQUIRE(r.imms.wait_count(21, 4));
  CHECK(r.same(*dst, 0, 0, 4 * 8192));
  const auto s = fe.stats();
  CHECK(s.failed_batches == 1);
  CHECK(s.failed_writes == 4);
  CHECK(s.writes_completed == 8);
  CHECK(failed->count() == 1);
  CHECK(landed->count() == 1);
  other->stop();
  other.reset();  // before its memory; the rig's target closes before its initiator
}
FERRY_FAULT_CASE("every write of a batch to one peer fails, other peers' land",
                 failed_batch_for_one_peer)

void kth_write_fails(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  auto& fe = rig::faults(r.initiator);
  // Every batch with a third write, to any peer.
  fe.arm(fault::of(fault::kind::fail_writes, fault::always, "bad completion").at_write(2));
  std::vector<write_op> ops;
  for (uint64_t i = 0; i < 4; ++i) ops.push_back(r.op(dd, i * 4096, (i + 8) * 4096, 4096, 31));
  auto t = r.submit(ops);
  auto short_batch = r.submit({r.op(dd, 65536, 0, 4096, 32), r.op(dd, 69632, 4096, 4096, 32)});
  REQUIRE(t->wait());
  REQUIRE(short_batch->wait());
  const batch_result res = t->get();
  CHECK_FALSE(res.ok());
  CHECK(res.completed == 3);
  CHECK(res.failed == 1);
  CHECK(res.message == "injected: bad completion");
  CHECK(short_batch->get().ok());  // no third write: not taken
  REQUIRE(r.imms.wait_count(31, 3));
  REQUIRE(r.imms.wait_count(32, 2));
  CHECK(r.same(*dst, 0, 8 * 4096, 2 * 4096));
  CHECK(all_zero(*dst, 2 * 4096, 4096));  // the failed write never arrived
  CHECK(r.same(*dst, 3 * 4096, 11 * 4096, 4096));
  CHECK(r.same(*dst, 65536, 0, 8192));
  CHECK(fe.stats().failed_writes == 1);
  CHECK(t->count() == 1);
}
FERRY_FAULT_CASE("the k-th write of a batch fails, the others land", kth_write_fails)

void held_immediates(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  auto& fe = rig::faults(r.target);
  fe.arm(fault::of(fault::kind::hold_immediates, fault::always).for_imm(41));
  std::vector<write_op> ops;
  for (uint64_t i = 0; i < 5; ++i) ops.push_back(r.op(dd, i * 4096, i * 4096, 4096, 41));
  for (uint64_t i = 5; i < 8; ++i) ops.push_back(r.op(dd, i * 4096, i * 4096, 4096, 42));
  auto t = r.submit(ops);
  REQUIRE(t->wait());
  CHECK(t->get().ok());
  // The bytes landed and the engine reported all 8; the consumer sees only the other value.
  REQUIRE(fe.wait_for([](const fault_stats& s) { return s.immediates_arrived == 8; }, wait_limit));
  REQUIRE(r.imms.wait_count(42, 3));
  CHECK(r.same(*dst, 0, 0, 8 * 4096));
  CHECK(r.imms.counts() == std::map<uint64_t, uint64_t>{{42, 3}});
  CHECK(fe.stats().immediates_held == 5);
  // Released, they arrive, aggregated, under the credit.
  CHECK(fe.release_immediates() == 5);
  REQUIRE(r.imms.wait_count(41, 5));
  CHECK(r.imms.counts() == std::map<uint64_t, uint64_t>{{41, 5}, {42, 3}});
  CHECK_FALSE(r.imms.duplicate_in_batch());
  CHECK(fe.stats().immediates_delivered == 8);
}
FERRY_FAULT_CASE("held immediates reach the consumer only when released", held_immediates)

void dropped_immediates(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  auto& fe = rig::faults(r.target);
  fe.arm(fault::of(fault::kind::drop_immediates, 2));
  std::vector<write_op> ops;
  for (uint64_t i = 0; i < 5; ++i) ops.push_back(r.op(dd, i * 4096, i * 4096, 4096, 51));
  auto t = r.submit(ops);
  REQUIRE(t->wait());
  CHECK(t->get().ok());
  REQUIRE(fe.wait_for([](const fault_stats& s) { return s.immediates_arrived == 5; }, wait_limit));
  REQUIRE(r.imms.wait_count(51, 3));
  // All five landed; the receiver counts three: fewer than a sender would announce.
  CHECK(r.same(*dst, 0, 0, 5 * 4096));
  const auto s = fe.stats();
  CHECK(s.immediates_dropped == 2);
  CHECK(s.immediates_delivered == 3);
  // Used up: the next write's immediate is counted.
  r.write_until_landed(dd, *dst, 65536, 0, 4096, 51);
  CHECK(r.imms.counts()[51] == 4);
}
FERRY_FAULT_CASE("dropped immediates never reach the consumer", dropped_immediates)

void held_fence(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [a, a_mem] = r.add_region(1 << 20);
  auto [b, b_mem] = r.add_region(1 << 20);
  const region_desc da = r.target->describe(a);
  auto& fe = rig::faults(r.target);
  fe.arm(fault::of(fault::kind::hold_fences).for_peer(r.back));
  done_probe fenced;
  r.target->fence_peer(r.back, {a}, fenced.callback());
  REQUIRE(fe.wait_for([](const fault_stats& s) { return s.fences_held == 1; }, wait_limit));
  // Not yet happened: the registration is open and takes a write; `done` has not run.
  CHECK(r.target->describe(a).key == da.key);
  r.write_until_landed(da, *a_mem, 0, 0, 4096, 61);
  CHECK(fenced.count() == 0);
  CHECK(fe.release_fences() == 1);
  REQUIRE(fenced.wait());
  CHECK(r.target->describe(a).length == 0);
  auto back = r.target->insert_peer(r.initiator->local_address());
  REQUIRE(back);
  r.stale_write_does_not_land(da, *a_mem, r.target->describe(b), *b_mem, 62, 63);
  CHECK(fenced.count() == 1);
  CHECK(fe.stats().fences_held == 0);
}
FERRY_FAULT_CASE("a held fence happens, and completes, only when released", held_fence)

void held_removal(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  auto& fe = rig::faults(r.initiator);
  fe.arm(fault::of(fault::kind::hold_removals));
  r.initiator->remove_peer(r.peer);
  REQUIRE(fe.wait_for([](const fault_stats& s) { return s.removals_held == 1; }, wait_limit));
  // Not yet removed: writes to the peer land.
  r.write_until_landed(dd, *dst, 0, 0, 4096, 71);
  CHECK(fe.release_removals() == 1);
  auto t = r.submit({r.op(dd, 8192, 0, 4096, 72)});
  REQUIRE(t->wait());
  CHECK_FALSE(t->get().ok());
  CHECK(t->get().message == "peer removed (peer " + std::to_string(r.peer) + ")");
  CHECK(r.imms.counts()[72] == 0);
  // shm: the peer this engine wrote to was cut, so its endpoint is renewed; a new insertion
  // writes again.
  auto p = r.initiator->insert_peer(r.target->local_address());
  REQUIRE(p);
  r.peer = p.value;
  r.write_until_landed(dd, *dst, 16384, 0, 4096, 73);
}
FERRY_FAULT_CASE("a held removal takes effect only when released", held_removal)

void stop_ends_what_is_held(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  auto& fe = rig::faults(r.target);
  fe.arm(fault::of(fault::kind::hold_fences, fault::always));
  fe.arm(fault::of(fault::kind::hold_removals, fault::always));
  r.write_until_landed(dd, *dst, 0, 0, 4096, 81);  // the path is up
  fe.arm(fault::of(fault::kind::hold_immediates, fault::always));
  auto t = r.submit({r.op(dd, 8192, 0, 4096, 82)});
  REQUIRE(t->wait());
  done_probe first, second;
  r.target->fence_peer(r.back, {}, first.callback());
  r.target->fence_peer(std::nullopt, {d}, second.callback());
  r.target->remove_peer(r.back);
  REQUIRE(fe.wait_for(
      [](const fault_stats& s) {
        return s.fences_held == 2 && s.removals_held == 1 && s.immediates_held == 1;
      },
      wait_limit));
  CHECK(first.count() == 0);
  CHECK(second.count() == 0);
  r.target->stop();
  // Each held fence was forwarded at the stop and completed once; the removal was forwarded;
  // the held immediate was discarded (the consumer is never called after stop).
  REQUIRE(first.wait());
  REQUIRE(second.wait());
  CHECK(first.count() == 1);
  CHECK(second.count() == 1);
  const auto s = fe.stats();
  CHECK(s.fences_held == 0);
  CHECK(s.removals_held == 0);
  CHECK(s.immediates_held == 0);
  CHECK(s.calls.fence_peer == 2);
  CHECK(s.calls.remove_peer == 1);
  CHECK(r.target->describe(d).length == 0);
  CHECK(r.imms.counts()[82] == 0);
  CHECK(r.same(*dst, 8192, 0, 4096));  // the write itself landed
  CHECK(t->count() == 1);
}
FERRY_FAULT_CASE("stop forwards held fences and removals, each completing once",
                 stop_ends_what_is_held)

void counts_every_call(const std::string& provider) {
  rig r(provider, flavour::wrapped);
  auto [d, dst] = r.add_region(1 << 20);
  const region_desc dd = r.target->describe(d);
  r.write_until_landed(dd, *dst, 0, 0, 4096, 91);
  auto& fi = rig::faults(r.initiator);
  auto& ft = rig::faults(r.target);
  const auto i = fi.stats().calls, t = ft.stats().calls;
  // The rig: one registration, one insertion, local_address of the other and start on each;
  // then the target's registration and description, and the write (retries add submits).
  CHECK(i.register_region == 1);
  CHECK(i.insert_peer == 1);
  CHECK(i.start == 1);
  CHECK(i.local_address == 1);
  CHECK(i.submit >= 1);
  CHECK(t.register_region == 1);
  CHECK(t.insert_peer == 1);
  CHECK(t.start == 1);
  CHECK(t.local_address == 1);
  CHECK(t.describe == 1);
  CHECK(t.return_immediate_credit >= 1);  // the collector returns each batch's credit
  CHECK(fi.stats().writes_completed == i.submit);
  CHECK(ft.stats().immediates_delivered == 1);
  CHECK(i.fence_peer + i.remove_peer + i.deregister_region + i.register_regions == 0);
}
FERRY_FAULT_CASE("counts every call by method", counts_every_call)

}  // namespace
