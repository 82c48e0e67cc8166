// ferry-soak: a bounded soak of one prefill ferryd and one decode ferryd, driven through their
// client sockets (docs/reliability.md, section 11).
//
// Rooms start at a target rate, up to `--concurrency` in flight. Each room takes random free
// source pages, slot and row on the prefill and random free destination pages, slot and row on
// the decode (never shared by two rooms in flight), fills the source with a pattern keyed by a
// key unique to this room incarnation, prepares on the decode, and sends 1-3 chunks on the
// prefill once the decode shows WaitingForInput. Room ids come from a small pool and are reused
// as soon as a room is terminal on both sides, so epochs are exercised all the time. Some rooms
// are cancelled, from either side, at a random phase.
//
// Every room must reach a terminal state on both sides within a bound (the daemons' timeouts
// plus a margin); one that does not is LOST. A Success on the decode is verified byte-exact at
// once (a mismatch is CORRUPTED), and each side's pages, slot and row go back to the free lists
// the moment that side is terminal: terminal means reusable, so a late write of an old room
// would land in a new room's pages and fail its verification.
//
// A daemon may be killed and restarted under the soak (scripts/soak.sh does it): the broken
// connection is re-made with bounded retries, the rooms in flight on the dead daemon count as
// failed by restart (its state died with it), and the surviving side must still report its
// terminal state for each of them within the bound.
//
// Single-threaded: one event loop polls both client sockets. The only timed waits are the
// pacing of the start rate, the retry interval of a reconnect, and the bounded re-reading of the
// daemons' status at the end.

#include <fmt/format.h>
#include <poll.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <iostream>
#include <map>
#include <numeric>
#include <random>
#include <regex>
#include <unordered_map>

#include "ferry/client.hpp"
#include "ferry/workload.hpp"

using namespace ferry;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;
using ms = std::chrono::milliseconds;

namespace {

struct options {
  std::string prefill_socket = "/tmp/ferry-prefill.sock";
  std::string decode_socket = "/tmp/ferry-decode.sock";
  std::string prefill_control;  // empty: the prefill's listen.control, from its hello
  double seconds = 60;
  double rate = 1000;
  uint32_t concurrency = 64;
  double cancel_percent = 10;
  uint32_t max_pages = 8;
  uint32_t max_chunks = 3;
  uint64_t seed = 0;
  double progress_seconds = 10;
  uint32_t room_ids = 0;  // 0: 2 x concurrency
  uint64_t room_base = 0x50ac'0000'0000ull;
  uint32_t margin_ms = 5000;
  double reconnect_seconds = 60;
  uint32_t request_timeout_ms = 20000;
};

/// Indices (pages, slots, rows, room ids) free for a new room, taken at random. Giving back an
/// index that is not taken is a bug of this program, and aborts it.
class free_list {
 public:
  void reset(uint32_t n) {
    items_.resize(n);
    std::iota(items_.begin(), items_.end(), 0u);
    taken_.assign(n, 0);
  }
  size_t size() const { return items_.size(); }
  size_t capacity() const { return taken_.size(); }
  uint32_t take(std::mt19937_64& rng) {
    const size_t i = rng() % items_.size();
    std::swap(items_[i], items_.back());
    const uint32_t v = items_.back();
    items_.pop_back();
    taken_[v] = 1;
    return v;
  }
  void give(uint32_t v) {
    if (v >= taken_.size() || !taken_[v]) {
      std::cerr << "ferry-soak: internal error: index " << v << " given back twice\n";
      std::abort();
    }
    taken_[v] = 0;
    items_.push_back(v);
  }

 private:
  std::vector<uint32_t> items_;
  std::vector<uint8_t> taken_;
};

enum kind : int {
  k_success,
  k_cancelled,
  k_peer_failed,
  k_restarted,
  k_timed_out,
  k_other,
  k_lost
};
constexpr int kind_count = 7;
constexpr const char* kind_names[kind_count] = {
    "success", "cancelled", "peer_failed", "restarted", "timed_out", "other", "lost"};

/// The kind of a Failed reason (the daemons' texts; docs/reliability.md).
kind classify(const std::string& reason) {
  if (reason.find("cancelled") != std::string::npos) return k_cancelled;
  for (const char* s : {" lost", "unresponsive", "restarted", "could not use peer", "not retried",
                        "went down", "write to decode", "connection closed", "fenced"})
    if (reason.find(s) != std::string::npos) return k_peer_failed;
  if (reason.find("timed out") != std::string::npos) return k_timed_out;
  return k_other;
}

/// A reason with its numbers and instance ids blanked, so equal causes count together.
std::string normalize(const std::string& reason) {
  static const std::regex instance("\\b[0-9a-f]{8}\\b");
  static const std::regex number("[0-9]+");
  auto s = std::regex_replace(reason, instance, "<inst>");
  s = std::regex_replace(s, number, "#");
  if (s.size() > 160) s = s.substr(0, 157) + "...";
  return s;
}

/// "key: value" of a daemon's status text; -1 when absent.
int64_t status_field(const std::string& text, const std::string& key) {
  auto pos = text.find("\n" + key + ": ");
  if (pos == std::string::npos) return -1;
  return std::strtoll(text.c_str() + pos + key.size() + 3, nullptr, 10);
}

enum side_id : int { prefill = 0, decode = 1 };
constexpr const char* side_names[2] = {"prefill", "decode"};

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

constexpr const char* phase_names[4] = {"after prepare", "before any send", "after chunk 1",
                                        "after the last chunk"};

class soak {
 public:
  explicit soak(const options& o) : o_(o), rng_(o.seed) {
    sides_[prefill].socket = o.prefill_socket;
    sides_[decode].socket = o.decode_socket;
  }

  int run();

 private:
  // --- connections ---
  bool connect(side_id s, std::string& err);
  bool conn_error(side_id s, errc code, const std::string& message);
  void process_down(side_id s);
  void reconnect_due(clock_type::time_point now);
  // --- rooms ---
  bool can_start() const;
  void start_room(clock_type::time_point now);
  void on_event(side_id s, const proto::event& e);
  void on_decode_ready(room& r);
  void track_prefill(room& r);
  void send_chunk(room& r);
  void cancel(room& r, side_id s);
  void side_terminal(room& r, side_id s, room_status status, const std::string& reason);
  void release(room& r, side_id s);
  void settle(uint64_t id);
  void check_deadlines(clock_type::time_point now);
  // --- output ---
  void progress(clock_type::time_point now);
  void anomaly(const std::string& what);
  std::string final_status(side_id s, std::string& text);
  ms bound(side_id s) const {
    const auto& t = sides_[s].timeouts;
    return ms(t.transfer_ms + t.drain_ms + o_.margin_ms);
  }
  bool drain_events(side_id s);

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

bool soak::connect(side_id s, std::string& err) {
  auto& d = sides_[s];
  auto c = client::client::connect(d.socket, "ferry-soak", ms(2000), true);
  if (!c) return err = c.message, false;
  if (auto m = c.value->map_pools(); !m) return err = m.message, false;
  const auto* cfg = c.value->config();
  if (!cfg) return err = "the daemon sent no readable config", false;
  const auto& h = c.value->daemon();
  if (!h.pools[static_cast<int>(pool_kind::kv)].present)
    return err = "the daemon has no kv pool", false;
  c.value->set_timeout(ms(o_.request_timeout_ms));
  d.has_state = h.pools[static_cast<int>(pool_kind::state)].present;
  d.has_aux = h.pools[static_cast<int>(pool_kind::aux)].present;
  auto items = [&](pool_kind k) {
    return static_cast<uint32_t>(h.pools[static_cast<int>(k)].layout.buffers[0].items);
  };
  d.pages.reset(items(pool_kind::kv));
  d.slots.reset(d.has_state ? items(pool_kind::state) : 0);
  d.rows.reset(d.has_aux ? items(pool_kind::aux) : 0);
  d.timeouts = cfg->timeouts;
  d.instance = h.instance;
  d.c = std::move(c.value);
  d.up = true;
  d.down_pending = false;
  ++d.gen;
  ++d.instances;
  return true;
}

/// True (and the connection is marked broken) when a call failed locally: the daemon closed the
/// connection, or did not answer within the request timeout (a reply arriving later would be
/// taken for the next request's, so the connection cannot be used again either way).
bool soak::conn_error(side_id s, errc code, const std::string& message) {
  const bool local = message.find("ferryd closed the connection") != std::string::npos ||
                     message.find("reading from ferryd failed") != std::string::npos ||
                     message.find("writing to ferryd failed") != std::string::npos ||
                     message.find("timed out waiting for ferryd") != std::string::npos;
  if (!local) return false;
  auto& d = sides_[s];
  if (d.up) {
    d.up = false;
    d.down_pending = true;
    d.down_reason = message;
    d.down_since = d.next_attempt = clock_type::now();
    d.c.reset();
  }
  return true;
}

/// The daemon on side `s` is gone (or hung past the request timeout): its rooms died with it.
void soak::process_down(side_id s) {
  auto& d = sides_[s];
  d.down_pending = false;
  const double t = std::chrono::duration<double>(clock_type::now() - t0_).count();
  uint64_t n = 0;
  std::vector<uint64_t> ids;
  for (auto& [id, r] : rooms_) {
    auto& tr = r.side[s];
    tr.holds = false;  // the pools of that instance are gone (the free lists reset on reconnect)
    if (!tr.done) {
      tr.done = tr.restarted = true;
      tr.reason = "daemon connection lost: " + d.down_reason;
      (s == prefill ? r.p_restarted : r.d_restarted) = true;
      if (!tr.counted) ++side_kind_[s][k_restarted];
      tr.counted = true;
      ++n;
    }
    ids.push_back(id);
  }
  disconnect_rooms_[s] += n;
  fmt::print(
      "[{:7.1f}s] {} connection lost ({}); {} rooms in flight there count as failed by "
      "restart; reconnecting\n",
      t, side_names[s], d.down_reason, n);
  std::fflush(stdout);
  // The decode died: the prefill must still report its terminal state for every such room.
  if (s == decode)
    for (auto id : ids)
      if (auto it = rooms_.find(id); it != rooms_.end()) {
        auto& r = it->second;
        if (!r.side[prefill].done && !r.side[prefill].tracked && sides_[prefill].up)
          track_prefill(r);
      }
  for (auto id : ids) settle(id);
}

void soak::reconnect_due(clock_type::time_point now) {
  for (auto s : {prefill, decode}) {
    auto& d = sides_[s];
    if (d.up || now < d.next_attempt) continue;
    std::string err;
    if (connect(s, err)) {
      ++d.reconnects;
      fmt::print("[{:7.1f}s] {} reconnected after {:.2f} s: instance {}\n",
                 std::chrono::duration<double>(now - t0_).count(), side_names[s],
                 std::chrono::duration<double>(now - d.down_since).count(), d.instance);
      std::fflush(stdout);
      continue;
    }
    d.next_attempt = now + 100ms;  // retry interval
    if (now - d.down_since > std::chrono::duration<double>(o_.reconnect_seconds))
      throw std::runtime_error(fmt::format("the {} daemon did not come back within {} s: {}",
                                           side_names[s], o_.reconnect_seconds, err));
  }
}

bool soak::can_start() const {
  const auto& p = sides_[prefill];
  const auto& d = sides_[decode];
  if (!p.up || !d.up || rooms_.size() >= o_.concurrency || ids_.size() == 0) return false;
  if (p.pages.size() < max_pages_ || d.pages.size() < max_pages_) return false;
  if ((p.has_state && p.slots.size() == 0) || (d.has_state && d.slots.size() == 0)) return false;
  if ((p.has_aux && p.rows.size() == 0) || (d.has_aux && d.rows.size() == 0)) return false;
  return true;
}

void soak::start_room(clock_type::time_point now) {
  auto& P = sides_[prefill];
  auto& D = sides_[decode];
  room r;
  r.id_index = ids_.take(rng_);
  r.id = o_.room_base + r.id_index;
  r.key = (o_.seed << 40) ^ 0x50ac'0000'0000'0000ull ^ ++next_key_;
  const uint32_t n = 1 + static_cast<uint32_t>(rng_() % max_pages_);
  for (uint32_t i = 0; i < n; ++i) {
    r.src.push_back(P.pages.take(rng_));
    r.dst.push_back(D.pages.take(rng_));
  }
  if (P.has_state) r.src_slot = P.slots.take(rng_);
  if (P.has_aux) r.src_row = P.rows.take(rng_);
  if (D.has_state) r.dst_slot = D.slots.take(rng_);
  if (D.has_aux) r.dst_row = D.rows.take(rng_);
  r.side[prefill].holds = r.side[decode].holds = true;
  r.side[prefill].hold_gen = P.gen;
  r.side[decode].hold_gen = D.gen;
  // 1..max_chunks non-empty chunks
  const uint32_t k = 1 + static_cast<uint32_t>(rng_() % std::min(o_.max_chunks, n));
  std::vector<uint32_t> cuts;
  for (uint32_t i = 1; i < n; ++i) cuts.push_back(i);
  std::shuffle(cuts.begin(), cuts.end(), rng_);
  cuts.resize(k - 1);
  std::sort(cuts.begin(), cuts.end());
  uint32_t prev = 0;
  for (auto c : cuts) r.chunks.push_back(c - prev), prev = c;
  r.chunks.push_back(n - prev);
  if (std::uniform_real_distribution<double>(0, 100)(rng_) < o_.cancel_percent) {
    r.cancel_phase = static_cast<int>(rng_() % 4);
    // before the decode's prepare has reached the prefill, only the decode knows the room
    r.cancel_side = r.cancel_phase == 0 ? decode : static_cast<int>(rng_() % 2);
  }
  r.started = now;
  // The source: pattern of this incarnation's key, aux row carrying the room id.
  if (auto e = client::fill_kv(*P.c, r.key, r.src, 0); !e.empty())
    throw std::runtime_error("fill_kv: " + e);
  if (auto e = client::fill_state_and_aux(*P.c, r.key, r.src_slot, r.src_row, r.id); !e.empty())
    throw std::runtime_error("fill_state_and_aux: " + e);
  auto [it, fresh] = rooms_.emplace(r.id, std::move(r));
  if (!fresh) throw std::runtime_error(fmt::format("room id {} taken twice", it->first));
  auto& rm = it->second;
  auto ok = D.c->prepare({rm.id, {prefill_control_}, rm.dst, rm.dst_slot, rm.dst_row});
  if (!ok) {
    if (!conn_error(decode, ok.code, ok.message)) {
      ++prepare_refused_;
      anomaly(fmt::format("room {}: prepare refused: {}", rm.id, ok.message));
    }
    // not started: give everything back
    release(rm, prefill);
    release(rm, decode);
    ids_.give(rm.id_index);
    rooms_.erase(it);
    return;
  }
  ++started_;
  auto& dt = rm.side[decode];
  dt.tracked = true;
  dt.track_gen = D.gen;
  dt.deadline = now + bound(decode);
  if (auto s = D.c->subscribe(rm.id); !s && !conn_error(decode, s.code, s.message))
    anomaly(fmt::format("room {}: subscribe on the decode failed: {}", rm.id, s.message));
  if (rm.cancel_side == decode && rm.cancel_phase == 0) cancel(rm, decode);
}

void soak::cancel(room& r, side_id s) {
  auto& d = sides_[s];
  if (!d.up) return;
  auto c = d.c->cancel(r.id);
  if (c)
    ++cancels_[0];
  else if (conn_error(s, c.code, c.message))
    return;
  else if (c.code == errc::room_finished)
    ++cancels_[1];
  else if (c.code == errc::unknown_room)
    ++cancels_[2];
  else {
    ++cancels_[3];
    anomaly(fmt::format("room {}: cancel on the {} refused: {}", r.id, side_names[s], c.message));
  }
}

/// Subscribe to the room on the prefill's current instance (its terminal state frees the id).
void soak::track_prefill(room& r) {
  auto& P = sides_[prefill];
  auto& pt = r.side[prefill];
  pt.tracked = true;
  pt.done = pt.restarted = pt.seen = false;
  pt.late = r.side[decode].done;
  pt.track_gen = P.gen;
  pt.deadline = clock_type::now() + bound(prefill);
  auto s = P.c->subscribe(r.id);
  if (s) return;
  if (conn_error(prefill, s.code, s.message)) return;  // process_down marks it
  pt.done = true;
  if (s.code == errc::unknown_room) {
    pt.unknown = true;  // the prefill never heard of this incarnation
    ++late_[0];
  } else {
    pt.reason = "subscribe failed: " + s.message;
    anomaly(fmt::format("room {}: subscribe on the prefill failed: {}", r.id, s.message));
  }
  release(r, prefill);
}

/// The decode shows WaitingForInput: every prefill rank accepted the prepare, so the prefill
/// room of this incarnation exists. Subscribe there, then send the chunks (or cancel).
void soak::on_decode_ready(room& r) {
  auto& P = sides_[prefill];
  if (!P.up || r.side[prefill].hold_gen != P.gen || !r.side[prefill].holds) {
    // The prefill restarted since this room began: its source died with the old instance. The
    // new instance took the decode's prepare, so track the room there, and give up on it.
    if (P.up && (!r.side[prefill].tracked || r.side[prefill].restarted)) track_prefill(r);
    cancel(r, decode);
    return;
  }
  track_prefill(r);
  if (!P.up) return;
  if (r.cancel_side >= 0 && r.cancel_phase == 1) return cancel(r, side_id(r.cancel_side));
  send_chunk(r);
  if (r.cancel_side >= 0 && r.cancel_phase == 2) return cancel(r, side_id(r.cancel_side));
  while (!r.stop_sending && r.chunks_sent < r.chunks.size() && P.up) send_chunk(r);
  if (r.cancel_side >= 0 && r.cancel_phase == 3) cancel(r, side_id(r.cancel_side));
}

void soak::send_chunk(room& r) {
  auto& P = sides_[prefill];
  if (r.stop_sending || !P.up || r.chunks_sent >= r.chunks.size()) return;
  uint32_t pos = 0;
  for (uint32_t i = 0; i < r.chunks_sent; ++i) pos += r.chunks[i];
  const uint32_t n = r.chunks[r.chunks_sent];
  const bool last = r.chunks_sent + 1 == r.chunks.size();
  std::vector<uint32_t> pages(r.src.begin() + pos, r.src.begin() + pos + n);
  auto ok = P.c->send(
      {r.id, std::move(pages), last, last ? r.src_slot : no_index, last ? r.src_row : no_index});
  ++sends_;
  if (ok) {
    ++r.chunks_sent;
    return;
  }
  r.stop_sending = true;
  if (conn_error(prefill, ok.code, ok.message)) return;
  // The room failed meanwhile (a peer, a cancel): room_finished once it is terminal, cancelled
  // while its writes drain. An engine stops sending either way.
  if (ok.code == errc::room_finished || ok.code == errc::cancelled) {
    ++sends_after_failure_;
    return;
  }
  anomaly(fmt::format("room {}: send of chunk {} refused: {}", r.id, r.chunks_sent, ok.message));
  cancel(r, decode);
}

void soak::on_event(side_id s, const proto::event& e) {
  auto it = rooms_.find(e.room);
  if (it == rooms_.end()) return void(++ignored_events_);
  auto& r = it->second;
  auto& t = r.side[s];
  if (!t.tracked || t.done || t.track_gen != sides_[s].gen) return void(++ignored_events_);
  const bool first = !t.seen;
  t.seen = true;
  if (t.late && first && is_terminal(e.status)) {
    // Already ended when asked, after the decode had: this or an earlier incarnation of the id
    // (the daemon keeps the last status per id). Resolved, but not counted as this room's.
    ++late_[1];
    t.done = true;
    t.last = e.status;
    t.unknown = true;
    release(r, s);
    return settle(e.room);
  }
  if (t.late && first) ++late_[2];
  if (!is_terminal(e.status)) {
    t.last = e.status;
    if (s == decode && e.status >= room_status::waiting_for_input && !r.ready_seen) {
      r.ready_seen = true;
      on_decode_ready(r);
    }
  } else {
    side_terminal(r, s, e.status, e.reason);
  }
  settle(e.room);
}

void soak::side_terminal(room& r, side_id s, room_status status, const std::string& reason) {
  auto& t = r.side[s];
  t.done = true;
  t.last = status;
  t.reason = reason;
  t.success = status == room_status::success;
  if (!t.counted) ++side_kind_[s][t.success ? k_success : classify(reason)];
  t.counted = true;
  if (!t.success) ++reasons_[std::string(side_names[s]) + ": " + normalize(reason)];
  if (s == decode) {
    if (t.success) {
      auto& D = sides_[decode];
      if (t.holds && t.hold_gen == D.gen && D.up) {
        auto err = client::verify_room(*D.c, r.key, r.id, r.dst, r.dst_slot, r.dst_row);
        if (err.empty()) {
          ++verified_;
        } else {
          ++corrupted_;
          if (evidence_.size() < 20)
            evidence_.push_back(fmt::format(
                "CORRUPTED room {} (key {:#x}, {} pages, {} chunks, dst slot {} row {}): {}", r.id,
                r.key, r.dst.size(), r.chunks.size(), r.dst_slot, r.dst_row, err));
          std::cout << evidence_.back() << std::endl;
        }
      }
    }
    release(r, decode);
    // The id is free once the prefill is terminal too: make sure the prefill's current
    // instance is asked about this incarnation (it may have taken the prepare, or not).
    auto& pt = r.side[prefill];
    if (sides_[prefill].up && !pt.lost && (!pt.tracked || pt.restarted)) track_prefill(r);
  } else {
    release(r, prefill);
  }
}

void soak::release(room& r, side_id s) {
  auto& t = r.side[s];
  if (!t.holds) return;
  t.holds = false;
  auto& d = sides_[s];
  if (t.hold_gen != d.gen) return;  // another instance's pools: the free lists were reset
  for (auto p : (s == prefill ? r.src : r.dst)) d.pages.give(p);
  const uint32_t slot = s == prefill ? r.src_slot : r.dst_slot;
  const uint32_t row = s == prefill ? r.src_row : r.dst_row;
  if (slot != no_index) d.slots.give(slot);
  if (row != no_index) d.rows.give(row);
}

/// A room whose both sides are resolved leaves the flight: its outcome is counted and its id is
/// free again (or quarantined, when a side was lost: its incarnation may still be alive).
void soak::settle(uint64_t id) {
  auto it = rooms_.find(id);
  if (it == rooms_.end()) return;
  auto& r = it->second;
  auto& d = r.side[decode];
  auto& p = r.side[prefill];
  if (!d.done || !p.done) return;
  kind k;
  if (d.lost || p.lost)
    k = k_lost;
  else if (d.success && p.success)
    k = k_success;
  else if (r.p_restarted || r.d_restarted)
    k = k_restarted;
  else if (!d.success)
    k = classify(d.reason);
  else if (!p.unknown)
    k = classify(p.reason);
  else {
    k = k_other;
    anomaly(fmt::format("room {}: Success on the decode, but the prefill does not know it", id));
  }
  if (d.success && !p.success && !p.unknown && !p.restarted && !p.lost)
    ++reasons_["room: decode Success, prefill " + normalize(p.reason)];
  ++outcome_[k];
  if (k == k_lost)
    ++quarantined_ids_;
  else
    ids_.give(r.id_index);
  rooms_.erase(it);
}

void soak::check_deadlines(clock_type::time_point now) {
  std::vector<uint64_t> expired;
  for (auto& [id, r] : rooms_)
    for (auto s : {prefill, decode}) {
      auto& t = r.side[s];
      if (!t.tracked || t.done || now < t.deadline) continue;
      // Lost: no terminal state within the bound. Keep its pages, slot, row and id out of
      // circulation (a late write may still come), and capture what the daemon says.
      t.done = t.lost = true;
      std::string polled = "daemon down";
      if (sides_[s].up) {
        auto pr = sides_[s].c->poll(id);
        if (pr)
          polled = fmt::format("{} {}", to_string(pr.value.status), pr.value.reason);
        else if (!conn_error(s, pr.code, pr.message))
          polled = "poll failed: " + pr.message;
      }
      auto line = fmt::format(
          "LOST room {} on the {} (instance {}): not terminal {:.1f} s after it began (last "
          "status seen {}; poll now: {}); key {:#x}, {} pages, chunks sent {}/{}, cancel {}{}, "
          "other side: {} {}",
          id, side_names[s], sides_[s].instance,
          std::chrono::duration<double>(now - r.started).count(), to_string(t.last), polled, r.key,
          r.src.size(), r.chunks_sent, r.chunks.size(),
          r.cancel_side < 0 ? "none" : side_names[r.cancel_side],
          r.cancel_side < 0 ? "" : std::string(" ") + phase_names[r.cancel_phase],
          r.side[1 - s].done ? (r.side[1 - s].success ? "Success" : "Failed/gone") : "pending",
          r.side[1 - s].reason);
      std::cout << line << std::endl;
      if (evidence_.size() < 20) evidence_.push_back(line);
      if (!t.counted) ++side_kind_[s][k_lost];
      t.counted = true;
      expired.push_back(id);
    }
  for (auto id : expired) settle(id);
}

void soak::anomaly(const std::string& what) {
  ++anomalies_;
  if (anomalies_ <= 20) std::cout << "anomaly: " << what << std::endl;
}

void soak::progress(clock_type::time_point now) {
  const double t = std::chrono::duration<double>(now - t0_).count();
  const double dt = std::chrono::duration<double>(now - last_progress_).count();
  // The decode's count of writes that arrived for a room already ended (docs/reliability.md 3).
  std::string stray = "?";
  if (sides_[decode].up) {
    if (auto st = sides_[decode].c->info(proto::info_topic::status))
      stray = std::to_string(status_field(st.value, "stray_writes"));
    else
      conn_error(decode, st.code, st.message);
  }
  fmt::print(
      "[{:7.1f}s] started={} success={} cancelled={} peer_failed={} restarted={} timed_out={} "
      "other={} lost={} corrupted={} in_flight={} rate={:.0f}/s (last {:.0f}/s) "
      "decode_stray_writes={}\n",
      t, started_, outcome_[k_success], outcome_[k_cancelled], outcome_[k_peer_failed],
      outcome_[k_restarted], outcome_[k_timed_out], outcome_[k_other], outcome_[k_lost], corrupted_,
      rooms_.size(), t > 0 ? started_ / t : 0.0, dt > 0 ? (started_ - last_started_) / dt : 0.0,
      stray);
  std::fflush(stdout);
  last_started_ = started_;
  last_progress_ = now;
}

/// Take every event already buffered or readable without waiting; false when the connection
/// broke.
bool soak::drain_events(side_id s) {
  for (;;) {
    auto& d = sides_[s];
    if (!d.up) return false;
    auto e = d.c->next_event(ms(0));
    if (!e) return e.code == errc::timed_out || !conn_error(s, e.code, e.message);
    on_event(s, e.value);
  }
}

/// Read a daemon's status until it shows no active room and no staging in use (bounded: the
/// staging is given back after the terminal event, and nothing announces it).
std::string soak::final_status(side_id s, std::string& text) {
  auto& d = sides_[s];
  const auto until = clock_type::now() + 10s;
  for (;;) {
    if (!d.up) return "not connected";
    auto st = d.c->info(proto::info_topic::status);
    if (!st) {
      conn_error(s, st.code, st.message);
      return "status failed: " + st.message;
    }
    text = st.value;
    const auto active =
        status_field(text, "prefill_rooms_active") + status_field(text, "decode_rooms_active");
    if ((active == 0 && status_field(text, "staging_in_use") <= 0) || clock_type::now() > until)
      return "";
    pollfd p{d.c->native_handle(), POLLIN, 0};
    ::poll(&p, 1, 100);  // bounded re-read: no event announces the staging release
    drain_events(s);
  }
}

int soak::run() {
  for (auto s : {prefill, decode}) {
    std::string err;
    if (!connect(s, err)) {
      std::cerr << "ferry-soak: cannot use the " << side_names[s] << " daemon at "
                << sides_[s].socket << ": " << err << "\n";
      return 2;
    }
  }
  auto& P = sides_[prefill];
  auto& D = sides_[decode];
  prefill_control_ = o_.prefill_control.empty() ? P.c->daemon().control : o_.prefill_control;
  if (P.c->daemon().role == "decode" || D.c->daemon().role == "prefill") {
    std::cerr << "ferry-soak: --prefill-socket must reach a prefill daemon and --decode-socket a "
                 "decode daemon\n";
    return 2;
  }
  // Every room in flight must fit the pools at once.
  auto need = [&](const char* what, uint64_t want, uint64_t have, side_id s) {
    if (want <= have) return true;
    std::cerr << fmt::format("ferry-soak: {} rooms in flight need {} {} on the {}, which has {}\n",
                             o_.concurrency, want, what, side_names[s], have);
    return false;
  };
  max_pages_ = o_.max_pages;
  for (auto s : {prefill, decode}) {
    const auto& d = sides_[s];
    if (!need("kv pages", uint64_t{o_.concurrency} * o_.max_pages, d.pages.capacity(), s) ||
        (d.has_state && !need("state slots", o_.concurrency, d.slots.capacity(), s)) ||
        (d.has_aux && !need("aux rows", o_.concurrency, d.rows.capacity(), s)))
      return 2;
  }
  if (P.has_state != D.has_state || P.has_aux != D.has_aux) {
    std::cerr << "ferry-soak: the two daemons must have the same pools\n";
    return 2;
  }
  ids_.reset(o_.room_ids ? o_.room_ids : 2 * o_.concurrency);
  if (ids_.size() < o_.concurrency) {
    std::cerr << "ferry-soak: --room-ids must be at least --concurrency\n";
    return 2;
  }
  fmt::print(
      "ferry-soak: {} ({}) -> {} ({}), prefill control {}; {} s at {} rooms/s, concurrency {}, "
      "1..{} pages, 1..{} chunks, {}% cancelled, {} room ids reused, seed {}; a room must be "
      "terminal within {} ms on the decode, {} ms on the prefill\n",
      P.c->daemon().node, P.instance, D.c->daemon().node, D.instance, prefill_control_, o_.seconds,
      o_.rate, o_.concurrency, o_.max_pages, o_.max_chunks, o_.cancel_percent, ids_.size(), o_.seed,
      bound(decode).count(), bound(prefill).count());
  std::fflush(stdout);

  t0_ = last_progress_ = clock_type::now();
  const auto end = t0_ + std::chrono::duration_cast<clock_type::duration>(
                             std::chrono::duration<double>(o_.seconds));
  const auto interval = std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(1.0 / o_.rate));
  const auto progress_every = std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(o_.progress_seconds));
  auto next_start = t0_;
  auto next_deadline_check = t0_;
  int rc = 0;
  try {
    for (;;) {
      auto now = clock_type::now();
      const bool ending = now >= end;
      reconnect_due(now);
      for (auto s : {prefill, decode})
        if (sides_[s].down_pending) process_down(s);
      // Start rooms on schedule; after a stall (concurrency full, a daemon down) the schedule
      // catches up by at most 100 ms worth of rooms.
      if (!ending) {
        if (next_start < now - 100ms) next_start = now - 100ms;
        for (int burst = 0; burst < 64 && now >= next_start && can_start(); ++burst) {
          start_room(now);
          next_start += interval;
        }
      }
      for (auto s : {prefill, decode}) drain_events(s);
      for (auto s : {prefill, decode})
        if (sides_[s].down_pending) process_down(s);
      now = clock_type::now();
      if (now >= next_deadline_check) {
        check_deadlines(now);
        next_deadline_check = now + 50ms;
      }
      if (now - last_progress_ >= progress_every) progress(now);
      if (ending && rooms_.empty() && P.up && D.up) break;
      // Wait for events, until the next start is due (pacing) or 50 ms.
      auto wait = ms(50);
      if (!ending && can_start())
        wait = std::clamp(std::chrono::duration_cast<ms>(next_start - now), ms(0), ms(50));
      pollfd fds[2];
      side_id which[2];
      nfds_t n = 0;
      for (auto s : {prefill, decode})
        if (sides_[s].up) {
          fds[n] = {sides_[s].c->native_handle(), POLLIN, 0};
          which[n++] = s;
        }
      if (::poll(fds, n, static_cast<int>(wait.count())) > 0)
        for (nfds_t i = 0; i < n; ++i) {
          if (!fds[i].revents || !sides_[which[i]].up) continue;
          auto e = sides_[which[i]].c->next_event(ms(100));
          if (e)
            on_event(which[i], e.value);
          else if (e.code != errc::timed_out)
            conn_error(which[i], e.code, e.message);
        }
    }
  } catch (const std::exception& ex) {
    std::cout << "ferry-soak: stopped: " << ex.what() << std::endl;
    rc = 2;
  }
  const auto stopped = clock_type::now();
  progress(stopped);
  const double run_s = std::min(std::chrono::duration<double>(stopped - t0_).count(), o_.seconds);
  const double drain_s = std::chrono::duration<double>(stopped - end).count();

  // --- the daemons after the drain ---
  std::string text[2], err[2];
  for (auto s : {prefill, decode}) err[s] = final_status(s, text[s]);
  auto field = [&](side_id s, const char* k) {
    return err[s].empty() ? status_field(text[s], k) : -1;
  };
  const int64_t stray = field(decode, "stray_writes");
  const int64_t p_active = field(prefill, "prefill_rooms_active");
  const int64_t d_active = field(decode, "decode_rooms_active");
  const int64_t staging =
      std::max(field(prefill, "staging_in_use"), field(decode, "staging_in_use"));

  uint64_t lost = outcome_[k_lost];
  std::cout << "\nferry-soak summary\n";
  fmt::print("  duration          {:.1f} s of starts, then {:.1f} s to drain\n", run_s,
             std::max(0.0, drain_s));
  fmt::print("  rooms started     {} ({:.1f}/s achieved, target {}/s); {} prepares refused\n",
             started_, run_s > 0 ? started_ / run_s : 0.0, o_.rate, prepare_refused_);
  fmt::print("  outcome by kind   ");
  for (int k = 0; k < kind_count; ++k)
    fmt::print("{}{}={}", k ? " " : "", kind_names[k], outcome_[k]);
  fmt::print("\n  lost              {}\n", lost);
  fmt::print("  corrupted         {} ({} Success rooms verified byte-exact)\n", corrupted_,
             verified_);
  for (auto s : {decode, prefill}) {
    fmt::print("  {:<8} side     ", side_names[s]);
    for (int k = 0; k < kind_count; ++k)
      fmt::print("{}{}={}", k ? " " : "", kind_names[k], side_kind_[s][k]);
    fmt::print("\n");
  }
  fmt::print(
      "  late lookups      {} rooms failed on the decode before the prefill showed them: the "
      "prefill did not know {}, had already ended {} (not counted per side: may be an earlier "
      "incarnation's status), was followed to its end for {}\n",
      late_[0] + late_[1] + late_[2], late_[0], late_[1], late_[2]);
  fmt::print("  cancels           accepted={} too_late={} unknown_room={} refused={}\n",
             cancels_[0], cancels_[1], cancels_[2], cancels_[3]);
  fmt::print("  sends             {} ({} refused because the room had already failed)\n", sends_,
             sends_after_failure_);
  fmt::print(
      "  restarts seen     prefill {} (instances {}), decode {} (instances {}); rooms "
      "failed by restart: prefill side {}, decode side {}\n",
      P.reconnects, P.instances, D.reconnects, D.instances, disconnect_rooms_[prefill],
      disconnect_rooms_[decode]);
  fmt::print("  room ids          {} in the pool, {} quarantined (lost rooms)\n", ids_.capacity(),
             quarantined_ids_);
  fmt::print("  anomalies         {}\n", anomalies_);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print("  ferry-soak cpu    {:.1f} s user + {:.1f} s system\n",
             ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
             ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  for (auto s : {prefill, decode}) {
    if (!err[s].empty()) {
      fmt::print("  {} status     unavailable: {}\n", side_names[s], err[s]);
      continue;
    }
    fmt::print(
        "  {:<8} status  instance {} rooms_active={} succeeded={} failed={} stray_writes={} "
        "staging_in_use={}\n",
        side_names[s], sides_[s].instance,
        field(s, s == prefill ? "prefill_rooms_active" : "decode_rooms_active"),
        field(s, s == prefill ? "prefill_rooms_succeeded" : "decode_rooms_succeeded"),
        field(s, s == prefill ? "prefill_rooms_failed" : "decode_rooms_failed"),
        field(s, "stray_writes"), field(s, "staging_in_use"));
  }
  if (D.instances == 1 && err[decode].empty()) {
    const int64_t daemon_total =
        field(decode, "decode_rooms_succeeded") + field(decode, "decode_rooms_failed");
    fmt::print("  decode cross-check: the daemon ended {} rooms, this run prepared {} ({})\n",
               daemon_total, started_,
               daemon_total == static_cast<int64_t>(started_) ? "equal" : "DIFFERENT");
  }
  std::vector<std::pair<uint64_t, std::string>> top;
  for (const auto& [r, n] : reasons_) top.emplace_back(n, r);
  std::sort(top.rbegin(), top.rend());
  fmt::print("  failure reasons   {} distinct (numbers as #, instance ids as <inst>){}\n",
             top.size(), top.size() > 25 ? "; the 25 most frequent:" : ":");
  for (size_t i = 0; i < top.size() && i < 25; ++i)
    fmt::print("    {:>8}  {}\n", top[i].first, top[i].second);
  if (!evidence_.empty()) {
    std::cout << "  evidence:\n";
    for (const auto& e : evidence_) std::cout << "    " << e << "\n";
  }
  const bool leak = p_active != 0 || d_active != 0 || staging > 0;
  fmt::print(
      "SOAK seconds={:.0f} started={} rate={:.1f} success={} cancelled={} peer_failed={} "
      "restarted={} timed_out={} other={} lost={} corrupted={} verified={} stray_writes={} "
      "prefill_active={} decode_active={} staging_in_use={} anomalies={} prefill_instances={} "
      "seed={}\n",
      run_s, started_, run_s > 0 ? started_ / run_s : 0.0, outcome_[k_success],
      outcome_[k_cancelled], outcome_[k_peer_failed], outcome_[k_restarted], outcome_[k_timed_out],
      outcome_[k_other], lost, corrupted_, verified_, stray, p_active, d_active, staging,
      anomalies_, P.instances, o_.seed);
  std::fflush(stdout);
  if (rc) return rc;
  if (lost || corrupted_ || leak) return 1;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "ferry-soak: a bounded soak of a prefill and a decode ferryd: rooms at a target rate with "
      "random pages, chunks, reused ids and cancels; every room must be terminal on both sides "
      "within a bound and every Success byte-exact. Survives daemon restarts (rooms in flight on "
      "a dead daemon count as failed by restart). Exit 0: nothing lost, corrupted or leaked; 1: "
      "something was; 2: could not run"};
  app.add_option("--prefill-socket", o.prefill_socket, "client socket of the prefill ferryd")
      ->capture_default_str();
  app.add_option("--decode-socket", o.decode_socket, "client socket of the decode ferryd")
      ->capture_default_str();
  app.add_option("--prefill-control", o.prefill_control,
                 "control address (host:port) a decode prepare names (default: the prefill's "
                 "listen.control from its hello)");
  app.add_option("--seconds", o.seconds, "how long to start rooms; the rooms in flight then drain")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--rate", o.rate,
                 "target rooms started per second (the achieved rate is reported)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1e6));
  app.add_option("--concurrency", o.concurrency, "rooms in flight at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--cancel-percent", o.cancel_percent,
                 "rooms cancelled, from a random side at a random phase")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--max-pages", o.max_pages, "KV pages per room: 1..this, at random")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-chunks", o.max_chunks, "chunks per room: 1..this, at random")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--seed", o.seed, "random seed (default: time-based; printed)");
  app.add_option("--progress-seconds", o.progress_seconds, "a progress line every this many s")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--room-ids", o.room_ids,
                 "size of the pool of room ids, reused after terminal (default: 2 x concurrency)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--room-base", o.room_base, "first room id of the pool")->capture_default_str();
  app.add_option("--margin-ms", o.margin_ms,
                 "a room is LOST when a side is not terminal within the daemon's "
                 "timeouts.transfer_ms + drain_ms + this")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  app.add_option("--reconnect-seconds", o.reconnect_seconds,
                 "give up when a daemon's socket does not accept a client again within this")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--request-timeout-ms", o.request_timeout_ms,
                 "a request unanswered this long breaks the connection (a hung daemon)")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  CLI11_PARSE(app, argc, argv);
  if (o.seed == 0)
    o.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) &
             0xffffff;
  soak s(o);
  return s.run();
}
