#pragma once
/// The machinery of ferry-bench's scale modes (scale.hpp): connections to engine instances, a
/// daemon's resident memory, and rooms opened, sent and checked many at a time, in one wave
/// (held, then sent) or as a pipeline (a fixed number in flight).
///
/// Rooms are named by slots: room `src` on its prefill instance uses state slot and aux row
/// `src` and the KV region `src % src_regions` (regions are shared by rooms, which only read
/// them); on the decode it uses slot, row and KV region `dst`, which no other open room uses
/// (ferryd refuses two active rooms naming one destination). Every lookup of a room by its id
/// is a hash lookup: nothing here is quadratic in the number of rooms.
///
/// Single-threaded.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "ferry/client.hpp"
#include "ferry/engine_memory.hpp"

namespace ferry::bench::scale {

using clock_type = std::chrono::steady_clock;

/// Why a run stopped early, and the exit code it ends with.
struct stop {
  int rc = 1;
  std::string message;
};
using maybe_stop = std::optional<stop>;
/// A client call that failed: the daemon's refusal, or the connection's loss or timeout.
stop stop_on(const client::client& c, const ferry::error& e, const std::string& what);

/// One engine instance: the clients of its ranks (one, or the TP/PP ranks of one instance).
struct instance {
  std::vector<client::engine_memory> lent;  ///< declared first: must outlive the connections
  std::vector<std::unique_ptr<client::client>> ranks;
  std::vector<std::string> controls;  ///< every rank's control address (a prepare names them)
  std::vector<rank_schema> schemas;
};
/// Connect to every socket of one instance, lending memory to `memory: client` pools.
maybe_stop connect(instance& out, const std::vector<std::string>& sockets, std::ostream& text);
/// Connect to independent prefill instances, one daemon each (`sockets`, given as `option`), and
/// to the decode instance: a usage error names two sockets of one prefill, which `mode` needs
/// apart.
maybe_stop connect_independent(std::vector<instance>& prefills, instance& decode,
                               const std::vector<std::string>& sockets,
                               const std::vector<std::string>& decode_sockets, const char* option,
                               const char* mode, std::ostream& text);

/// One daemon's resident memory from /proc/PID/status, in KiB: the whole set, its anonymous part
/// (the daemon's own heap and stacks) and its shared-memory part (pool pages it touched).
struct daemon_memory {
  uint64_t rss_kib = 0, anon_kib = 0, shmem_kib = 0;
};
/// The memory of the ferryd at the other end of `c`'s socket (its pid from SO_PEERCRED); nothing
/// when it cannot be read (another pid namespace, /proc closed to this user).
std::optional<daemon_memory> memory_of(const client::client& c);
/// CPU seconds (user + system, every thread) of the ferryd at the other end of `c`'s socket.
std::optional<double> cpu_seconds_of(const client::client& c);

/// Where one room's bytes come from and go to.
struct room_plan {
  uint64_t id = 0;
  uint32_t prefill = 0;  ///< the prefill instance that sends it
  uint32_t src = 0;      ///< its state slot and aux row there (and KV region src % regions)
  uint32_t dst = 0;      ///< its state slot, aux row and KV region on the decode
};

/// The pages and indices of rooms, and the calls that open, send and check them.
class driver {
 public:
  /// Rooms of `pages_per_room` pages; `src_regions` source KV regions on each prefill instance.
  driver(std::vector<instance>& prefills, instance& decode, uint32_t pages_per_room,
         uint32_t src_regions, bool verify);

  std::vector<uint32_t> src_pages(uint32_t src) const;
  std::vector<uint32_t> dst_pages(uint32_t dst) const;
  /// Fill the source KV regions and the state slots and aux rows [0, slots) of every prefill
  /// instance with their patterns.
  maybe_stop fill(uint32_t slots);
  /// The room's id into its source aux row (ferryd checks it on send); on every decode rank its
  /// destination cleared (with verification), prepared and subscribed to.
  maybe_stop open(const room_plan& r);
  /// The room's pages, state slot and aux row in one last chunk from every rank of its prefill.
  maybe_stop send(const room_plan& r);
  /// Every destination byte of the room on every decode rank: "" or the first mismatch.
  std::string check(const room_plan& r) const;
  bool verifying() const { return verify_; }
  size_t decode_ranks() const { return decode_.ranks.size(); }
  client::client& decode_rank(size_t i) { return *decode_.ranks[i]; }
  /// Bytes and writes of one room over every (prefill rank, decode rank) link, planned as ferryd
  /// plans them; an error names the geometry's problem.
  result<std::pair<uint64_t, uint64_t>> room_bytes(uint64_t piece_bytes) const;

 private:
  uint64_t key_of(uint32_t src) const;
  std::vector<instance>& prefills_;
  instance& decode_;
  uint32_t pages_;
  uint32_t regions_;
  bool verify_;
  bool state_ = false, aux_ = false;
};

/// One wave's outcome.
struct wave_result {
  uint32_t committed = 0, failed = 0, verified = 0;
  double open_s = 0;      ///< prepares and subscriptions of every room
  double ready_s = 0;     ///< then until every room was WaitingForInput on every decode rank
  double send_s = 0;      ///< first send to the last send's reply
  double transfer_s = 0;  ///< first send to the last terminal event
  std::vector<double> latency_ms;  ///< each committed room: its send to its last Success
  std::string first_failure;
};
/// Open every room, wait until each is WaitingForInput on every decode rank, call `on_ready`,
/// send them all and wait for their terminal events (each wait bounded by `timeout`); then,
/// when verifying, check every room.
maybe_stop run_wave(driver& d, const std::vector<room_plan>& rooms,
                    const std::function<void()>& on_ready, std::chrono::seconds timeout,
                    wave_result& out);

/// A pipeline's outcome.
struct pipeline_result {
  uint32_t started = 0, committed = 0, failed = 0, verified = 0;
  double transfer_s = 0;  ///< first send to the last terminal event
  double calls_s = 0;     ///< in the calls that open and send rooms (round trips to ferryd)
  std::vector<double> latency_ms;  ///< each committed room: its send to its last Success
  std::string first_failure;
};
/// How a pipeline runs.
struct pipeline_plan {
  uint32_t slots = 1;  ///< rooms open at once
  /// Rooms sent and not yet ended at most (0: every room is sent as soon as it is open); the
  /// other open rooms wait, prepared, and the oldest goes next: `slots` rooms stay open while a
  /// window of them flows, as in an engine holding many rooms that its prefill fills in turn.
  uint32_t send_window = 0;
  uint64_t max_rooms = ~0ull;  ///< new rooms stop after this many...
  double duration_s = 0;       ///< ...or after this long (0: no bound by time)
  double sample_s = 0;         ///< `sample` every this often (0: never)
};
/// Keep `plan.slots` rooms open: a slot freed by a room's end opens the next room at once
/// (`next(k, slot)` plans the k-th, its `src` and `dst` being the slot). When new rooms stop,
/// `sample(seconds, open rooms)` is called once more, then the rest are sent and end.
maybe_stop run_pipeline(driver& d, const pipeline_plan& plan,
                        const std::function<room_plan(uint64_t k, uint32_t slot)>& next,
                        const std::function<void(double, size_t)>& sample,
                        std::chrono::seconds timeout, pipeline_result& out);

/// Wait until rooms [first, end) have ended on every rank of `prefills` (bench.hpp,
/// settle_rooms: a prefill room ends one peer message after its decode's Success, and closing
/// the connection that sent it would cancel it); a rank whose connection is lost is skipped.
maybe_stop settle(std::vector<instance>& prefills, uint64_t first, uint64_t end,
                  std::chrono::seconds timeout);

/// Value at quantile p (0..1) of `v` (nearest rank); 0 when empty.
double quantile(std::vector<double> v, double p);

}  // namespace ferry::bench::scale
