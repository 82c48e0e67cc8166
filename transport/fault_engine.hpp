#pragma once
/// A `transport::engine` that wraps another one (and owns it): every call is counted and
/// forwarded, except where a fault a test armed takes it. In-process tests reach the failure,
/// drain and fence paths with it, without a second process, a signal or a pulled cable
/// (docs/reliability.md, "Failure paths in one process").
///
/// Faults are plain data (`fault`), armed at run time from any thread (`arm`); several may be
/// armed at once, and each applies to the next `times` calls, batches or immediates it matches,
/// in the order they were armed. Every error the wrapper injects says so: its text starts with
/// "injected: ". Without faults armed the wrapper keeps the engine's contract (engine.hpp), with
/// two differences of thread: arrived immediates reach the consumer on the wrapper's delivery
/// thread (still one batch per credit, aggregated per value), and a call failed by a fault
/// answers on the caller's thread (as the engine does when it is not running).
///
/// Every callback still runs exactly once: `stop` forwards whatever is held (fences and
/// removals, so their completions run) and discards held immediates.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "transport/engine.hpp"

namespace ferry::transport {

/// One fault to inject. Which fields apply depends on `what`; the others are ignored.
struct fault {
  enum class kind : uint8_t {
    fail_register,    ///< register_region / register_regions fail with `message`
    fail_insert,      ///< insert_peer / insert_peer_async fail with `message`
    fail_writes,      ///< a batch's writes (all, or the one at index `write`) fail with `message`
                      ///< and are never posted: their bytes and immediates never arrive. A
                      ///< notify::batch_end batch fails whole (one notification covers all of
                      ///< its writes, so none may arrive for a batch missing one)
    hold_immediates,  ///< arrived immediates are kept from the consumer until
                      ///< `release_immediates`
    drop_immediates,  ///< arrived immediates are discarded: the consumer sees fewer than landed
    hold_fences,      ///< fence_peer is held, not forwarded, until `release_fences`
    hold_removals,    ///< remove_peer is held, not forwarded, until `release_removals`
    corrupt_writes,   ///< a batch's writes (all, or the one at index `write`) read their
                      ///< source one byte off (from local_offset - 1; + 1 at offset 0): they
                      ///< land wrong bytes and complete as if all were well, which only an
                      ///< end-to-end checksum catches
  };
  /// `times` without a limit.
  static constexpr uint32_t always = UINT32_MAX;

  kind what = kind::fail_writes;
  /// How many it takes: calls (fail_register, fail_insert, hold_fences, hold_removals), batches
  /// (fail_writes) or immediates, one per write (hold_immediates, drop_immediates).
  uint32_t times = 1;
  /// fail_*: the error's message after "injected: "; empty: "<call> failed" (e.g.
  /// "register_regions failed", "write failed").
  std::string message;
  /// fail_*: the error's code; ok: what the real engine gives such a failure (fabric_error for a
  /// call, fabric_write_failed for a write).
  errc code = errc::ok;
  /// fail_writes, corrupt_writes: only batches to this peer; hold_fences / hold_removals: only
  /// calls naming it. Empty: every peer.
  std::optional<peer_handle> peer;
  /// fail_writes, corrupt_writes: only the write at this index of a batch (a batch with fewer
  /// writes is not taken); empty: every write of the batch.
  std::optional<uint32_t> write;
  /// hold_immediates / drop_immediates: only immediates of this value; empty: every value.
  std::optional<uint64_t> imm;

  /// Shorthands (GCC warns about aggregates initialised in part), e.g.
  /// `fault::of(fault::kind::fail_writes, 1, "link down").for_peer(p).at_write(2)`.
  static fault of(kind what, uint32_t times = 1, std::string message = {}) {
    fault f;
    f.what = what;
    f.times = times;
    f.message = std::move(message);
    return f;
  }
  fault with_code(errc c) const {
    fault f = *this;
    f.code = c;
    return f;
  }
  fault for_peer(peer_handle p) const {
    fault f = *this;
    f.peer = p;
    return f;
  }
  fault at_write(uint32_t index) const {
    fault f = *this;
    f.write = index;
    return f;
  }
  fault for_imm(uint64_t value) const {
    fault f = *this;
    f.imm = value;
    return f;
  }
};

/// What the wrapper saw and did. Calls are counted as they arrive, by method, whether a fault
/// took them or they were forwarded.
struct fault_stats {
  struct {
    uint64_t register_region = 0, deregister_region = 0, register_regions = 0, describe = 0,
             local_address = 0, provider_name = 0, start = 0, stop = 0, insert_peer = 0,
             insert_peer_async = 0, add_peer_rails = 0, remove_peer = 0, fence_peer = 0, submit = 0,
             return_immediate_credit = 0;
  } calls;
  uint64_t failed_calls = 0;          ///< register / insert calls a fault failed
  uint64_t failed_batches = 0;        ///< batches a fail_writes fault took
  uint64_t failed_writes = 0;         ///< writes it failed (never posted)
  uint64_t corrupted_writes = 0;      ///< writes a corrupt_writes fault posted one byte off
  uint64_t writes_completed = 0;      ///< writes the wrapped engine reported completed
  uint64_t immediates_arrived = 0;    ///< immediates (one per write) the wrapped engine reported
  uint64_t immediates_delivered = 0;  ///< of them, passed to the consumer
  uint64_t immediates_held = 0;       ///< held now
  uint64_t immediates_dropped = 0;
  uint64_t fences_held = 0;    ///< fence_peer calls held now
  uint64_t removals_held = 0;  ///< remove_peer calls held now
};

class fault_engine final : public engine {
 public:
  explicit fault_engine(std::unique_ptr<engine> inner);
  ~fault_engine() override;

  /// Arm a fault (thread-safe; takes effect for the next matching call).
  void arm(fault f);
  /// Disarm every fault not used up. What is held stays held until released.
  void disarm();
  /// Pass the held immediates to the consumer (one batch per credit); how many writes' worth.
  uint64_t release_immediates();
  /// Forward the held fence_peer calls, in order; their `done` runs once each has happened.
  size_t release_fences();
  /// Forward the held remove_peer calls, in order.
  size_t release_removals();

  fault_stats stats() const;
  /// Wait until `pred(stats())` holds or `limit` passes; whether it held.
  bool wait_for(const std::function<bool(const fault_stats&)>& pred,
                std::chrono::milliseconds limit) const;

  // transport::engine: forwarded to the wrapped engine unless a fault takes the call.
  result<region_id> register_region(void* base, uint64_t length, region_access access) override;
  result<bool> deregister_region(region_id id) override;
  void register_regions(std::vector<region_request> regions,
                        std::function<void(result<std::vector<region_id>>)> done) override;
  region_desc describe(region_id id) const override;
  std::vector<uint8_t> local_address() const override;
  std::string provider_name() const override;
  std::vector<rail_desc> rails() const override;
  std::vector<rail_stats> rail_activity() const override;
  void start(std::function<void(immediate_counts)> immediates) override;
  void stop() override;
  result<peer_handle> insert_peer(const std::vector<uint8_t>& address) override;
  void insert_peer_async(std::vector<uint8_t> address,
                         std::function<void(result<peer_handle>)> done) override;
  void add_peer_rails(peer_handle peer, std::vector<peer_rail> rails,
                      std::function<void(result<uint32_t>)> done) override;
  std::vector<uint32_t> peer_rails(peer_handle peer) const override;
  void remove_peer(peer_handle peer) override;
  void fence_peer(std::optional<peer_handle> peer, std::vector<region_id> regions,
                  std::function<void()> done) override;
  uint32_t notifications(const write_batch& batch) const override {
    return inner_->notifications(batch);
  }
  uint32_t submit(write_batch batch) override;
  void cancel_writes(std::shared_ptr<write_cancel> cancel) override {
    inner_->cancel_writes(std::move(cancel));
  }
  void return_immediate_credit() override;
  void expect_writes(std::chrono::milliseconds window) override { inner_->expect_writes(window); }

 private:
  struct held_fence {
    std::optional<peer_handle> peer;
    std::vector<region_id> regions;
    std::function<void()> done;
  };

  /// Take one use of the first armed fault of `what` that `matches`; its copy, or nullopt.
  /// Caller holds mutex_.
  std::optional<fault> take(fault::kind what, const std::function<bool(const fault&)>& matches);
  /// A register / insert fault for the next call, if one is armed (counted as injected).
  result<> call_fault(fault::kind what, const char* call);
  /// On the wrapped engine's progress thread: hold, drop or pass what arrived.
  void on_immediates(immediate_counts counts);
  void delivery_loop();
  void changed() const { cv_.notify_all(); }

  std::unique_ptr<engine> inner_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;  ///< stats or delivery state changed
  mutable fault_stats stats_;
  std::deque<fault> armed_;
  std::map<uint64_t, uint64_t> held_imms_;     ///< imm -> writes, kept from the consumer
  std::map<uint64_t, uint64_t> pending_imms_;  ///< imm -> writes, to deliver at the next credit
  bool consumer_busy_ = false;                 ///< a delivered batch's credit is not back
  bool stopping_ = false;
  std::deque<held_fence> held_fences_;
  std::deque<peer_handle> held_removals_;
  std::function<void(immediate_counts)> consumer_;
  std::thread delivery_;
};

}  // namespace ferry::transport
