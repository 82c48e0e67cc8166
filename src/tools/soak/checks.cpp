// What the soak checks of every room: each side terminal within its bound (else LOST), every
// Success on the decode byte-exact (else CORRUPTED), and the outcome it counts as.

#include <fmt/format.h>

#include <iostream>

#include "tools/soak/soak.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::soak {

void soak::side_terminal(room& r, side_id s, room_status status, errc code,
                         const std::string& reason) {
  auto& t = r.side[s];
  t.done = true;
  t.last = status;
  t.code = code;
  t.reason = reason;
  t.success = status == room_status::success;
  if (!t.counted) ++side_kind_[s][t.success ? k_success : classify(code)];
  t.counted = true;
  if (!t.success) ++reasons_[std::string(side_names[s]) + ": " + normalize(reason)];
  if (s == decode) {
    if (t.success) {
      auto& D = sides_[decode];
      if (t.holds && t.hold_gen == D.gen && D.up) {
        auto verified = client::verify_room(*D.c, r.key, r.id, r.dst, r.dst_slot, r.dst_row);
        if (verified) {
          ++verified_;
        } else {
          ++corrupted_;
          if (evidence_.size() < 20)
            evidence_.push_back(fmt::format(
                "CORRUPTED room {} (key {:#x}, {} pages, {} chunks, dst slot {} row {}): {}", r.id,
                r.key, r.dst.size(), r.chunks.size(), r.dst_slot, r.dst_row, verified.message));
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
    k = classify(d.code);
  else if (!p.unknown)
    k = classify(p.code);
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

}  // namespace ferry::soak
