// Rails (transport/rail_engine.hpp): an engine of several endpoints, each with its own progress
// thread, over real libfabric on loopback, for tcp and shm. What the engine contract does not
// say by itself: a batch is striped across the bulk rails a peer shares and lands byte for byte
// with one notification per rail part; a small batch takes the express rail; arrived
// immediates of every rail reach the consumer under one credit; engines with different rail
// counts use the rails both have; a removal ends the peer on every rail; and on shm a cut
// renews every rail that wrote to the peer. The contract and fence tests run against rails too
// (test_engine_contract.cpp, fence_rig.hpp).
#include <map>

#include "engine_pair.hpp"
#include "engine_rig.hpp"

using namespace ferry::transport;
using namespace ferry::test;

namespace {

/// Writes posted on each rail so far, by rail name.
std::map<std::string, uint64_t> posted(const engine& e) {
  std::map<std::string, uint64_t> out;
  for (const auto& r : e.rail_activity()) out[r.name] = r.writes_posted;
  return out;
}

/// `count` writes of `len` bytes from the rig's source into `dst` from `dst_off`, one batch.
std::vector<write_op> writes(const rig& r, const region_desc& dst, uint64_t dst_off, uint64_t len,
                             uint64_t count, uint64_t imm) {
  std::vector<write_op> ops;
  for (uint64_t i = 0; i < count; ++i)
    ops.push_back(r.op(dst, dst_off + i * len, (i * len) % (r.src.size() - len + 1), len, imm));
  return ops;
}

bool lands(rig& r, const std::vector<write_op>& ops, const region_desc& dst,
           const std::vector<uint8_t>& mem) {
  for (const auto& o : ops)
    if (!r.same(mem, o.remote_addr - dst.remote_base, o.local_offset, o.length)) return false;
  return true;
}

void striped_and_express(const std::string& provider) {
  rig r(provider, flavour::rails);
  CHECK(r.initiator->rails().size() == 3);
  CHECK(r.initiator->rails()[2].express);
  CHECK(r.initiator->peer_rails(r.peer) == std::vector<uint32_t>{0, 1, 2});
  auto [d, dst] = r.add_region(16 << 20);
  const region_desc dd = r.target->describe(d);

  // 12 writes of 1 MiB: striped over the two bulk rails, one notification per rail on tcp.
  const auto before = posted(*r.initiator);
  const auto big = writes(r, dd, 0, 1 << 20, 12, 70);
  auto t = r.submit(big, {}, notify::batch_end);
  CHECK(r.last_notifications == r.batch_end_notes(12));
  REQUIRE(r.imms.wait_count(70, r.last_notifications));
  REQUIRE(t->wait());
  CHECK(t->get().ok());
  CHECK(t->get().completed == r.last_notifications);
  CHECK(lands(r, big, dd, *dst));
  auto after = posted(*r.initiator);
  CHECK(after["0"] - before.at("0") >= 6);
  CHECK(after["1"] - before.at("1") >= 6);
  CHECK(after["express"] == before.at("express"));

  // A batch of at most the express bytes goes whole on the express rail.
  const auto small = writes(r, dd, 14 << 20, 4096, 16, 71);
  auto s = r.submit(small, {}, notify::batch_end);
  CHECK(r.last_notifications == (provider == "tcp" ? 1u : 16u));
  REQUIRE(r.imms.wait_count(71, r.last_notifications));
  REQUIRE(s->wait());
  CHECK(s->get().ok());
  CHECK(lands(r, small, dd, *dst));
  const auto last = posted(*r.initiator);
  CHECK(last.at("0") == after["0"]);
  CHECK(last.at("1") == after["1"]);
  CHECK(last.at("express") > after["express"]);
  CHECK(t->count() == 1);
  CHECK(s->count() == 1);
}
FERRY_FABRIC_CASE("rails: a batch is striped across the bulk rails, a small one takes express",
                  striped_and_express)

void one_credit_across_rails(const std::string& provider) {
  // A consumer that keeps the credit: whichever rail its immediates arrive on, it gets one
  // batch until it gives the credit back.
  require_provider(provider);
  std::vector<uint8_t> src(8 << 20), dst(8 << 20, 0);
  fill_pattern(src, 3);
  imm_collector imms(false);
  auto initiator = open_rails(provider, 2, 1 << 20);
  auto target = open_rails(provider, 2, 1 << 20);
  const auto s = must(initiator->register_region(src.data(), src.size(), region_access::local));
  const auto d = must(target->register_region(dst.data(), dst.size(), region_access::remote_write));
  const region_desc dd = target->describe(d);
  const auto peer = must(initiator->insert_peer(target->local_address()));
  const auto back = must(target->insert_peer(initiator->local_address()));
  REQUIRE(add_rails(*target, back, *initiator) == 2);
  REQUIRE(add_rails(*initiator, peer, *target) == 2);
  imms.attach(target.get());
  target->start(imms.callback());
  initiator->start(nullptr);

  // Rounds of a striped batch (8 x 512 KiB, imm 10 + round) and a small one on the express
  // rail (imm 20 + round): every round reaches all three rails.
  batch_waiter done;
  uint64_t expected = 0;
  std::map<uint64_t, uint64_t> want;
  for (uint64_t round = 0; round < 4; ++round) {
    write_batch big, small;
    big.peer = small.peer = peer;
    for (uint64_t i = 0; i < 8; ++i)
      big.ops.push_back({s, i << 19, 1 << 19, dd.remote_base + (i << 19), dd.key, 10 + round});
    small.ops.push_back({s, 0, 4096, dd.remote_base + (round << 12), dd.key, 20 + round});
    big.done = done.callback();
    small.done = done.callback();
    want[10 + round] += 8;
    want[20 + round] += 1;
    expected += 9;
    initiator->submit(std::move(big));
    initiator->submit(std::move(small));
  }
  REQUIRE(done.wait(8));
  for (const auto& r : done.results()) CHECK(r.ok());
  REQUIRE(imms.wait_callbacks(1));
  // The credit is held: however many rails have had arrivals since, no second batch.
  REQUIRE(imms.wait_until([](uint64_t, int callbacks) { return callbacks >= 1; }));
  CHECK(imms.callbacks() == 1);
  // Given back, what arrived meanwhile comes aggregated, one value once per batch.
  for (int k = 1; k < 64 && imms.total() < expected; ++k) {
    target->return_immediate_credit();
    REQUIRE(imms.wait_until(
        [&](uint64_t total, int callbacks) { return callbacks > k || total >= expected; }));
  }
  CHECK(imms.total() == expected);
  CHECK(imms.counts() == want);
  CHECK_FALSE(imms.duplicate_in_batch());
  initiator->stop();
  target->stop();
}
FERRY_FABRIC_CASE("rails: arrived immediates of every rail reach the consumer under one credit",
                  one_credit_across_rails)

void different_rail_counts(const std::string& provider) {
  // Three bulk rails and express against two bulk rails without: the rails both have (0 and
  // 1) carry the writes; rail 2 and express have no partner.
  require_provider(provider);
  std::vector<uint8_t> src(8 << 20), dst(8 << 20, 0);
  fill_pattern(src, 4);
  imm_collector imms;
  auto initiator = open_rails(provider, 3, 1 << 20);
  auto target = open_rails(provider, 2, 0);
  const auto s = must(initiator->register_region(src.data(), src.size(), region_access::local));
  const auto d = must(target->register_region(dst.data(), dst.size(), region_access::remote_write));
  const region_desc dd = target->describe(d);
  const auto peer = must(initiator->insert_peer(target->local_address()));
  const auto back = must(target->insert_peer(initiator->local_address()));
  CHECK(add_rails(*target, back, *initiator) == 1);
  CHECK(add_rails(*initiator, peer, *target) == 1);
  CHECK(initiator->peer_rails(peer) == std::vector<uint32_t>{0, 1});
  imms.attach(target.get());
  target->start(imms.callback());
  initiator->start(nullptr);
  batch_waiter done;
  write_batch big, small;
  big.peer = small.peer = peer;
  for (uint64_t i = 0; i < 6; ++i)
    big.ops.push_back({s, i << 20, 1 << 20, dd.remote_base + (i << 20), dd.key, 1});
  small.ops.push_back({s, 7 << 20, 4096, dd.remote_base + (7 << 20), dd.key, 2});
  big.done = done.callback();
  small.done = done.callback();
  initiator->submit(std::move(big));
  initiator->submit(std::move(small));
  REQUIRE(done.wait(2));
  for (const auto& r : done.results()) CHECK(r.ok());
  REQUIRE(imms.wait_count(1, 6));
  REQUIRE(imms.wait_count(2, 1));
  CHECK(std::memcmp(dst.data(), src.data(), 6 << 20) == 0);
  CHECK(std::memcmp(dst.data() + (7 << 20), src.data() + (7 << 20), 4096) == 0);
  const auto p = posted(*initiator);
  CHECK(p.at("0") > 0);
  CHECK(p.at("1") > 0);
  CHECK(p.at("2") == 0);
  CHECK(p.at("express") == 0);
  initiator->stop();
  target->stop();
}
FERRY_FABRIC_CASE("rails: engines with different rail counts use the rails both have",
                  different_rail_counts)

void removal_ends_every_rail(const std::string& provider) {
  rig r(provider, flavour::rails);
  auto [d, dst] = r.add_region(8 << 20);
  const region_desc dd = r.target->describe(d);
  r.write_until_landed(dd, *dst, 0, 0, 4096, 1);  // express
  r.initiator->remove_peer(r.peer);
  // Large (striped) and small (express): both fail naming the peer, nothing lands.
  auto big = r.submit(writes(r, dd, 1 << 20, 1 << 20, 4, 2));
  auto small = r.submit(writes(r, dd, 6 << 20, 4096, 2, 3));
  for (auto* t : {&big, &small}) {
    REQUIRE((*t)->wait());
    CHECK_FALSE((*t)->get().ok());
    CHECK((*t)->get().message == "peer removed (peer " + std::to_string(r.peer) + ")");
  }
  CHECK(r.initiator->peer_rails(r.peer) == std::vector<uint32_t>{0});
  CHECK(all_zero(*dst, 1 << 20));
  // A new connection: inserted again with its rails, the peer stripes again.
  r.peer = must(r.initiator->insert_peer(r.target->local_address()));
  REQUIRE(add_rails(*r.initiator, r.peer, *r.target) == 2);
  CHECK(r.initiator->peer_rails(r.peer) == std::vector<uint32_t>{0, 1, 2});
  const auto again = writes(r, dd, 1 << 20, 1 << 20, 4, 4);
  auto t = r.submit(again);
  REQUIRE(r.imms.wait_count(4, 4));
  REQUIRE(t->wait());
  CHECK(t->get().ok());
  CHECK(lands(r, again, dd, *dst));
  CHECK(r.imms.counts()[2] == 0);
  CHECK(r.imms.counts()[3] == 0);
}
FERRY_FABRIC_CASE("rails: removing a peer ends it on every rail, and added again it stripes again",
                  removal_ends_every_rail)

}  // namespace

TEST_CASE("fabric rails shm: a cut renews every rail that wrote to the peer, and writes go on",
          "[fabric][shm][rails]") {
  // A fenced target never answers a rejected write (test_fencing.cpp); with rails, each rail's
  // endpoint is wedged by its own rejected writes and renewed at the cut on its own.
  rig r("shm", flavour::rails);
  auto [b, b_mem] = r.add_region(8 << 20);
  auto [a, a_mem] = r.add_region(8 << 20);
  const region_desc db = r.target->describe(b), da = r.target->describe(a);
  // Every rail has written to the target (shm maps a peer at its first write).
  r.write_until_landed(db, *b_mem, 0, 0, 65536, 1);
  auto first = r.submit(writes(r, db, 1 << 20, 1 << 20, 4, 6));
  REQUIRE(r.imms.wait_count(6, 4));
  REQUIRE(first->wait());
  REQUIRE(r.target->deregister_region(a));
  // Rejected on every rail: a striped batch (rails 0 and 1) and a small one (express).
  auto big = r.submit(writes(r, da, 0, 1 << 20, 4, 2));
  auto small = r.submit(writes(r, da, 6 << 20, 65536, 2, 3));
  {
    // Every rail's progress thread has taken (and posted) them once a call queued behind them
    // on every rail has answered.
    auto taken = std::make_shared<probe<ferry::result<std::vector<region_id>>>>();
    r.initiator->register_regions({},
                                  probe<ferry::result<std::vector<region_id>>>::recorder(taken));
    REQUIRE(taken->wait());
  }
  r.cut_and_reinsert();  // renews the rails that wrote, then adds the target's rails again
  for (auto* t : {&big, &small}) {
    REQUIRE((*t)->wait());
    CHECK_FALSE((*t)->get().ok());
    CHECK_THAT((*t)->get().message, Catch::Contains("fabric endpoint renewed"));
  }
  // (Failed by the renewal of the rails that carried them: rails 0 and 1 for the large batch,
  // express for the small one.) Every rail writes again.
  const auto again = writes(r, db, 2 << 20, 1 << 20, 4, 4);
  auto t = r.submit(again);
  REQUIRE(r.imms.wait_count(4, 4));
  REQUIRE(t->wait());
  CHECK(t->get().ok());
  CHECK(lands(r, again, db, *b_mem));
  r.write_until_landed(db, *b_mem, 7 << 20, 0, 4096, 5);
  CHECK(all_zero(*a_mem));
  CHECK(r.imms.counts()[2] == 0);
  CHECK(r.imms.counts()[3] == 0);
}
