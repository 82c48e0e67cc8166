#pragma once
/// The daemon's Prometheus metrics (docs/operations.md, "Metrics"). Two kinds:
///  - counters and histograms the actors update as things happen (rooms ended, writes posted
///    and completed, phase latencies, peer losses and fences): thread-safe, lock-free on the
///    write path, always counted whether or not they are served;
///  - gauges read at each scrape: the Scheduler's own state (rooms active, pools, clients,
///    staging) as a `metrics_snapshot` it fills, and each live peer's heartbeat age.
/// Only metrics.cpp sees prometheus-cpp; the rest of the daemon sees this header.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.hpp"
#include "core/status.hpp"

namespace ferry {

/// A room's phases, as its side sees them: the time spent in Bootstrapping, WaitingForInput and
/// Transferring (the Scheduler's status changes), and `commit`: from the last write's completion
/// to Success (`commit_clock`).
enum class latency_phase : uint8_t { bootstrapping, waiting, transferring, commit };
inline constexpr int latency_phase_count = 4;
const char* to_string(latency_phase p);

/// Seconds from `from` to `to`, for `daemon_metrics::phase`.
template <class TimePoint>
double seconds_since(TimePoint from, TimePoint to) {
  return std::chrono::duration<double>(to - from).count();
}

/// Where a room's `commit` phase starts: the later of the announcement of the write totals
/// (prefill: sent; decode: heard) and the last write's completion (prefill: its batch completed
/// locally; decode: it landed). Until both happened the room cannot commit; after, what remains
/// is the commit itself (the decode's count and unpack, its outcome back to the prefill).
class commit_clock {
 public:
  using time_point = std::chrono::steady_clock::time_point;
  void announced(time_point t) {
    announced_ = true;
    from_ = std::max(from_, t);
  }
  void write_done(time_point t) { from_ = std::max(from_, t); }
  /// Seconds from the commit's start to `success`; none when nothing was announced.
  std::optional<double> seconds_to(time_point success) const {
    if (!announced_) return std::nullopt;
    return seconds_since(from_, success);
  }

 private:
  bool announced_ = false;
  time_point from_{};
};

/// One live peer's health, shared by its Connection (which writes it) and the scrape.
struct peer_health {
  std::string peer;                       ///< its node name
  std::atomic<int64_t> last_heard_ms{0};  ///< steady clock, ms; 0: not ready yet
};

/// What the Scheduler reports at a scrape: plain values, rendered by `render_gauges`.
struct metrics_snapshot {
  struct pool {
    std::string name;  ///< kv, state, aux
    bool client = false, registered = false;
    uint64_t bytes = 0, items = 0, in_use = 0;
  };
  /// Active rooms by side (0 prefill, 1 decode) and status (room_status value).
  std::array<std::array<uint64_t, 5>, 2> active{};
  uint64_t clients = 0, peers = 0, stray_writes = 0;
  std::vector<pool> pools;
  uint64_t staging_bytes = 0, staging_in_use = 0, staging_waits = 0;
  uint64_t staging_packed = 0, staging_unpacked = 0;  ///< bytes copied into and out of staging
  /// Each fabric endpoint (transport::rail_stats): in flight now, posted since start.
  struct rail {
    std::string name;  ///< "0", "1", ..., "express"
    uint64_t writes_in_flight = 0, bytes_in_flight = 0, writes_posted = 0, bytes_posted = 0;
  };
  std::vector<rail> rails;
};

class daemon_metrics {
 public:
  /// How long a peer's series stay after it left (its last event, no connection of it ready):
  /// longer than any alert's window over them, so the loss is seen, then gone.
  static constexpr int64_t departed_peer_retention_ms = 30 * 60 * 1000;

  /// `node`, `instance_id`, `role` and `provider`: the `ferry_info` series. `clock_ms`: the
  /// steady clock in milliseconds (tests give their own).
  daemon_metrics(std::string node, std::string instance_id, std::string role, std::string provider,
                 std::function<int64_t()> clock_ms = {});
  ~daemon_metrics();
  daemon_metrics(const daemon_metrics&) = delete;
  daemon_metrics& operator=(const daemon_metrics&) = delete;

  /// A room of `side` (false prefill, true decode) ended with `s` and `code`, having moved
  /// `bytes` (counted only on success).
  void room_ended(bool decode, room_status s, errc code, uint64_t bytes);
  /// A room of `side` spent `seconds` in `phase`.
  void phase(bool decode, latency_phase p, double seconds);
  /// A batch of writes posted to the fabric (prefill), and its completion: `bytes` is the
  /// batch's, counted as completed only when no write failed.
  void writes_posted(uint64_t writes, uint64_t bytes);
  void writes_completed(uint64_t completed, uint64_t failed, uint64_t skipped, uint64_t bytes);
  /// Decode: writes the fabric reported landed, for rooms this daemon knows.
  void writes_landed(uint64_t count);
  /// Decode: a room checked end to end whose landed bytes digest as the prefill's did.
  void room_verified();
  /// Peer connections, by the peer's node name: one became ready (its health, for its
  /// Connection to keep updating; its heartbeat age leaves the scrape when the last copy is
  /// dropped, its event counters `departed_peer_retention_ms` after that and its last event),
  /// one was lost, one was fenced (its registrations closed and fabric connection cut).
  std::shared_ptr<peer_health> peer_ready(const std::string& peer);
  void peer_lost(const std::string& peer);
  /// A peer that said it drains closed its connection (a rolling restart's goodbye).
  void peer_drained(const std::string& peer);
  void peer_fenced(const std::string& peer);
  /// A peer's handshake proved the cluster secret held in `secret_file`.
  void peer_authenticated(const std::string& secret_file);

  /// The whole exposition (Prometheus text format 0.0.4): the counters and histograms, the
  /// peers' heartbeat ages, and the Scheduler's gauges from `snap`.
  std::string exposition(const metrics_snapshot& snap) const;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace ferry
