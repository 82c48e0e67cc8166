// What ferry-bench's modes share (bench.hpp): reporting, rooms, verification, planning, CPU.
#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "tools/bench/bench.hpp"
#include "tools/workload/daemon_config.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::bench {
namespace {

/// CPU seconds (user + system, every thread) the ferryd at the other end of a client's socket
/// has used so far, read from /proc through its pid (SO_PEERCRED); nullopt when it cannot be
/// read (a daemon in another pid namespace, or /proc closed to this user).
std::optional<double> daemon_cpu_seconds(const client::client& c) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(c.native_handle(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.pid <= 0)
    return std::nullopt;
  std::ifstream f(fmt::format("/proc/{}/stat", cred.pid));
  std::string line;
  if (!std::getline(f, line)) return std::nullopt;
  // Fields after the command (which may hold spaces) end at the last ')': utime and stime are
  // the 14th and 15th fields of the line, the 12th and 13th after it.
  const auto close = line.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double ticks = 0;
  for (int i = 1; i <= 13 && rest >> field; ++i)
    if (i >= 12) ticks += std::stod(field);
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double rusage_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}

}  // namespace

std::optional<double> cpu_seconds(const std::vector<std::unique_ptr<client::client>>& clients) {
  double sum = 0;
  for (const auto& c : clients) {
    auto s = daemon_cpu_seconds(*c);
    if (!s) return std::nullopt;
    sum += *s;
  }
  return sum;
}

result<none> settle_rooms(client::client& c, const std::vector<uint64_t>& rooms,
                          std::chrono::milliseconds timeout) {
  constexpr size_t batch = 1024;
  for (size_t at = 0; at < rooms.size(); at += batch) {
    const std::vector<uint64_t> part(
        rooms.begin() + static_cast<ptrdiff_t>(at),
        rooms.begin() + static_cast<ptrdiff_t>(std::min(rooms.size(), at + batch)));
    auto polled = c.poll_many(part);
    if (!polled) return polled.error();
    for (const auto& p : polled.value) {
      if (is_terminal(p.status)) continue;  // ended, or unknown (answered Failed)
      if (auto s = c.subscribe(p.room); !s) {
        if (s.code == errc::unknown_room || s.code == errc::room_finished) continue;
        return s;
      }
      if (auto e = c.wait_terminal(p.room, timeout); !e) return e.error();
    }
  }
  return none{};
}

double own_cpu_seconds() { return rusage_seconds(RUSAGE_SELF); }
double children_cpu_seconds() { return rusage_seconds(RUSAGE_CHILDREN); }

std::vector<uint32_t> make_pages(uint32_t region_first, uint32_t region_len, uint32_t pages,
                                 double f, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<uint32_t> out;
  out.reserve(pages);
  uint32_t next = region_first;
  const uint32_t slack = region_len - pages;
  uint32_t skipped = 0;
  for (uint32_t i = 0; i < pages; ++i) {
    if (i > 0 && f > 0 && u(rng) < f && skipped < slack) {
      uint32_t gap = 1 + static_cast<uint32_t>(rng() % 3);
      gap = std::min(gap, slack - skipped);
      next += gap;
      skipped += gap;
    }
    out.push_back(next++);
  }
  return out;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t i = static_cast<size_t>(p * (v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

nlohmann::json summary(const std::vector<double>& v) {
  if (v.empty()) return {{"p50", nullptr}, {"p99", nullptr}, {"max", nullptr}, {"samples", 0}};
  return {{"p50", percentile(v, 0.5)},
          {"p99", percentile(v, 0.99)},
          {"max", percentile(v, 1)},
          {"samples", v.size()}};
}

double ms_between(clock_type::time_point a, clock_type::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int context::fail(const std::string& msg, int rc) {
  std::cerr << "ferry-bench: " << msg << "\n";
  if (o.json == "-")
    std::cout << nlohmann::json{{"ok", false}, {"error", msg}, {"exit_code", rc}}.dump(1) << "\n";
  return rc;
}

int context::fail_on(const client::client& c, const ferry::error& e, const std::string& what) {
  return fail(what + e.message, exit_code::for_error(e.code, c.lost()));
}

std::optional<int> context::emit_json() {
  reported = true;
  if (o.json == "-") {
    std::cout << out.dump(1) << "\n";
  } else if (!o.json.empty()) {
    std::ofstream f(o.json);
    f << out.dump(1) << "\n";
    if (!f.flush()) return fail("cannot write --json file " + o.json);
  }
  return std::nullopt;
}

uint32_t context::state_of(uint32_t c) const { return has_state ? c : no_index; }
uint32_t context::row_of(uint32_t c) const { return has_aux ? c : no_index; }

std::optional<int> context::open_room(uint64_t id, const std::vector<uint32_t>& dst, uint32_t slot,
                                      bool clear) {
  if (has_aux)
    for (auto& pc : prefills) std::memcpy(pc->item(pool_kind::aux, 0, slot), &id, 8);
  for (auto& dc : decodes) {
    if (clear)
      if (auto e = client::clear_room(*dc, dst, state_of(slot), row_of(slot)); !e)
        return fail_on(*dc, e.error(), "clear: ");
    if (auto r = dc->prepare({id, prefill_controls, dst, state_of(slot), row_of(slot)}); !r)
      return fail_on(*dc, r.error(), "prepare: ");
    if (auto sub = dc->subscribe(id); !sub) return fail_on(*dc, sub.error(), "subscribe: ");
  }
  return std::nullopt;
}

std::optional<int> context::open_rooms(const std::vector<uint64_t>& ids, bool clear) {
  for (uint32_t c = 0; c < ids.size(); ++c)
    if (has_aux)
      for (auto& pc : prefills) std::memcpy(pc->item(pool_kind::aux, 0, c), &ids[c], 8);
  for (auto& dc : decodes) {
    std::vector<proto::message> batch;
    batch.reserve(2 * ids.size());
    for (uint32_t c = 0; c < ids.size(); ++c) {
      if (clear)
        if (auto e = client::clear_room(*dc, plans[c].dst, state_of(c), row_of(c)); !e)
          return fail_on(*dc, e.error(), "clear: ");
      batch.push_back(
          proto::prepare{ids[c], prefill_controls, plans[c].dst, state_of(c), row_of(c)});
      batch.push_back(proto::subscribe{ids[c]});
    }
    const auto answers = dc->pipeline(batch);
    for (size_t i = 0; i < answers.size(); ++i)
      if (!answers[i])
        return fail_on(*dc, answers[i].error(), i % 2 == 0 ? "prepare: " : "subscribe: ");
  }
  return std::nullopt;
}

std::optional<int> context::send_room(uint64_t id, const std::vector<uint32_t>& src,
                                      uint32_t slot) {
  for (auto& pc : prefills) {
    auto r = pc->send({id, src, true, state_of(slot), row_of(slot)});
    if (!r) return fail_on(*pc, r.error(), "send: ");
  }
  return std::nullopt;
}

bool context::verify_room(uint64_t key, uint64_t room, const std::vector<uint32_t>& dst,
                          uint32_t slot) {
  std::string err;
  for (size_t r = 0; r < decodes.size() && err.empty(); ++r) {
    err = client::verify_room(*decodes[r], key, room, dst, state_of(slot), row_of(slot)).message;
    if (!err.empty()) err = fmt::format("decode rank {}: {}", r, err);
  }
  if (err.empty()) {
    ++verified;
    return true;
  }
  if (first_failure.empty()) first_failure = fmt::format("verify room {}: {}", room, err);
  return false;
}

bool context::verify_slot(uint32_t c, uint64_t room) {
  return verify_room(pattern_key(c), room, plans[c].dst, c);
}

result<std::vector<planned_write>> context::plan_room(const std::vector<uint32_t>& src,
                                                      const std::vector<uint32_t>& dst) const {
  // Bytes and writes of one request over every (prefill rank, decode rank) link, from the same
  // planner ferryd uses (with staging for head-sliced KV, as ferryd uses when it has room).
  std::vector<planned_write> writes;
  const auto pages = static_cast<uint32_t>(src.size());
  for (const auto& dc : decodes) {
    const auto ds = schema_of(*client::daemon_config(*dc));
    auto chosen = select_prefill_peers(ds, prefill_schemas);
    if (!chosen) return error{errc::invalid_request, "geometry: " + chosen.message};
    for (size_t i : chosen.value) {
      auto plan = make_link_plan(prefill_schemas[i], ds);
      if (!plan) return error{errc::invalid_request, "geometry: " + plan.message};
      const auto& link = plan.value;
      const auto sl = make_layout(prefill_schemas[i].pools), dl = make_layout(ds.pools);
      std::vector<planned_copy> pack;
      staging_use su{uint64_t{0}, uint64_t{0}, pages};
      plan_kv_chunk(link, sl, dl, coalesce_runs(src, dst), su, pack, writes);
      if (has_state) plan_state_link(link, sl, dl, 0, 0, writes);
      if (has_aux) plan_aux_link(link, sl, dl, 0, 0, writes);
    }
  }
  split_pieces(writes, o.piece_bytes);
  return writes;
}

}  // namespace ferry::bench
