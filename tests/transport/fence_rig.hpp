#pragma once
/// The rig of the fence tests (test_fencing.cpp, test_fence_registrations.cpp,
/// test_fence_late_writes.cpp): a target engine and two initiator engines in this process, target
/// regions registered after start as the daemon registers them per peer, batches tracked with
/// their completion time, and one test body per provider, run with one endpoint per engine and
/// with rails (two bulk rails and an express rail each, rails exchanged as two Connections do).
/// Measurements are printed as Catch warnings with FERRY_FENCE_REPORT=1 and never asserted.

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "harness.hpp"
#include "transport/engine.hpp"

namespace ferry::test {

/// Register one test body for each provider, with one endpoint and with rails, as separate test
/// cases so a missing provider skips only its own cases.
#define FERRY_FENCE_CASE(title, body)                                                       \
  TEST_CASE("fabric fence " title " (tcp)", "[fabric][fence][tcp]") { body("tcp", false); } \
  TEST_CASE("fabric fence " title " (shm)", "[fabric][fence][shm]") { body("shm", false); } \
  TEST_CASE("fabric fence " title " (tcp, rails)", "[fabric][fence][tcp][rails]") {         \
    body("tcp", true);                                                                      \
  }                                                                                         \
  TEST_CASE("fabric fence " title " (shm, rails)", "[fabric][fence][shm][rails]") {         \
    body("shm", true);                                                                      \
  }

/// With rails: batches of at most this many bytes take the express rail.
inline constexpr uint64_t fence_express_bytes = 65536;

/// An engine for a fence test: one endpoint, or two bulk rails and an express rail.
inline std::unique_ptr<transport::engine> open_fence_engine(const std::string& provider,
                                                            bool rails) {
  return rails ? open_rails(provider, 2, fence_express_bytes) : open_engine(provider);
}

using clock_type = std::chrono::steady_clock;

inline double ms_since(clock_type::time_point t0, clock_type::time_point t1) {
  return std::chrono::duration<double, std::milli>(t1 - t0).count();
}

/// Measurements for the design notes: printed only with FERRY_FENCE_REPORT set, never asserted.
inline bool reporting() { return std::getenv("FERRY_FENCE_REPORT") != nullptr; }
#define FENCE_REPORT(msg)       \
  do {                          \
    if (reporting()) WARN(msg); \
  } while (false)

/// One submitted batch; shared with its callback so it may outlive the test's interest in it.
struct tracked {
  std::mutex m;
  std::condition_variable cv;
  bool done = false;
  transport::batch_result result;
  clock_type::time_point submitted = clock_type::now();
  clock_type::time_point finished;

  /// A batch's `done` callback that records into `t` (and keeps it alive).
  static std::function<void(transport::batch_result)> recorder(std::shared_ptr<tracked> t) {
    return [t](transport::batch_result r) {
      std::lock_guard<std::mutex> lock(t->m);
      t->result = std::move(r);
      t->done = true;
      t->cv.notify_all();
    };
  }

  bool wait(std::chrono::milliseconds limit = wait_limit) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, limit, [&] { return done; });
  }
  bool is_done() {
    std::lock_guard<std::mutex> lock(m);
    return done;
  }
  transport::batch_result get() {
    std::lock_guard<std::mutex> lock(m);
    return result;
  }
  double latency_ms() {
    std::lock_guard<std::mutex> lock(m);
    return ms_since(submitted, finished);
  }
};

/// A target engine and two initiator engines in this process. Target regions are registered
/// after all three engines started (the daemon registers per-peer regions at connect time).
struct fence_rig {
  explicit fence_rig(const std::string& provider, bool rails = false)
      : provider(provider), rails(rails), src1(4 << 20), src2(4 << 20) {
    require_provider(provider);
    fill_pattern(src1, 11);
    fill_pattern(src2, 22);
    init1 = open_fence_engine(provider, rails);
    init2 = open_fence_engine(provider, rails);
    target = open_fence_engine(provider, rails);
    src1_region =
        must(init1->register_region(src1.data(), src1.size(), transport::region_access::local));
    src2_region =
        must(init2->register_region(src2.data(), src2.size(), transport::region_access::local));
    peer1 = must(init1->insert_peer(target->local_address()));
    peer2 = must(init2->insert_peer(target->local_address()));
    if (rails) {
      // The target knows the initiators on every rail (to cut them), then they learn its rails.
      back1 = must(target->insert_peer(init1->local_address()));
      back2 = must(target->insert_peer(init2->local_address()));
      REQUIRE(add_rails(*target, back1, *init1) == 2);
      REQUIRE(add_rails(*target, back2, *init2) == 2);
      REQUIRE(add_rails(*init1, peer1, *target) == 2);
      REQUIRE(add_rails(*init2, peer2, *target) == 2);
    }
    imms.attach(target.get());
    target->start(imms.callback());
    init1->start(nullptr);
    init2->start(nullptr);
  }

  /// A zeroed target buffer registered (after start) with `access`.
  std::pair<transport::region_id, std::vector<uint8_t>*> add_region(
      uint64_t bytes, transport::region_access access) {
    mem.emplace_back(bytes, 0);
    auto r = target->register_region(mem.back().data(), bytes, access);
    INFO(r.message);
    REQUIRE(r);
    return {r.value, &mem.back()};
  }

  /// Write [src_off, src_off+len) of initiator `which` (1 or 2) to `dst.remote_base + dst_off`
  /// with `dst.key`.
  std::shared_ptr<tracked> write(int which, const transport::region_desc& dst, uint64_t dst_off,
                                 uint64_t src_off, uint64_t len, uint64_t imm) {
    auto t = std::make_shared<tracked>();
    transport::write_batch b;
    b.peer = which == 1 ? peer1 : peer2;
    b.ops.push_back(transport::write_op{which == 1 ? src1_region : src2_region, src_off, len,
                                        dst.remote_base + dst_off, dst.key, imm});
    b.done = [t](transport::batch_result r) {
      std::lock_guard<std::mutex> lock(t->m);
      t->result = std::move(r);
      t->finished = clock_type::now();
      t->done = true;
      t->cv.notify_all();
    };
    (which == 1 ? init1 : init2)->submit(std::move(b));
    return t;
  }

  const std::vector<uint8_t>& src(int which) const { return which == 1 ? src1 : src2; }

  /// What ferryd does when initiator 1's connection to the target ends and a new one begins:
  /// cut the peer (on shm this renews initiator 1's endpoint), then insert it again.
  void cut_and_reinsert() {
    init1->remove_peer(peer1);
    peer1 = must(init1->insert_peer(target->local_address()));
    if (rails) add_rails(*init1, peer1, *target);
  }

  /// Writes of `len` bytes into `dst` from initiator `which`, `count` of them back to back from
  /// `dst_off` (source offsets wrap in its buffer), as one batch: striped across the bulk rails
  /// with rails.
  std::shared_ptr<tracked> write_many(int which, const transport::region_desc& dst,
                                      uint64_t dst_off, uint64_t len, uint64_t count,
                                      uint64_t imm) {
    auto t = std::make_shared<tracked>();
    transport::write_batch b;
    b.peer = which == 1 ? peer1 : peer2;
    const auto& s = src(which);
    for (uint64_t i = 0; i < count; ++i)
      b.ops.push_back(transport::write_op{which == 1 ? src1_region : src2_region,
                                          (i * len) % (s.size() - len + 1), len,
                                          dst.remote_base + dst_off + i * len, dst.key, imm});
    b.done = tracked::recorder(t);
    (which == 1 ? init1 : init2)->submit(std::move(b));
    return t;
  }

  /// A valid write (to a live region) that must land: retried while the provider recovers its
  /// connection (tcp tears it down after a rejected write). Returns the attempts it took.
  int write_until_landed(int which, const transport::region_desc& dst,
                         const std::vector<uint8_t>& dst_mem, uint64_t dst_off, uint64_t src_off,
                         uint64_t len, uint64_t imm, std::vector<std::string>* errors = nullptr) {
    const auto deadline = clock_type::now() + wait_limit;
    for (int attempt = 1; clock_type::now() < deadline; ++attempt) {
      const uint64_t before = imms.counts()[imm];
      auto t = write(which, dst, dst_off, src_off, len, imm);
      if (!t->wait(attempt_limit)) {
        if (errors) errors->push_back("batch not done within attempt limit");
        continue;
      }
      const transport::batch_result r = t->get();
      if (r.ok()) {
        // tcp: a write sent just before the target dropped the connection completes locally
        // (it left the socket) but never arrives; only the immediate proves arrival.
        if (!imms.wait_count(imm, before + 1, attempt_limit)) {
          if (errors) errors->push_back("batch ok but its immediate never arrived");
          continue;
        }
        CHECK(std::memcmp(dst_mem.data() + dst_off, src(which).data() + src_off, len) == 0);
        return attempt;
      }
      if (errors) errors->push_back(r.message);
    }
    FAIL("a valid write did not land within " << wait_limit.count() << " s");
    return 0;
  }

  /// Bound of one attempt of write_until_landed (a lost write is retried after it).
  static constexpr std::chrono::milliseconds attempt_limit{500};
  /// A fence not done by then, on shm with the writer stopped, is held up by the writer (it
  /// stopped inside the provider's critical section); unloaded it takes milliseconds.
  static constexpr std::chrono::seconds stall_limit{5};

  std::string provider;
  bool rails = false;  ///< two bulk rails and an express rail per engine
  // Buffers first: the engines (declared after them) close before the memory goes away.
  std::vector<uint8_t> src1, src2;
  std::deque<std::vector<uint8_t>> mem;  // deque: stable addresses
  imm_collector imms;
  std::unique_ptr<transport::engine> init1, init2;
  // Declared last: closed first (see the shm note in test_engine.cpp).
  std::unique_ptr<transport::engine> target;
  transport::region_id src1_region = 0, src2_region = 0;
  transport::peer_handle peer1 = 0, peer2 = 0;
  transport::peer_handle back1 = 0, back2 = 0;  ///< with rails: the initiators at the target
};

}  // namespace ferry::test
