// The machinery of ferry-bench's scale modes: connections, daemon memory, and rooms driven many
// at a time (scale_rooms.hpp).

#include "tools/bench/scale_rooms.hpp"

#include <fmt/format.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_map>

#include "core/exit_codes.hpp"
#include "core/plan.hpp"
#include "tools/bench/bench.hpp"
#include "tools/workload/daemon_config.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::bench::scale {

stop stop_on(const client::client& c, const ferry::error& e, const std::string& what) {
  return stop{exit_code::for_error(e.code, c.lost()), what + e.message};
}

maybe_stop connect_independent(std::vector<instance>& prefills, instance& decode,
                               const std::vector<std::string>& sockets,
                               const std::vector<std::string>& decode_sockets, const char* option,
                               const char* mode, std::ostream& text) {
  prefills.resize(sockets.size());
  for (size_t i = 0; i < sockets.size(); ++i)
    if (auto s = connect(prefills[i], {sockets[i]}, text)) return s;
  if (auto s = connect(decode, decode_sockets, text)) return s;
  // Independent instances: a node (and a control address) once each.
  for (size_t i = 0; i < prefills.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (prefills[i].controls[0] == prefills[j].controls[0])
        return stop{exit_code::usage,
                    fmt::format("{} {} and {} are the same prefill ({}): {} needs independent "
                                "instances",
                                option, sockets[j], sockets[i], prefills[i].controls[0], mode)};
  return std::nullopt;
}

maybe_stop connect(instance& out, const std::vector<std::string>& sockets, std::ostream& text) {
  for (const auto& path : sockets) {
    auto c = client::client::connect(path, "ferry-bench");
    if (!c) return stop{exit_code::unreachable, c.message};
    if (auto m = c.value->map_pools(); !m) return stop_on(*c.value, m.error(), path + ": ");
    auto mem = client::engine_memory::lend(*c.value);
    if (!mem) return stop_on(*c.value, mem.error(), path + ": ");
    if (mem.value.lent())
      text << fmt::format("{}: lent {} pool(s) of this process's memory (memory: client)\n", path,
                          mem.value.lent());
    out.lent.push_back(std::move(mem.value));
    const auto cfg = client::daemon_config(*c.value);
    if (!cfg) return stop{exit_code::failed, path + ": the daemon sent no readable config"};
    out.controls.push_back(c.value->daemon().control);
    out.schemas.push_back(schema_of(*cfg));
    out.ranks.push_back(std::move(c.value));
  }
  return std::nullopt;
}

namespace {

/// The pid of the process at the other end of `c`'s socket, or 0.
pid_t peer_pid(const client::client& c) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(c.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return 0;
  return std::max(cred.pid, 0);
}

}  // namespace

std::optional<double> cpu_seconds_of(const client::client& c) {
  const pid_t pid = peer_pid(c);
  if (pid == 0) return std::nullopt;
  std::ifstream f(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  // After the command (which may hold spaces) utime and stime are the 12th and 13th fields.
  const auto close = line.rfind(')');
  if (close == std::string::npos || close + 2 > line.size()) return std::nullopt;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i)
    if (i >= 12) ticks += std::stod(field);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::optional<daemon_memory> memory_of(const client::client& c) {
  const pid_t pid = peer_pid(c);
  if (pid == 0) return std::nullopt;
  std::ifstream f(fmt::format("/proc/{}/status", pid));
  if (!f) return std::nullopt;
  daemon_memory m;
  bool any = false;
  for (std::string line; std::getline(f, line);) {
    std::istringstream in(line);
    std::string key;
    uint64_t kib = 0;
    if (!(in >> key >> kib)) continue;
    if (key == "VmRSS:") m.rss_kib = kib, any = true;
    if (key == "RssAnon:") m.anon_kib = kib;
    if (key == "RssShmem:") m.shmem_kib = kib;
  }
  if (!any) return std::nullopt;
  return m;
}

driver::driver(std::vector<instance>& prefills, instance& decode, uint32_t pages_per_room,
               uint32_t src_regions, bool verify)
    : prefills_(prefills),
      decode_(decode),
      pages_(pages_per_room),
      regions_(std::max(1u, src_regions)),
      verify_(verify) {
  auto all_have = [&](pool_kind k) {
    const auto i = static_cast<int>(k);
    for (const auto& c : decode_.ranks)
      if (!c->daemon().pools[i].present) return false;
    for (const auto& p : prefills_)
      for (const auto& c : p.ranks)
        if (!c->daemon().pools[i].present) return false;
    return true;
  };
  state_ = all_have(pool_kind::state);
  aux_ = all_have(pool_kind::aux);
}

std::vector<uint32_t> driver::src_pages(uint32_t src) const {
  std::vector<uint32_t> v(pages_);
  const uint32_t first = (src % regions_) * pages_;
  for (uint32_t i = 0; i < pages_; ++i) v[i] = first + i;
  return v;
}

std::vector<uint32_t> driver::dst_pages(uint32_t dst) const {
  std::vector<uint32_t> v(pages_);
  for (uint32_t i = 0; i < pages_; ++i) v[i] = dst * pages_ + i;
  return v;
}

uint64_t driver::key_of(uint32_t src) const { return 0x5ca1'0000'0000ull + src % regions_; }

maybe_stop driver::fill(uint32_t slots) {
  for (auto& p : prefills_)
    for (auto& c : p.ranks) {
      for (uint32_t r = 0; r < std::min(regions_, slots); ++r)
        if (auto e = client::fill_kv(*c, key_of(r), src_pages(r), 0); !e)
          return stop_on(*c, e.error(), "fill: ");
      if (!state_ && !aux_) continue;
      for (uint32_t s = 0; s < slots; ++s)
        if (auto e = client::fill_state_and_aux(*c, key_of(s), state_ ? s : no_index,
                                                aux_ ? s : no_index, 0);
            !e)
          return stop_on(*c, e.error(), "fill: ");
    }
  return std::nullopt;
}

maybe_stop driver::open(const room_plan& r) {
  if (aux_)
    for (auto& c : prefills_[r.prefill].ranks)
      std::memcpy(c->item(pool_kind::aux, 0, r.src), &r.id, sizeof r.id);
  const auto dst = dst_pages(r.dst);
  const uint32_t slot = state_ ? r.dst : no_index, row = aux_ ? r.dst : no_index;
  for (auto& c : decode_.ranks) {
    if (verify_)
      if (auto e = client::clear_room(*c, dst, slot, row); !e)
        return stop_on(*c, e.error(), "clear: ");
    if (auto e = c->prepare({r.id, prefills_[r.prefill].controls, dst, slot, row}); !e)
      return stop_on(*c, e.error(), "prepare: ");
    if (auto e = c->subscribe(r.id); !e) return stop_on(*c, e.error(), "subscribe: ");
  }
  return std::nullopt;
}

maybe_stop driver::send(const room_plan& r) {
  const auto src = src_pages(r.src);
  for (auto& c : prefills_[r.prefill].ranks)
    if (auto e = c->send({r.id, src, true, state_ ? r.src : no_index, aux_ ? r.src : no_index}); !e)
      return stop_on(*c, e.error(), "send: ");
  return std::nullopt;
}

std::string driver::check(const room_plan& r) const {
  const auto dst = dst_pages(r.dst);
  for (size_t k = 0; k < decode_.ranks.size(); ++k) {
    auto e = client::verify_room(*decode_.ranks[k], key_of(r.src), r.id, dst,
                                 state_ ? r.dst : no_index, aux_ ? r.dst : no_index);
    if (!e) return fmt::format("room {} on decode rank {}: {}", r.id, k, e.message);
  }
  return "";
}

result<std::pair<uint64_t, uint64_t>> driver::room_bytes(uint64_t piece_bytes) const {
  const auto& p = prefills_.front();
  const auto src = src_pages(0), dst = dst_pages(0);
  std::vector<planned_write> one;
  for (const auto& dc : decode_.ranks) {
    const auto ds = schema_of(*client::daemon_config(*dc));
    auto chosen = select_prefill_peers(ds, p.schemas);
    if (!chosen) return error{chosen.code, "geometry: " + chosen.message};
    for (size_t i : chosen.value) {
      auto link = make_link_plan(p.schemas[i], ds);
      if (!link) return error{link.code, "geometry: " + link.message};
      const auto sl = make_layout(p.schemas[i].pools), dl = make_layout(ds.pools);
      std::vector<planned_copy> pack;
      staging_use su{uint64_t{0}, uint64_t{0}, pages_};
      plan_kv_chunk(link.value, sl, dl, coalesce_runs(src, dst), su, pack, one);
      if (state_) plan_state_link(link.value, sl, dl, 0, 0, one);
      if (aux_) plan_aux_link(link.value, sl, dl, 0, 0, one);
    }
  }
  split_pieces(one, piece_bytes);
  uint64_t bytes = 0;
  for (const auto& w : one) bytes += w.length;
  return std::pair<uint64_t, uint64_t>{bytes, one.size()};
}

maybe_stop settle(std::vector<instance>& prefills, uint64_t first, uint64_t end,
                  std::chrono::seconds timeout) {
  std::vector<uint64_t> rooms;
  for (uint64_t id = first; id < end; ++id) rooms.push_back(id);
  for (auto& p : prefills)
    for (auto& r : p.ranks)
      if (auto e = bench::settle_rooms(*r, rooms, timeout); !e && !r->lost())
        return stop_on(*r, e.error(), "waiting for the prefill's rooms to end: ");
  return std::nullopt;
}

double quantile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = static_cast<size_t>(p * double(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

namespace {

double seconds(clock_type::duration d) { return std::chrono::duration<double>(d).count(); }

}  // namespace

maybe_stop run_wave(driver& d, const std::vector<room_plan>& rooms,
                    const std::function<void()>& on_ready, std::chrono::seconds timeout,
                    wave_result& out) {
  const size_t n = rooms.size(), ranks = d.decode_ranks();
  std::unordered_map<uint64_t, uint32_t> index;
  index.reserve(n);
  for (uint32_t i = 0; i < n; ++i) index.emplace(rooms[i].id, i);
  // Per room and decode rank: 0 nothing yet, 1 WaitingForInput (or beyond), 2 ended.
  std::vector<uint8_t> seen(n * ranks, 0);
  std::vector<bool> failed(n, false);
  std::vector<clock_type::time_point> sent(n), ended(n);
  auto note_failure = [&](uint32_t i, const proto::event& e) {
    if (!failed[i] && out.first_failure.empty())
      out.first_failure = fmt::format("room {}: {}", e.room, e.reason);
    failed[i] = true;
  };
  // Reads decode rank k's events until `left` of its rooms reached `level`.
  auto await = [&](size_t k, uint8_t level, size_t left) -> maybe_stop {
    while (left > 0) {
      auto e = d.decode_rank(k).next_event(timeout);
      if (!e)
        return stop_on(d.decode_rank(k), e.error(),
                       level == 1 ? "waiting for WaitingForInput: " : "waiting for commits: ");
      auto it = index.find(e.value.room);
      if (it == index.end()) continue;
      const uint32_t i = it->second;
      uint8_t& s = seen[i * ranks + k];
      const uint8_t now = is_terminal(e.value.status)                        ? 2
                          : e.value.status >= room_status::waiting_for_input ? 1
                                                                             : 0;
      if (now == 2 && s < 2) {
        ended[i] = std::max(ended[i], clock_type::now());
        if (e.value.status != room_status::success) note_failure(i, e.value);
      }
      if (now > s) {
        if (s < level && now >= level) --left;
        s = now;
      }
    }
    return std::nullopt;
  };
  const auto t0 = clock_type::now();
  for (const auto& r : rooms)
    if (auto s = d.open(r)) return s;
  const auto t1 = clock_type::now();
  for (size_t k = 0; k < ranks; ++k)
    if (auto s = await(k, 1, n)) return s;
  const auto t2 = clock_type::now();
  out.open_s = seconds(t1 - t0);
  out.ready_s = seconds(t2 - t1);
  if (on_ready) on_ready();
  const auto start = clock_type::now();
  for (uint32_t i = 0; i < n; ++i) {
    sent[i] = clock_type::now();
    // A room that failed while waiting is not sent: its send would be refused.
    if (failed[i]) continue;
    if (auto s = d.send(rooms[i])) return s;
  }
  out.send_s = seconds(clock_type::now() - start);
  for (size_t k = 0; k < ranks; ++k) {
    size_t left = 0;
    for (uint32_t i = 0; i < n; ++i) left += seen[i * ranks + k] < 2;
    if (auto s = await(k, 2, left)) return s;
  }
  clock_type::time_point last = start;
  for (uint32_t i = 0; i < n; ++i) {
    last = std::max(last, ended[i]);
    if (failed[i]) {
      ++out.failed;
      continue;
    }
    ++out.committed;
    out.latency_ms.push_back(seconds(ended[i] - sent[i]) * 1e3);
  }
  out.transfer_s = seconds(last - start);
  if (d.verifying())
    for (uint32_t i = 0; i < n; ++i) {
      if (failed[i]) continue;
      auto err = d.check(rooms[i]);
      if (err.empty())
        ++out.verified;
      else if (out.first_failure.empty())
        out.first_failure = "verify: " + err;
    }
  return std::nullopt;
}

maybe_stop run_pipeline(driver& d, const pipeline_plan& plan,
                        const std::function<room_plan(uint64_t k, uint32_t slot)>& next,
                        const std::function<void(double, size_t)>& sample,
                        std::chrono::seconds timeout, pipeline_result& out) {
  struct live {
    room_plan plan;
    uint32_t slot = 0;
    uint32_t pending = 0;  // decode ranks without its terminal event yet
    std::vector<bool> done_on;
    bool sent = false, ok = true;
    clock_type::time_point started, finished;
  };
  const size_t ranks = d.decode_ranks();
  std::unordered_map<uint64_t, live> rooms;  // open rooms, by id
  std::deque<uint64_t> unsent;               // open and not sent yet, oldest first
  std::deque<uint64_t> sent;                 // sent, oldest first (ended ones are skipped)
  size_t flowing = 0;                        // sent and not ended
  std::vector<uint32_t> free_slots;
  for (uint32_t s = plan.slots; s-- > 0;) free_slots.push_back(s);
  const auto begin = clock_type::now();
  const auto every = std::chrono::duration_cast<clock_type::duration>(
      std::chrono::duration<double>(plan.sample_s));
  auto next_sample = begin + every;
  std::optional<clock_type::time_point> first_send;
  clock_type::time_point last_end = begin;
  bool opening = true;
  for (;;) {
    if (opening &&
        (out.started >= plan.max_rooms ||
         (plan.duration_s > 0 && seconds(clock_type::now() - begin) >= plan.duration_s))) {
      opening = false;
      if (sample) sample(seconds(clock_type::now() - begin), rooms.size());
    }
    while (opening && !free_slots.empty() && out.started < plan.max_rooms) {
      live l;
      l.slot = free_slots.back();
      free_slots.pop_back();
      l.plan = next(out.started++, l.slot);
      l.pending = static_cast<uint32_t>(ranks);
      l.done_on.assign(ranks, false);
      const auto call = clock_type::now();
      if (auto s = d.open(l.plan)) return s;
      out.calls_s += seconds(clock_type::now() - call);
      unsent.push_back(l.plan.id);
      rooms.emplace(l.plan.id, std::move(l));
    }
    while (!unsent.empty() && (plan.send_window == 0 || flowing < plan.send_window)) {
      auto it = rooms.find(unsent.front());
      unsent.pop_front();
      if (it == rooms.end()) continue;  // it ended before it was sent (it failed)
      live& l = it->second;
      const auto call = clock_type::now();
      l.started = call;
      if (!first_send) first_send = call;
      if (auto s = d.send(l.plan)) return s;
      out.calls_s += seconds(clock_type::now() - call);
      l.sent = true;
      ++flowing;
      sent.push_back(l.plan.id);
    }
    if (sample && plan.sample_s > 0 && opening && clock_type::now() >= next_sample) {
      sample(seconds(clock_type::now() - begin), rooms.size());
      next_sample += every;
    }
    if (rooms.empty()) {
      if (!opening) break;
      continue;
    }
    // Events come from the decode rank the oldest sent room still waits for, so none is waited
    // for in vain (a room not sent yet may wait long; one that fails unsent is seen on the way).
    while (!sent.empty() && !rooms.count(sent.front())) sent.pop_front();
    while (!unsent.empty() && !rooms.count(unsent.front())) unsent.pop_front();
    const live& oldest = rooms.at(sent.empty() ? unsent.front() : sent.front());
    const size_t k = static_cast<size_t>(
        std::find(oldest.done_on.begin(), oldest.done_on.end(), false) - oldest.done_on.begin());
    auto e = d.decode_rank(k).next_event(timeout);
    if (!e) return stop_on(d.decode_rank(k), e.error(), "waiting for commits: ");
    if (!is_terminal(e.value.status)) continue;
    auto it = rooms.find(e.value.room);
    if (it == rooms.end() || it->second.done_on[k]) continue;
    live& l = it->second;
    l.done_on[k] = true;
    l.finished = clock_type::now();
    if (e.value.status != room_status::success) {
      l.ok = false;
      if (out.first_failure.empty())
        out.first_failure = fmt::format("room {}: {}", e.value.room, e.value.reason);
    }
    if (--l.pending > 0) continue;
    if (l.ok) {
      if (d.verifying()) {
        auto err = d.check(l.plan);
        if (err.empty())
          ++out.verified;
        else if (out.first_failure.empty())
          out.first_failure = "verify: " + err;
      }
      ++out.committed;
      out.latency_ms.push_back(seconds(l.finished - l.started) * 1e3);
    } else {
      ++out.failed;
    }
    if (l.sent) --flowing;
    last_end = std::max(last_end, l.finished);
    free_slots.push_back(l.slot);
    rooms.erase(it);
  }
  out.transfer_s = first_send ? seconds(last_end - *first_send) : 0;
  return std::nullopt;
}

}  // namespace ferry::bench::scale
