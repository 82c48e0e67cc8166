// Registrations under the fence, over real transport::engine and libfabric on loopback, for tcp
// and shm: a region registered after start receives writes; the per-peer registrations of one
// pool (the daemon's scheme) fence independently; keys are random, ids are never reused, and a
// deregistered source fails its batch. The rejection of writes is test_fencing.cpp's subject.
#include <cstring>
#include <deque>
#include <map>
#include <set>

#include "fence_rig.hpp"
#include "harness.hpp"
#include "transport/engine.hpp"

using namespace ferry::transport;
using namespace ferry::test;

namespace {

void registered_after_start_receives(const std::string& provider, bool rails) {
  fence_rig rig(provider, rails);
  auto [a_id, a_mem] = rig.add_region(1 << 20, region_access::remote_write);
  const region_desc a = rig.target->describe(a_id);
  CHECK(a.length == (1u << 20));
  CHECK(a.key != 0);
  // Inline/inject-sized and larger writes, from both initiators, each with its own imm.
  auto w1 = rig.write(1, a, 0, 0, 64, 11);
  auto w2 = rig.write(1, a, 4096, 8192, 65536, 12);
  auto w3 = rig.write(2, a, 131072, 0, 262144, 13);
  for (auto* w : {&w1, &w2, &w3}) {
    REQUIRE((*w)->wait());
    INFO((*w)->get().message);
    CHECK((*w)->get().ok());
  }
  REQUIRE(rig.imms.wait_total(3));
  CHECK(rig.imms.counts() == std::map<uint64_t, uint64_t>{{11, 1}, {12, 1}, {13, 1}});
  CHECK(std::memcmp(a_mem->data(), rig.src1.data(), 64) == 0);
  CHECK(std::memcmp(a_mem->data() + 4096, rig.src1.data() + 8192, 65536) == 0);
  CHECK(std::memcmp(a_mem->data() + 131072, rig.src2.data(), 262144) == 0);
}
FERRY_FENCE_CASE("a region registered after start receives writes", registered_after_start_receives)

void per_peer_registrations_fence_independently(const std::string& provider, bool rails) {
  // The daemon's scheme: one pool, registered once per peer; fencing one peer closes only its
  // registration.
  fence_rig rig(provider, rails);
  rig.mem.emplace_back(1 << 20, 0);
  std::vector<uint8_t>& pool = rig.mem.back();
  auto r1 = rig.target->register_region(pool.data(), pool.size(), region_access::remote_write);
  auto r2 = rig.target->register_region(pool.data(), pool.size(), region_access::remote_write);
  INFO(r1.message << r2.message);
  REQUIRE(r1);
  REQUIRE(r2);
  const region_desc d1 = rig.target->describe(r1.value);
  const region_desc d2 = rig.target->describe(r2.value);
  CHECK(d1.key != d2.key);
  CHECK(d1.remote_base == d2.remote_base);

  rig.write_until_landed(1, d1, pool, 0, 0, 4096, 21);
  rig.write_until_landed(2, d2, pool, 65536, 0, 4096, 22);
  REQUIRE(rig.target->deregister_region(r1.value));
  const std::vector<uint8_t> before = pool;
  auto stale = rig.write(1, d1, 131072, 8192, 4096, 23);
  if (provider == "shm") rig.cut_and_reinsert();  // shm never answers the rejected write
  REQUIRE(stale->wait());
  // Peer 2's registration of the same memory is untouched by the fence.
  rig.write_until_landed(2, d2, pool, 196608, 0, 4096, 24);
  // Peer 1 is back too (with a registration it would get after re-handshaking).
  auto r3 = rig.target->register_region(pool.data(), pool.size(), region_access::remote_write);
  REQUIRE(r3);
  const region_desc d3 = rig.target->describe(r3.value);
  CHECK(d3.key != d1.key);
  rig.write_until_landed(1, d3, pool, 262144, 0, 4096, 25);
  CHECK(rig.imms.counts()[23] == 0);
  CHECK(std::memcmp(pool.data() + 131072, before.data() + 131072, 4096) == 0);
  CHECK(all_zero(std::vector<uint8_t>(pool.begin() + 131072, pool.begin() + 135168)));
}
FERRY_FENCE_CASE("per-peer registrations of one pool fence independently",
                 per_peer_registrations_fence_independently)

void keys_random_ids_never_reused(const std::string& provider, bool rails) {
  require_provider(provider);
  std::deque<std::vector<uint8_t>> mem;
  batch_waiter done;
  imm_collector imms;
  std::vector<uint8_t> dst(1 << 20, 0);
  auto target = open_fence_engine(provider, rails);
  auto e = open_fence_engine(provider, rails);
  auto add = [&](region_access access) {
    mem.emplace_back(65536, 0);
    auto r = e->register_region(mem.back().data(), mem.back().size(), access);
    INFO(r.message);
    REQUIRE(r);
    return r.value;
  };
  // Before start (direct path).
  std::vector<region_id> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back(add(i % 2 ? region_access::local : region_access::remote_write));
  }
  std::set<uint64_t> keys;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint64_t k = e->describe(ids[i]).key;
    CHECK(k != 0);
    keys.insert(k);
    if (i > 0) {
      const uint64_t prev = e->describe(ids[i - 1]).key;
      // Not a counter: far apart, and the high halves differ (equal with chance 2^-32).
      CHECK((k > prev ? k - prev : prev - k) > 1);
      CHECK((k >> 32) != (prev >> 32));
    }
  }
  CHECK(keys.size() == ids.size());

  // Deregistration before start; ids are never reused; errors for unknown ids.
  auto d = e->deregister_region(ids[0]);
  INFO(d.message);
  REQUIRE(d);
  CHECK(d.value);
  CHECK(e->describe(ids[0]).key == 0);
  CHECK(e->describe(ids[0]).length == 0);
  const region_id fresh = add(region_access::remote_write);
  CHECK(fresh > ids.back());
  CHECK(keys.count(e->describe(fresh).key) == 0);
  auto unknown = e->deregister_region(fresh + 1000);
  CHECK_FALSE(unknown);
  CHECK_THAT(unknown.message, Catch::Contains("unknown region"));
  CHECK(e->describe(fresh + 1000).key == 0);

  // After start: a deregistered local source fails its batch with a clear error; the engine
  // keeps working for live sources.
  auto t = target->register_region(dst.data(), dst.size(), region_access::remote_write);
  REQUIRE(t);
  const region_desc dd = target->describe(t.value);
  auto peer = e->insert_peer(target->local_address());
  REQUIRE(peer);
  imms.attach(target.get());
  target->start(imms.callback());
  e->start(nullptr);
  const region_id src = ids[1];  // a local-access region
  const region_id late = add(region_access::local);
  CHECK(late > fresh);
  auto d2 = e->deregister_region(src);
  REQUIRE(d2);
  CHECK(d2.value);
  auto d3 = e->deregister_region(src);
  CHECK(d3);
  CHECK_FALSE(d3.value);
  write_batch bad;
  bad.peer = peer.value;
  bad.ops = {write_op{src, 0, 4096, dd.remote_base, dd.key, 1}};
  bad.done = done.callback();
  e->submit(std::move(bad));
  write_batch good;
  good.peer = peer.value;
  good.ops = {write_op{late, 0, 4096, dd.remote_base + 8192, dd.key, 2}};
  good.done = done.callback();
  e->submit(std::move(good));
  REQUIRE(done.wait(2));
  int deregistered = 0, fine = 0;
  for (const auto& r : done.results()) {
    if (!r.ok()) {
      CHECK_THAT(r.message,
                 Catch::Contains("local region " + std::to_string(src) + " is deregistered"));
      CHECK(r.failed == 1);
      CHECK(r.completed == 0);
      ++deregistered;
    } else {
      ++fine;
    }
  }
  CHECK(deregistered == 1);
  CHECK(fine == 1);
  REQUIRE(imms.wait_count(2, 1));
  CHECK(imms.counts()[1] == 0);
  e->stop();
  target->stop();
}
FERRY_FENCE_CASE("keys are random, ids are never reused, a closed source fails its batch",
                 keys_random_ids_never_reused)

}  // namespace
