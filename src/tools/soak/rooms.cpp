// The workload: rooms started at random (pages, chunks, reused ids, cancels) and driven
// through prepare, subscribe, send and cancel on the two daemons as their events arrive.

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

#include "tools/soak/soak.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::soak {

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
  if (auto e = client::fill_kv(*P.c, r.key, r.src, 0); !e)
    throw std::runtime_error("fill_kv: " + e.message);
  if (auto e = client::fill_state_and_aux(*P.c, r.key, r.src_slot, r.src_row, r.id); !e)
    throw std::runtime_error("fill_state_and_aux: " + e.message);
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
    pt.code = s.code;
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
    side_terminal(r, s, e.status, e.code, e.reason);
  }
  settle(e.room);
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

}  // namespace ferry::soak
