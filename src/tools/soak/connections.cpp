// ferry-soak's connections to the two daemons: made, found broken, re-made after a restart,
// and read for events. A broken connection is how a daemon's death reaches the rooms.

#include <fmt/format.h>

#include <cstdio>
#include <stdexcept>

#include "tools/soak/soak.hpp"
#include "tools/workload/daemon_config.hpp"

namespace ferry::soak {

using namespace std::chrono_literals;

result<> soak::connect(side_id s) {
  auto& d = sides_[s];
  auto c = client::client::connect(d.socket, "ferry-soak", ms(2000), true);
  if (!c) return std::move(c).error();
  if (auto m = c.value->map_pools(); !m) return m;
  const auto cfg = client::daemon_config(*c.value);
  if (!cfg) return error{errc::malformed_frame, "the daemon sent no readable config"};
  const auto& h = c.value->daemon();
  if (!h.pools[static_cast<int>(pool_kind::kv)].present)
    return error{errc::wrong_role, "the daemon has no kv pool"};
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
  return {};
}

/// True (and the connection is marked broken) when a call failed locally: the daemon closed the
/// connection, or did not answer within the request timeout (a reply arriving later would be
/// taken for the next request's, so the connection cannot be used again either way). The
/// client library reports these as peer_lost and timed_out, codes ferryd never gives a
/// request's error reply (its rooms carry them in statuses instead).
bool soak::conn_error(side_id s, errc code, const std::string& message) {
  const bool local = code == errc::peer_lost || code == errc::timed_out;
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
    auto connected = connect(s);
    if (connected) {
      ++d.reconnects;
      fmt::print("[{:7.1f}s] {} reconnected after {:.2f} s: instance {}\n",
                 std::chrono::duration<double>(now - t0_).count(), side_names[s],
                 std::chrono::duration<double>(now - d.down_since).count(), d.instance);
      std::fflush(stdout);
      continue;
    }
    d.next_attempt = now + 100ms;  // retry interval
    if (now - d.down_since > std::chrono::duration<double>(o_.reconnect_seconds))
      throw daemon_gone(fmt::format("the {} daemon did not come back within {} s: {}",
                                    side_names[s], o_.reconnect_seconds, connected.message));
  }
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

}  // namespace ferry::soak
