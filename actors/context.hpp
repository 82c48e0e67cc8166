#pragma once
/// What every actor of a daemon shares, read-only after start-up: the config, the local layout,
/// the fabric engine and region ids, the client gateway, and named loggers.

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <caf/all.hpp>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/log_digest.hpp"
#include "actors/metrics.hpp"
#include "actors/room_routes.hpp"
#include "actors/room_timeline.hpp"
#include "core/auth.hpp"
#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/plan.hpp"
#include "core/range_allocator.hpp"
#include "core/registration.hpp"
#include "core/registration_checks.hpp"
#include "core/shm_region.hpp"
#include "core/waiter_queue.hpp"
#include "os/timer_service.hpp"
#include "transport/channels/status_board.hpp"
#include "transport/engine.hpp"

namespace ferry {

class client_gateway;
class peer_gate;

/// Sent to an actor waiting for staging when some was released.
using staging_atom = caf::atom_constant<caf::atom("staging")>;

/// Registered bounce memory (fabric.staging_bytes) for head-sliced KV and small runs
/// (core/pack.hpp): packed source slices on the prefill side, the rooms' landing blocks on the
/// decode side. Thread-safe. Back-pressure, not failure: an actor that finds it full waits
/// (core/waiter_queue.hpp) and is woken (staging_atom) by a release that frees enough for it, in
/// arrival order; only as many waiters as the free bytes can serve are woken, so thousands of
/// waiting rooms cost a release no more than the rooms it serves. A waiting actor leaves the
/// queue when it ends (`staging_or_wait` attaches that), passing its turn on if it had been
/// woken.
struct staging_area {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  transport::region_id region = 0;

  explicit staging_area(uint64_t size) : bytes(size), ranges_(size) {}
  staging_area(const staging_area&) = delete;
  staging_area& operator=(const staging_area&) = delete;
  ~staging_area();

  /// What `allocate_or_wait` found: the offset, or nothing (the waiter is queued); `hook`: the
  /// waiter is new here, so it must call `leave` when it ends.
  struct outcome {
    std::optional<uint64_t> at;
    bool hook = false;
  };
  /// Allocate, or queue `waiter` (its id `id`) for a wake-up once a release frees enough.
  outcome allocate_or_wait(uint64_t n, caf::actor_id id, caf::actor_addr waiter) {
    std::lock_guard lock(mutex_);
    outcome out;
    if ((out.at = ranges_.allocate(n))) {
      queue_.served(id);
      return out;
    }
    queue_.wait(id, n);
    out.hook = hooked_.emplace(id, std::move(waiter)).second;
    ++waits_;
    return out;
  }
  /// Allocate, or nullopt when full or when others wait (it never jumps their queue; no
  /// wake-up is asked for).
  std::optional<uint64_t> try_allocate(uint64_t n) {
    std::lock_guard lock(mutex_);
    if (queue_.waiting() > 0) return std::nullopt;
    return ranges_.allocate(n);
  }
  void release(uint64_t offset) {
    std::vector<caf::actor> wake;
    {
      std::lock_guard lock(mutex_);
      ranges_.release(offset);
      wake_locked(wake);
    }
    for (auto& w : wake) caf::anon_send(w, staging_atom::value);
  }
  /// The actor `id` ended: it waits no more; if it had been woken, the next waiters are.
  void leave(caf::actor_id id) {
    std::vector<caf::actor> wake;
    {
      std::lock_guard lock(mutex_);
      hooked_.erase(id);
      if (queue_.leave(id)) wake_locked(wake);
    }
    for (auto& w : wake) caf::anon_send(w, staging_atom::value);
  }
  uint64_t in_use() const { return ranges_.in_use(); }
  /// Bytes copied into staging before they were written (a prefill's packing), and out of it
  /// into the pages on commit (a decode's unpacking and scattering).
  void packed(uint64_t n) { packed_.fetch_add(n, std::memory_order_relaxed); }
  void unpacked(uint64_t n) { unpacked_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t packed_bytes() const { return packed_.load(std::memory_order_relaxed); }
  uint64_t unpacked_bytes() const { return unpacked_.load(std::memory_order_relaxed); }
  /// Allocations that had to wait for a release (back-pressure events).
  uint64_t waits() {
    std::lock_guard lock(mutex_);
    return waits_;
  }
  /// Actors waiting now, and woken ones that have not come back yet.
  std::pair<size_t, size_t> waiters() {
    std::lock_guard lock(mutex_);
    return {queue_.waiting(), queue_.woken()};
  }

 private:
  /// The waiters the free bytes can serve, as actors (one that has ended is skipped, and its
  /// turn passes on).
  void wake_locked(std::vector<caf::actor>& out) {
    for (bool again = true; again;) {
      again = false;
      for (auto id : queue_.wake(bytes - std::min(bytes, ranges_.in_use()))) {
        auto it = hooked_.find(id);
        auto to = it == hooked_.end() ? caf::actor{} : caf::actor_cast<caf::actor>(it->second);
        if (to) {
          out.push_back(std::move(to));
          continue;
        }
        if (it != hooked_.end()) hooked_.erase(it);
        again = queue_.leave(id) || again;
      }
    }
  }

  std::mutex mutex_;
  range_allocator ranges_;
  waiter_queue<caf::actor_id> queue_;
  /// Actors that waited here and have not ended, by id (weak: a waiter does not keep an actor).
  std::unordered_map<caf::actor_id, caf::actor_addr> hooked_;
  uint64_t waits_ = 0;
  std::atomic<uint64_t> packed_{0}, unpacked_{0};
};

/// A `memory: client` pool (docs/protocol.md, register_memory): an address range reserved at
/// start (no access), into which a client's registration maps its buffers at their layout
/// offsets, so the pool has one base address whoever owns the memory. Only the Scheduler
/// changes `state`; other actors read it (a handshake describes only a registered pool).
///
/// A pool the registration describes (pool_placement::registered) reserves its range at its
/// first registration, which also fixes its description for the daemon's life: the Scheduler
/// publishes it into `config.pools` and `layout` before the pool is first registered, and no
/// peer connection exists before that (handshakes wait for it), so readers see it whole.
struct client_pool {
  using state = client_pool_state;  ///< core/registration_checks.hpp
  bool client = false;              ///< `memory: client` (set at start-up)
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
  std::atomic<state> now{state::unregistered};
  uint64_t owner = 0;  ///< the client connection whose registration it is (Scheduler only)
  /// A registered pool's description since its first registration (Scheduler only).
  std::optional<described_pool> described;
};

struct daemon_context {
  ferry_config config;
  std::string instance;                   ///< resolved instance id
  std::string config_yaml;                ///< effective config, for clients and the log
  std::string peer_config_yaml;           ///< what a hello carries (to_yaml's yaml_for::peers)
  cluster_secrets secrets;                ///< empty: peers are not authenticated
  std::vector<std::string> secret_files;  ///< the file of each of `secrets.accepted`
  node_layout layout;
  std::array<shm_region, pool_kind_count> pools;  ///< daemon-owned pools (empty when absent)
  std::array<client_pool, pool_kind_count> client_pools;  ///< `memory: client` pools
  /// Local registration of each pool; a client pool's changes with its registration.
  std::array<std::atomic<transport::region_id>, pool_kind_count> regions{};
  /// Counted always, served when listen.metrics is set (actors/metrics.hpp). Declared before
  /// the engine: a batch's completion, on the engine's thread, counts into it.
  std::unique_ptr<daemon_metrics> metrics;
  std::unique_ptr<staging_area> staging;  ///< null when fabric.staging_bytes is 0; declared
                                          ///< before the engine so it outlives its registration
  /// Where peer messages and landed writes of each room go without the Scheduler. Declared,
  /// like the two below, before the threads that read them (the engine's progress thread, the
  /// peer links, the client gateway), so it outlives them however the daemon ends.
  room_routes routes;
  /// The last rooms' milestones on this daemon's clock (the `timelines` info document).
  timeline_log timelines;
  /// Active rooms' statuses, from which the client gateway answers polls of rooms in progress.
  status_board board;
  /// Client requests the gateway refused by their own fields, without the Scheduler
  /// (refuse_at_once), since start.
  std::atomic<uint64_t> refused_at_once{0};
  std::unique_ptr<transport::engine> engine;
  std::shared_ptr<client_gateway> gateway;
  /// The peer port and outbound peer dials; stopped (its callbacks dropped) before the actor
  /// system goes away.
  std::shared_ptr<peer_gate> peer_port;
  /// Every room's deadlines (cancellable); stopped, like the peer gate, inside the actor
  /// system's scope.
  std::unique_ptr<timer_service> timers;
  std::shared_ptr<spdlog::logger> log_sched, log_room, log_peer;
  /// The info log's summary of rooms and its limit on floods of per-room lines.
  logging::digest digest;
  /// Peers and clients are served (set once at start-up), and no drain has begun: /readyz.
  std::atomic<bool> serving{false};
  /// A client may start the drain (the client protocol's `drain`): ferryd waits for its stop
  /// signals itself. False when it runs inside another program, which stops it.
  bool drain_on_request = false;
  std::atomic<bool> drain_begun{false};  ///< a stop signal or a client's drain came

  /// Base address of a local memory space (pool or staging).
  uint8_t* base(space s) const {
    if (s == space::staging) return staging ? staging->data : nullptr;
    const int k = static_cast<int>(s);
    return client_pools[k].base ? client_pools[k].base : pools[k].data();
  }
  /// Whether pool `k` is `memory: client`.
  bool client_memory(int k) const { return client_pools[k].client; }
  /// Whether rooms can use the pools now, or why not (peer_incompatible: a `memory: client` pool
  /// is not registered).
  result<> pools_usable() const;
  /// Whether the daemon takes rooms now, or why not ("starting", "stopping", a client pool
  /// not registered): what /readyz and `ferryctl wait-ready` (the status document's `ready`)
  /// both answer from.
  result<> ready() const;
  /// Do one planned local copy (packing at a prefill, unpacking at a decode).
  void copy(const planned_copy& c) const {
    std::memcpy(base(c.to) + c.to_offset, base(c.from) + c.from_offset, c.length);
  }
  /// Do copies [first, first + n) of a strided copy (packing at a prefill, unpacking at a decode).
  void copy(const strided_copy& c, uint64_t first, uint64_t n) const {
    uint8_t* to = base(c.to) + c.to_offset + first * c.to_stride;
    const uint8_t* from = base(c.from) + c.from_offset + first * c.from_stride;
    for (uint64_t i = 0; i < n; ++i, to += c.to_stride, from += c.from_stride)
      std::memcpy(to, from, c.length);
  }
  /// Registered region id of a local memory space.
  transport::region_id region(space s) const {
    return s == space::staging ? staging->region : regions[static_cast<int>(s)].load();
  }

  bool serves_decode() const { return config.role != node_role::prefill; }
  bool serves_prefill() const { return config.role != node_role::decode; }
};

using context_ptr = std::shared_ptr<daemon_context>;

/// A client's drain request: starts the drain a SIGTERM starts, unless one has begun. Returns
/// whether this call started it.
bool request_drain(daemon_context& ctx);

/// `n` bytes of staging for the room actor `self`, or nothing: it then waits for a staging_atom.
/// The first time it waits, it is set to leave the queue when it ends (passing a wake-up on).
template <class Actor>
std::optional<uint64_t> staging_or_wait(Actor* self, const context_ptr& ctx, uint64_t n) {
  auto r = ctx->staging->allocate_or_wait(n, self->id(), caf::actor_cast<caf::actor_addr>(self));
  if (r.hook) self->attach_functor([ctx, id = self->id()] { ctx->staging->leave(id); });
  return r.at;
}

}  // namespace ferry
