#pragma once
/// What ferry-bench's modes share: the options, the connected pair (one client per rank), the
/// workload's page lists and planned writes, the results document and the helpers every mode
/// uses to open, send, verify and report rooms.
///
/// Modes (one per file): throughput.cpp (closed-loop waves, --pipeline, --poll-many),
/// fairness.cpp (--background-rooms), latency.cpp (--latency), open_loop.cpp (--open-loop).
/// Each returns the process's exit code (core/exit_codes.hpp) and writes its figures into
/// `context::out`, which `emit_json` prints once. The scale modes (scale.hpp) and --rolling
/// (rolling.hpp, a rolling restart's rehearsal) have their own connections and documents.
///
/// Single-threaded: every client is used from the main thread only.

#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/exit_codes.hpp"
#include "core/geometry.hpp"
#include "core/plan.hpp"
#include "ferry/client.hpp"
#include "ferry/engine_memory.hpp"

namespace ferry::bench {

using clock_type = std::chrono::steady_clock;

/// The command line.
struct options {
  std::vector<std::string> prefill_sockets{"/tmp/ferry-prefill.sock"};
  std::vector<std::string> decode_sockets{"/tmp/ferry-decode.sock"};
  uint32_t prompt_tokens = 4096;
  uint32_t requests = 32;
  bool requests_given = false;  ///< --requests was on the command line (open loop: a bound)
  uint32_t concurrency = 4;
  uint32_t chunk_tokens = 0;
  double fragmentation = 0.0;
  bool verify = false;
  bool pipeline = false;  ///< keep `concurrency` rooms in flight instead of running waves
  /// Waves: one request per round trip, as before pipelined requests (client::pipeline).
  bool serial_requests = false;
  /// Also a paced raw baseline: each room's writes wait for one control message (its grant).
  bool paced_baseline = false;
  uint32_t background_rooms = 0;  ///< fairness: this many large rooms flow meanwhile
  uint32_t background_tokens = 4096;
  double layer_wise_ms = 0;  ///< --layer-wise: one layer group made every this many ms (0: off)
  uint32_t layer_group = 1;  ///< --layer-group: global layers per layer-wise send
  bool latency = false;      ///< --latency: one room at a time, prepare to Success
  std::vector<double> gaps_ms{0, 50};  ///< --latency: idle gaps before each timed room
  double open_loop_rate = 0;           ///< --open-loop: Poisson arrivals per second (0: off)
  std::string mix = "16:0.90,4096:0.09,32768:0.01";  ///< --open-loop: token count:fraction
  double duration_s = 10;                            ///< --open-loop: arrivals stop after this
  uint64_t seed = 1;                                 ///< --open-loop: arrivals and classes
  double max_lag_ms = 10;  ///< --open-loop: a room started later than this is late
  bool baseline = true;
  std::string provider;
  uint64_t piece_bytes = 1 << 20;
  uint32_t window = 64;
  uint32_t repeat = 1;
  uint32_t warmup_waves = 1;  ///< untimed waves before the first timed run (throughput)
  uint64_t room_base = 0;
  uint32_t poll_many = 0;  ///< after the runs: time poll_many of this many rooms (0: skip)
  std::string json;        ///< write the results as JSON here ("-": stdout, the prose to stderr)
};

/// One concurrency slot's source and destination pages.
struct slot_plan {
  std::vector<uint32_t> src, dst;
};

/// The connected pair and the workload, built once by main.cpp for every mode.
struct context {
  options o;
  std::ostream* text = nullptr;  ///< the report: stdout, or stderr under `--json -`
  nlohmann::json out = {{"lent", nlohmann::json::array()}};

  // Declared first: the memory lent to `memory: client` pools must outlive the connections.
  std::vector<client::engine_memory> lent;
  std::vector<std::unique_ptr<client::client>> prefills, decodes;
  std::vector<std::string> prefill_controls;
  std::vector<rank_schema> prefill_schemas;

  uint32_t page_tokens = 1;
  uint64_t pool_pages = 0;  ///< kv pages of the smallest kv pool
  bool has_state = false, has_aux = false;
  uint64_t slots = ~0ull, rows = ~0ull;  ///< state slots and aux rows (~0: no such pool)
  std::string provider;                  ///< the baseline's provider (the daemons' by default)

  // The closed-loop workload (throughput, fairness, latency): `concurrency` slots.
  uint32_t pages_per_req = 0;
  uint32_t region = 0;  ///< pages reserved per slot (fragmentation slack included)
  std::vector<slot_plan> plans;
  std::vector<uint32_t> chunks;    ///< pages per chunk
  std::vector<planned_write> one;  ///< one request's writes over every link, split in pieces
  uint64_t req_bytes = 0, kv_bytes = 0, state_bytes = 0;

  uint64_t next_room = 0;
  bool reported = false;  ///< the mode ran to its end and emitted its results (emit_json)
  uint32_t verified = 0;
  std::string first_failure;

  std::ostream& report() { return *text; }
  /// Why the run stopped early, on stderr, and under `--json -` as the one document; returns rc.
  int fail(const std::string& msg, int rc = exit_code::failed);
  /// A client call that failed: the daemon's refusal, or the connection's loss or timeout.
  int fail_on(const client::client& c, const ferry::error& e, const std::string& what);
  /// The results document: on stdout with `--json` alone, else in the --json file (if any).
  std::optional<int> emit_json();
  /// `state` and `row` of slot `c`, or no_index where the daemons have no such pool.
  uint32_t state_of(uint32_t c) const;
  uint32_t row_of(uint32_t c) const;
  /// A room's decode side: its id in the source aux row (ferryd checks it on send), and on
  /// every decode rank its destination cleared (`clear`, for verification), prepared and
  /// subscribed to.
  std::optional<int> open_room(uint64_t id, const std::vector<uint32_t>& dst, uint32_t slot,
                               bool clear);
  /// Send the room's pages in one last chunk from every prefill rank.
  std::optional<int> send_room(uint64_t id, const std::vector<uint32_t>& src, uint32_t slot);
  /// Open rooms `ids` in slots 0.. (as open_room), every decode rank's prepares and subscribes
  /// in one client::pipeline: what an engine does for the requests of one scheduler step.
  std::optional<int> open_rooms(const std::vector<uint64_t>& ids, bool clear);
  /// Check every destination byte of a room filled with pattern `key` on every decode rank;
  /// counts `verified` or keeps the first failure. Returns whether it matched.
  bool verify_room(uint64_t key, uint64_t room, const std::vector<uint32_t>& dst, uint32_t slot);
  /// --verify of the closed-loop slot `c` (pattern_key(c)).
  bool verify_slot(uint32_t c, uint64_t room);
  /// The writes of one room moving `src` to `dst` over every (prefill, decode) link, planned as
  /// ferryd plans them, split in `--piece-bytes` pieces; an error names the geometry's problem.
  result<std::vector<planned_write>> plan_room(const std::vector<uint32_t>& src,
                                               const std::vector<uint32_t>& dst) const;
};

/// Value at quantile p (0..1) of `v` (nearest rank); 0 when empty.
double percentile(std::vector<double> v, double p);
/// {p50, p99, max, samples} of `v` as a JSON object (nulls when empty).
nlohmann::json summary(const std::vector<double>& v);
/// Milliseconds between two instants.
double ms_between(clock_type::time_point a, clock_type::time_point b);
/// The fill pattern of closed-loop slot `slot`.
inline uint64_t pattern_key(uint32_t slot) { return 0xfe77'0000'0000ull + slot; }
/// Page lists of one concurrency slot: `pages` destination-order entries from a region of the
/// pool; with fragmentation f, each next page skips ahead with probability f.
std::vector<uint32_t> make_pages(uint32_t region_first, uint32_t region_len, uint32_t pages,
                                 double f, uint64_t seed);

/// Wait until every room of `rooms` has ended on the daemon behind `c` (each wait bounded by
/// `timeout`), so that closing the connection cancels none of them. A prefill room ends one peer
/// message after its decode's Success (the decode's outcome), so a bench that exits at the
/// decode's last Success would cancel the prefill's last room. Rooms it does not know count as
/// ended; a lost connection is returned as the error (`c.lost()`).
result<none> settle_rooms(client::client& c, const std::vector<uint64_t>& rooms,
                          std::chrono::milliseconds timeout);

/// CPU seconds (user + system) of the daemons behind `clients` (nullopt if one is unreadable).
std::optional<double> cpu_seconds(const std::vector<std::unique_ptr<client::client>>& clients);
/// This process's CPU seconds, and those of its waited-for children (the baseline's target).
double own_cpu_seconds();
double children_cpu_seconds();

/// The modes. Each returns the exit code.
int run_throughput(context& ctx);
int run_fairness(context& ctx);
int run_latency(context& ctx);
int run_open_loop(context& ctx);
int run_layer_wise(context& ctx);  ///< src/tools/bench/layerwise.cpp
/// --digest-rate: one core's XXH3-64 rate over 256 MiB, `passes` times
/// (src/tools/bench/digest_rate.cpp).
int digest_rate(uint32_t passes, const std::string& json);

}  // namespace ferry::bench
