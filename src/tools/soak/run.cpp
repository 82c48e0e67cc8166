// A run of the soak: the daemons checked against what it asks of them, then the one event loop
// that starts rooms on schedule and feeds both daemons' events to them until the last room has
// drained, then the summary.

#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <cstdio>
#include <iostream>

#include "core/exit_codes.hpp"
#include "tools/soak/soak.hpp"

namespace ferry::soak {

using namespace std::chrono_literals;

/// Connect to both daemons and check they can carry the soak (roles, pools large enough for
/// every room in flight at once, room ids); an exit code, the reason printed, when they cannot.
int soak::preflight() {
  for (auto s : {prefill, decode}) {
    if (auto connected = connect(s); !connected) {
      std::cerr << "ferry-soak: cannot use the " << side_names[s] << " daemon at "
                << sides_[s].socket << ": " << connected.message << "\n";
      // Not a ferryd, gone, or it failed an answer: unreachable. A daemon that answers but has
      // no kv pool is a wrong --*-socket.
      return connected.code == errc::wrong_role ? exit_code::usage : exit_code::unreachable;
    }
  }
  auto& P = sides_[prefill];
  auto& D = sides_[decode];
  prefill_control_ = o_.prefill_control.empty() ? P.c->daemon().control : o_.prefill_control;
  if (P.c->daemon().role == "decode" || D.c->daemon().role == "prefill") {
    std::cerr << "ferry-soak: --prefill-socket must reach a prefill daemon and --decode-socket a "
                 "decode daemon\n";
    return exit_code::usage;
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
      return exit_code::usage;
  }
  if (P.has_state != D.has_state || P.has_aux != D.has_aux) {
    std::cerr << "ferry-soak: the two daemons must have the same pools\n";
    return exit_code::usage;
  }
  ids_.reset(o_.room_ids ? o_.room_ids : 2 * o_.concurrency);
  if (ids_.size() < o_.concurrency) {
    std::cerr << "ferry-soak: --room-ids must be at least --concurrency\n";
    return exit_code::usage;
  }
  fmt::print(
      "ferry-soak: {} ({}) -> {} ({}), prefill control {}; {} s at {} rooms/s, concurrency {}, "
      "1..{} pages, 1..{} chunks, {}% cancelled, {} room ids reused, seed {}; a room must be "
      "terminal within {} ms on the decode, {} ms on the prefill\n",
      P.c->daemon().node, P.instance, D.c->daemon().node, D.instance, prefill_control_, o_.seconds,
      o_.rate, o_.concurrency, o_.max_pages, o_.max_chunks, o_.cancel_percent, ids_.size(), o_.seed,
      bound(decode).count(), bound(prefill).count());
  std::fflush(stdout);
  return exit_code::ok;
}

int soak::run() {
  if (const int rc = preflight()) return rc;
  auto& P = sides_[prefill];
  auto& D = sides_[decode];
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
  } catch (const daemon_gone& ex) {
    std::cout << "ferry-soak: stopped: " << ex.what() << std::endl;
    rc = exit_code::unreachable;
  } catch (const std::exception& ex) {
    std::cout << "ferry-soak: stopped: " << ex.what() << std::endl;
    rc = exit_code::failed;
  }
  const auto stopped = clock_type::now();
  progress(stopped);
  const double run_s = std::min(std::chrono::duration<double>(stopped - t0_).count(), o_.seconds);
  const double drain_s = std::chrono::duration<double>(stopped - end).count();

  const bool clean = summary(run_s, drain_s);
  if (rc) return rc;
  return clean ? exit_code::ok : exit_code::failed;
}

}  // namespace ferry::soak
