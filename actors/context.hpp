#pragma once
/// What every actor of a daemon shares, read-only after start-up: the config, the local layout,
/// the fabric engine and region ids, the client gateway, and named loggers.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <caf/all.hpp>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/plan.hpp"
#include "core/range_allocator.hpp"
#include "core/shm_region.hpp"
#include "transport/engine.hpp"

namespace ferry {

class client_gateway;
class peer_gate;

/// Sent to an actor waiting for staging when some was released.
using staging_atom = caf::atom_constant<caf::atom("staging")>;

/// Registered bounce memory for head-sliced KV (fabric.staging_bytes): packed source slices on
/// the prefill side, the rooms' landing areas on the decode side. Thread-safe. Back-pressure,
/// not failure: an actor that finds it full is woken (staging_atom) at the next release.
struct staging_area {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  transport::region_id region = 0;

  explicit staging_area(uint64_t size) : bytes(size), ranges_(size) {}
  staging_area(const staging_area&) = delete;
  staging_area& operator=(const staging_area&) = delete;
  ~staging_area();

  /// Allocate, or register `waiter` for a wake-up at the next release and return nullopt.
  std::optional<uint64_t> allocate_or_wait(uint64_t n, const caf::actor& waiter) {
    std::lock_guard lock(mutex_);
    if (auto at = ranges_.allocate(n)) return at;
    if (std::find(waiters_.begin(), waiters_.end(), waiter) == waiters_.end())
      waiters_.push_back(waiter);
    ++waits_;
    return std::nullopt;
  }
  void release(uint64_t offset) {
    std::vector<caf::actor> wake;
    {
      std::lock_guard lock(mutex_);
      ranges_.release(offset);
      wake.swap(waiters_);
    }
    for (auto& w : wake) caf::anon_send(w, staging_atom::value);
  }
  uint64_t in_use() const { return ranges_.in_use(); }
  /// Allocations that had to wait for a release (back-pressure events).
  uint64_t waits() {
    std::lock_guard lock(mutex_);
    return waits_;
  }

 private:
  std::mutex mutex_;
  range_allocator ranges_;
  std::vector<caf::actor> waiters_;
  uint64_t waits_ = 0;
};

struct daemon_context {
  ferry_config config;
  std::string instance;        ///< resolved instance id
  std::string config_yaml;     ///< effective config, sent to peers
  std::string cluster_secret;  ///< empty: peers are not authenticated
  node_layout layout;
  std::array<shm_region, pool_kind_count> pools;  ///< mapped pools (empty when absent)
  std::array<transport::region_id, pool_kind_count> regions{};
  std::unique_ptr<staging_area> staging;  ///< null when fabric.staging_bytes is 0; declared
                                          ///< before the engine so it outlives its registration
  std::unique_ptr<transport::engine> engine;
  std::shared_ptr<client_gateway> gateway;
  /// The peer port and outbound peer dials; stopped (its callbacks dropped) before the actor
  /// system goes away.
  std::shared_ptr<peer_gate> peer_port;
  std::shared_ptr<spdlog::logger> log_sched, log_room, log_peer;

  /// Base address of a local memory space (pool or staging).
  uint8_t* base(space s) const {
    if (s == space::staging) return staging ? staging->data : nullptr;
    return pools[static_cast<int>(s)].data();
  }
  /// Do one planned local copy (packing at a prefill, unpacking at a decode).
  void copy(const planned_copy& c) const {
    std::memcpy(base(c.to) + c.to_offset, base(c.from) + c.from_offset, c.length);
  }
  /// Registered region id of a local memory space.
  transport::region_id region(space s) const {
    return s == space::staging ? staging->region : regions[static_cast<int>(s)];
  }

  bool serves_decode() const { return config.role != node_role::prefill; }
  bool serves_prefill() const { return config.role != node_role::decode; }
};

using context_ptr = std::shared_ptr<daemon_context>;

/// A named logger sharing the default sink and level.
std::shared_ptr<spdlog::logger> make_logger(const std::string& name);

}  // namespace ferry
