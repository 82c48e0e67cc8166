#pragma once
/// The rig of the engine contract tests (test_engine_contract.cpp) and of the fault tests
/// (test_fault_engine.cpp): an initiator and a target engine in this process, either the
/// libfabric engine as `engine::open` makes it or that engine inside the fault-injecting wrapper
/// (transport/fault_engine.hpp), or an engine of several rails (two bulk rails and an express
/// rail, transport/rail_engine.hpp) whose rails the two engines have exchanged, and callbacks
/// that count how often they ran.

#include <algorithm>
#include <deque>
#include <future>
#include <utility>

#include "harness.hpp"
#include "transport/engine.hpp"
#include "transport/fault_engine.hpp"

namespace ferry::test {

/// Which engine a contract test runs against.
enum class flavour { fabric, wrapped, rails };

/// Batches of at most this many bytes take the express rail of a `flavour::rails` engine.
inline constexpr uint64_t rig_express_bytes = 1 << 20;

/// The engine of `flavour` for `provider` (the test fails with the engine's error text).
inline std::unique_ptr<transport::engine> make_engine(const std::string& provider, flavour f,
                                                      uint32_t max_inflight = 64) {
  if (f == flavour::rails) return open_rails(provider, 2, rig_express_bytes, max_inflight);
  auto e = open_engine(provider, max_inflight);
  if (f == flavour::fabric) return e;
  return std::make_unique<transport::fault_engine>(std::move(e));
}

/// A completion callback's outcome and how many times it ran (the contract: exactly once).
/// Shared with the callback, so it may outlive the test's interest in it.
template <class T>
struct probe {
  std::mutex m;
  std::condition_variable cv;
  int calls = 0;
  T value{};

  static std::function<void(T)> recorder(const std::shared_ptr<probe>& p) {
    return [p](T v) {
      std::lock_guard<std::mutex> lock(p->m);
      p->value = std::move(v);
      ++p->calls;
      p->cv.notify_all();
    };
  }
  /// Wait (bounded) for the first call; false on timeout.
  bool wait(std::chrono::milliseconds limit = wait_limit) {
    std::unique_lock<std::mutex> lock(m);
    return cv.wait_for(lock, limit, [&] { return calls > 0; });
  }
  int count() {
    std::lock_guard<std::mutex> lock(m);
    return calls;
  }
  T get() {
    std::lock_guard<std::mutex> lock(m);
    return value;
  }
};

/// For callbacks without an argument (fence_peer's `done`).
struct done_probe {
  std::shared_ptr<probe<int>> p = std::make_shared<probe<int>>();
  std::function<void()> callback() const {
    return [p = p] { probe<int>::recorder(p)(1); };
  }
  bool wait(std::chrono::milliseconds limit = wait_limit) { return p->wait(limit); }
  int count() { return p->count(); }
};

using batch_probe = probe<transport::batch_result>;

/// An initiator and a target engine of one flavour in this process, both started. The initiator
/// has inserted the target (`peer`), the target the initiator (`back`, what a fence names);
/// target regions are registered after start, as a daemon registers them per peer.
struct rig {
  rig(const std::string& provider, flavour f, uint32_t max_inflight = 64)
      : provider(provider), railed(f == flavour::rails), src(4 << 20) {
    require_provider(provider);
    fill_pattern(src, 17);
    initiator = make_engine(provider, f, max_inflight);
    target = make_engine(provider, f);
    src_region =
        must(initiator->register_region(src.data(), src.size(), transport::region_access::local));
    peer = must(initiator->insert_peer(target->local_address()));
    back = must(target->insert_peer(initiator->local_address()));
    if (railed) {
      // As two Connections do: the decode (target) learns the prefill's rails first.
      REQUIRE(add_rails(*target, back, *initiator) == 2);
      REQUIRE(add_rails(*initiator, peer, *target) == 2);
    }
    imms.attach(target.get());
    target->start(imms.callback());
    initiator->start(nullptr);
  }

  /// A zeroed target buffer, registered with `access`.
  std::pair<transport::region_id, std::vector<uint8_t>*> add_region(
      uint64_t bytes, transport::region_access access = transport::region_access::remote_write) {
    mem.emplace_back(bytes, 0);
    auto r = target->register_region(mem.back().data(), bytes, access);
    INFO(r.message);
    REQUIRE(r);
    return {r.value, &mem.back()};
  }

  transport::write_op op(const transport::region_desc& dst, uint64_t dst_off, uint64_t src_off,
                         uint64_t len, uint64_t imm) const {
    return {src_region, src_off, len, dst.remote_base + dst_off, dst.key, imm};
  }

  /// Submit `ops` to `to` (default: the target) as one batch.
  std::shared_ptr<batch_probe> submit(std::vector<transport::write_op> ops,
                                      std::optional<transport::peer_handle> to = {},
                                      transport::notify mode = transport::notify::every_write,
                                      std::shared_ptr<transport::write_cancel> cancel = {}) {
    auto t = std::make_shared<batch_probe>();
    transport::write_batch b;
    b.peer = to.value_or(peer);
    b.ops = std::move(ops);
    b.done = batch_probe::recorder(t);
    b.mode = mode;
    b.cancel = std::move(cancel);
    last_notifications = initiator->submit(std::move(b));
    return t;
  }
  /// What the last `submit` said its target would count.
  uint32_t last_notifications = 0;

  bool same(const std::vector<uint8_t>& dst, uint64_t dst_off, uint64_t src_off,
            uint64_t len) const {
    return std::memcmp(dst.data() + dst_off, src.data() + src_off, len) == 0;
  }

  /// What a daemon does when the target's connection ends and a new one begins: cut the peer
  /// (on shm this renews the initiator's endpoint, ending writes a fenced target never
  /// answers), then insert it again.
  void cut_and_reinsert() {
    initiator->remove_peer(peer);
    peer = must(initiator->insert_peer(target->local_address()));
    if (railed) add_rails(*initiator, peer, *target);
  }
  /// The target's side of a new connection after it fenced the initiator: insert it (and its
  /// rails) again.
  void reinsert_back() {
    back = must(target->insert_peer(initiator->local_address()));
    if (railed) add_rails(*target, back, *initiator);
  }
  /// The notifications of a notify::batch_end batch too large for the express rail: one per
  /// bulk rail where writes are ordered (tcp), else one per write.
  uint32_t batch_end_notes(uint32_t writes) const {
    return provider == "tcp" ? (railed ? 2 : 1) : writes;
  }

  /// A valid write that must land, retried while the provider recovers its connection (tcp
  /// drops it after a rejected write; a write sent meanwhile may complete without arriving, so
  /// only its immediate proves arrival). The bytes are checked.
  void write_until_landed(const transport::region_desc& dst, const std::vector<uint8_t>& dst_mem,
                          uint64_t dst_off, uint64_t src_off, uint64_t len, uint64_t imm) {
    const auto deadline = std::chrono::steady_clock::now() + wait_limit;
    while (std::chrono::steady_clock::now() < deadline) {
      const uint64_t before = imms.counts()[imm];
      auto t = submit({op(dst, dst_off, src_off, len, imm)});
      if (!t->wait(attempt_limit) || !t->get().ok()) continue;
      if (!imms.wait_count(imm, before + 1, attempt_limit)) continue;
      CHECK(same(dst_mem, dst_off, src_off, len));
      return;
    }
    FAIL("a valid write did not land within " << wait_limit.count() << " s");
  }

  /// A write with the key of a closed registration `closed` (its memory `closed_mem`): it must
  /// not land, its immediate must not arrive, and its batch completes exactly once (tcp: OK, the
  /// write left the socket; shm: failed by the cut, as the target never answers it). A write
  /// that lands afterwards over the same path into `live` proves the target has dealt with it.
  void stale_write_does_not_land(const transport::region_desc& closed,
                                 const std::vector<uint8_t>& closed_mem,
                                 const transport::region_desc& live,
                                 const std::vector<uint8_t>& live_mem, uint64_t stale_imm,
                                 uint64_t live_imm) {
    const std::vector<uint8_t> before = closed_mem;
    auto stale = submit({op(closed, 0, 1 << 20, 65536, stale_imm)});
    if (provider == "shm") cut_and_reinsert();
    write_until_landed(live, live_mem, 0, 0, 4096, live_imm);
    REQUIRE(stale->wait());
    CHECK(stale->count() == 1);
    if (provider == "shm") {
      CHECK_FALSE(stale->get().ok());
      CHECK_THAT(stale->get().message,
                 Catch::Contains("fabric endpoint renewed") || Catch::Contains("peer removed"));
    }
    CHECK(closed_mem == before);
    CHECK(imms.counts()[stale_imm] == 0);
  }

  /// The wrapper around engine `e` (the test fails if `e` is not wrapped).
  static transport::fault_engine& faults(std::unique_ptr<transport::engine>& e) {
    auto* f = dynamic_cast<transport::fault_engine*>(e.get());
    REQUIRE(f != nullptr);
    return *f;
  }

  static constexpr std::chrono::milliseconds attempt_limit{500};

  std::string provider;
  bool railed = false;  ///< flavour::rails: both engines have exchanged their rails
  // Buffers first: the engines (declared after them) close before the memory goes away.
  std::vector<uint8_t> src;
  std::deque<std::vector<uint8_t>> mem;  // deque: stable addresses
  imm_collector imms;
  std::unique_ptr<transport::engine> initiator;
  std::unique_ptr<transport::engine> target;  // declared last: closed first (shm, test_engine)
  transport::region_id src_region = 0;
  transport::peer_handle peer = 0, back = 0;
};

}  // namespace ferry::test
