#pragma once
/// The soak's state (the two daemons, the rooms in flight, the tallies) and the one class that
/// drives it. Its members are defined by idea: connections.cpp, rooms.cpp, checks.cpp,
/// report.cpp and run.cpp.

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <random>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/client.hpp"
#include "tools/soak/free_list.hpp"
#include "tools/soak/options.hpp"
#include "tools/soak/outcome.hpp"

namespace ferry::soak {

using clock_type = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

enum side_id : int { prefill = 0, decode = 1 };
inline constexpr const char* side_names[2] = {"prefill", "decode"};

/// A daemon whose socket did not accept a client again within --reconnect-seconds: the run
/// stops, exiting unreachable.
struct daemon_gone : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// One daemon and our connection to it.
struct daemon_side {
  std::string socket;
  std::unique_ptr<client::client> c;
  uint64_t gen = 0;  ///< incremented at every (re)connect: the pools of one daemon instance
  bool up = false;
  std::string down_reason;
  bool down_pending = false;  ///< the connection broke; rooms not yet told
  clock_type::time_point down_since, next_attempt;
  std::string instance;
  uint32_t reconnects = 0, instances = 0;
  free_list pages, slots, rows;
  bool has_state = false, has_aux = false;
  timeouts_config timeouts;
};

/// What we know of one side of a room.
struct side_track {
  bool tracked = false;  ///< subscribed: the daemon will push its terminal status
  bool done = false;     ///< terminal, gone with a restarted daemon, unknown there, or lost
  bool success = false, restarted = false, lost = false, unknown = false;
  room_status last = room_status::bootstrapping;
  errc code = errc::ok;  ///< of a Failed status: what it counts as (classify)
  std::string reason;
  uint64_t track_gen = 0;
  clock_type::time_point deadline;
  bool holds = false;  ///< holds pages, slot and row of instance `hold_gen`
  uint64_t hold_gen = 0;
  bool counted = false;  ///< counted in the per-side tallies (once, at its first resolution)
  /// Subscribed on the prefill only after the decode had ended: the daemon may not have seen
  /// this incarnation, and a first event that is already terminal may be an earlier one's.
  bool late = false, seen = false;
};

struct room {
  uint64_t id = 0;
  uint32_t id_index = 0;
  uint64_t key = 0;
  std::vector<uint32_t> src, dst;
  uint32_t src_slot = no_index, src_row = no_index, dst_slot = no_index, dst_row = no_index;
  std::vector<uint32_t> chunks;
  int cancel_side = -1;  ///< -1: not cancelled
  int cancel_phase = 0;  ///< 0 after prepare, 1 before any send, 2 after chunk 1, 3 after the last
  bool ready_seen = false, stop_sending = false;
  uint32_t chunks_sent = 0;
  bool p_restarted = false, d_restarted = false;
  clock_type::time_point started;
  side_track side[2];
};

inline constexpr const char* phase_names[4] = {"after prepare", "before any send", "after chunk 1",
                                               "after the last chunk"};

class soak {
 public:
  explicit soak(const options& o) : o_(o), rng_(o.seed) {
    sides_[prefill].socket = o.prefill_socket;
    sides_[decode].socket = o.decode_socket;
  }

  int run();

 private:
  // --- connections (connections.cpp) ---
  result<> connect(side_id s);
  bool conn_error(side_id s, errc code, const std::string& message);
  void process_down(side_id s);
  void reconnect_due(clock_type::time_point now);
  bool drain_events(side_id s);
  // --- rooms (rooms.cpp) ---
  bool can_start() const;
  void start_room(clock_type::time_point now);
  void on_event(side_id s, const proto::event& e);
  void on_decode_ready(room& r);
  void track_prefill(room& r);
  void send_chunk(room& r);
  void cancel(room& r, side_id s);
  void release(room& r, side_id s);
  // --- checks (checks.cpp) ---
  void side_terminal(room& r, side_id s, room_status status, errc code, const std::string& reason);
  void settle(uint64_t id);
  void check_deadlines(clock_type::time_point now);
  /// How long a side of a room may take to be terminal before it counts as LOST.
  ms bound(side_id s) const {
    const auto& t = sides_[s].timeouts;
    return ms(t.transfer_ms + t.drain_ms + o_.margin_ms);
  }
  // --- output (report.cpp) ---
  void progress(clock_type::time_point now);
  void anomaly(const std::string& what);
  /// The daemon's status document once it shows nothing active (bounded); "" or why not.
  std::string final_status(side_id s, nlohmann::json& status);
  bool summary(double run_s, double drain_s);
  // --- the run (run.cpp) ---
  /// 0 when both daemons can carry the run; otherwise why not is printed and this is the exit
  /// code (unreachable, or usage for daemons that do not fit the options).
  int preflight();

  options o_;
  std::mt19937_64 rng_;
  std::array<daemon_side, 2> sides_;
  std::string prefill_control_;
  uint32_t max_pages_ = 0;
  std::unordered_map<uint64_t, room> rooms_;
  free_list ids_;
  uint64_t next_key_ = 0;
  clock_type::time_point t0_;

  // statistics
  uint64_t started_ = 0, prepare_refused_ = 0;
  uint64_t outcome_[kind_count] = {};
  uint64_t side_kind_[2][kind_count] = {};
  uint64_t corrupted_ = 0, verified_ = 0, quarantined_ids_ = 0;
  uint64_t late_[3] = {};     // late prefill lookups: unknown there, already ended, followed
  uint64_t cancels_[4] = {};  // accepted, too late (finished), unknown room, refused otherwise
  uint64_t sends_ = 0, sends_after_failure_ = 0, ignored_events_ = 0, anomalies_ = 0;
  uint64_t disconnect_rooms_[2] = {};
  std::map<std::string, uint64_t> reasons_;
  std::vector<std::string> evidence_;
  uint64_t last_started_ = 0;
  clock_type::time_point last_progress_;
};

}  // namespace ferry::soak
