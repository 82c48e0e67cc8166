// ferry-bench --background-rooms: fair sharing. The latency of one room at a time, first on the
// idle pair, then while large rooms flow to the same decode (started together right before the
// first timed room, after one untimed pass of them); the timed rooms use slot 0, the large ones
// the pages, slots and rows after the timed rooms' regions.
#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <variant>

#include "tools/bench/bench.hpp"

namespace ferry::bench {

int run_fairness(context& ctx) {
  const options& o = ctx.o;
  const uint32_t big_pages = (o.background_tokens + ctx.page_tokens - 1) / ctx.page_tokens;
  const uint64_t first_big = uint64_t{ctx.region} * o.concurrency;
  if (first_big + uint64_t{big_pages} * o.background_rooms > ctx.pool_pages ||
      o.concurrency + o.background_rooms > std::min(ctx.slots, ctx.rows))
    return ctx.fail(fmt::format("{} background rooms of {} pages do not fit beside the timed rooms "
                                "(kv pages {}, state slots {}, aux rows {})",
                                o.background_rooms, big_pages, ctx.pool_pages, ctx.slots, ctx.rows),
                    exit_code::usage);
  auto one_room = [&](uint64_t id, const std::vector<uint32_t>& src,
                      const std::vector<uint32_t>& dst, uint32_t slot) -> std::optional<int> {
    if (auto rc = ctx.open_room(id, dst, slot, false)) return rc;
    return ctx.send_room(id, src, slot);
  };
  std::set<uint64_t> background_left;  // per decode rank's count below: rooms not yet ended
  std::map<uint64_t, uint32_t> ends_left;
  // Waits for `room` on every decode rank; terminal events of background rooms on the way
  // are counted. Returns the latency in ms, or an exit code.
  auto wait_room = [&](uint64_t room, clock_type::time_point t0) -> std::variant<double, int> {
    for (size_t rank = 0; rank < ctx.decodes.size(); ++rank)
      for (bool mine = false; !mine;) {
        auto e = ctx.decodes[rank]->next_event(std::chrono::seconds(120));
        if (!e) return ctx.fail_on(*ctx.decodes[rank], e.error(), "waiting for commits: ");
        if (!is_terminal(e.value.status)) continue;
        if (e.value.status != room_status::success)
          return ctx.fail(fmt::format("room {}: {}", e.value.room, e.value.reason));
        if (e.value.room == room) {
          mine = true;
        } else if (auto it = ends_left.find(e.value.room); it != ends_left.end()) {
          if (--it->second == 0) {
            background_left.erase(e.value.room);
            ends_left.erase(it);
          }
        }
      }
    return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  };
  // Starts the background rooms (their pages, slots and rows after the timed rooms').
  auto start_background = [&]() -> std::optional<int> {
    for (uint32_t k = 0; k < o.background_rooms; ++k) {
      std::vector<uint32_t> pages(big_pages);
      for (uint32_t i = 0; i < big_pages; ++i)
        pages[i] = static_cast<uint32_t>(first_big + uint64_t{k} * big_pages + i);
      const uint64_t id = ctx.next_room++;
      background_left.insert(id);
      ends_left[id] = static_cast<uint32_t>(ctx.decodes.size());
      if (auto rc = one_room(id, pages, pages, o.concurrency + k)) return rc;
    }
    return std::nullopt;
  };
  // Waits until every background room ended on every decode rank.
  auto finish_background = [&]() -> std::optional<int> {
    for (size_t rank = 0; rank < ctx.decodes.size() && !background_left.empty(); ++rank)
      for (int guard = 0; guard < 1000000 && !background_left.empty(); ++guard) {
        auto e = ctx.decodes[rank]->next_event(std::chrono::seconds(120));
        if (!e) return ctx.fail_on(*ctx.decodes[rank], e.error(), "waiting for background rooms: ");
        if (!is_terminal(e.value.status)) continue;
        if (e.value.status != room_status::success)
          return ctx.fail(fmt::format("room {}: {}", e.value.room, e.value.reason));
        if (auto it = ends_left.find(e.value.room); it != ends_left.end() && --it->second == 0) {
          background_left.erase(e.value.room);
          ends_left.erase(it);
        }
      }
    return std::nullopt;
  };
  // One untimed pass of the background rooms first: an engine's pools are in steady use, and the
  // first pass over fresh memory measures the machine (first touches cost up to 40 x a later
  // access on some VMs, docs/performance.md §24), not the sharing.
  if (auto rc = start_background()) return *rc;
  if (auto rc = finish_background()) return *rc;
  std::vector<double> idle_ms, loaded_ms;
  for (uint32_t i = 0; i < o.requests; ++i) {
    const auto t0 = clock_type::now();
    if (auto rc = one_room(ctx.next_room++, ctx.plans[0].src, ctx.plans[0].dst, 0)) return *rc;
    auto r = wait_room(ctx.next_room - 1, t0);
    if (auto* rc = std::get_if<int>(&r)) return *rc;
    idle_ms.push_back(std::get<double>(r));
  }
  if (auto rc = start_background()) return *rc;
  const auto load_start = clock_type::now();
  for (uint32_t i = 0; i < o.requests && !background_left.empty(); ++i) {
    const auto t0 = clock_type::now();
    if (auto rc = one_room(ctx.next_room++, ctx.plans[0].src, ctx.plans[0].dst, 0)) return *rc;
    auto r = wait_room(ctx.next_room - 1, t0);
    if (auto* rc = std::get_if<int>(&r)) return *rc;
    loaded_ms.push_back(std::get<double>(r));
  }
  // The rest of the background rooms, then their time.
  if (auto rc = finish_background()) return *rc;
  const double load_s = std::chrono::duration<double>(clock_type::now() - load_start).count();
  const double idle_p50 = percentile(idle_ms, 0.5);
  const double loaded_p50 = loaded_ms.empty() ? 0 : percentile(loaded_ms, 0.5);
  ctx.report() << fmt::format(
      "fairness: {} rooms of {} tokens one at a time: idle p50 {:.2f} ms p99 {:.2f} ms; while "
      "{} rooms of {} tokens flow ({:.3f} s, {:.2f} GB/s of them): {} rooms, p50 {:.2f} ms "
      "p99 {:.2f} ms, max {:.2f} ms; p50 loaded / idle = {:.2f}\n",
      idle_ms.size(), o.prompt_tokens, idle_p50, percentile(idle_ms, 0.99), o.background_rooms,
      o.background_tokens, load_s,
      double(big_pages) * o.background_rooms * ctx.kv_bytes / ctx.pages_per_req / load_s / 1e9,
      loaded_ms.size(), loaded_p50, loaded_ms.empty() ? 0 : percentile(loaded_ms, 0.99),
      loaded_ms.empty() ? 0 : percentile(loaded_ms, 1), idle_p50 > 0 ? loaded_p50 / idle_p50 : 0);
  ctx.out["fairness"] = {
      {"background_rooms", o.background_rooms},
      {"background_tokens", o.background_tokens},
      {"background_s", load_s},
      {"idle_ms",
       {{"p50", idle_p50}, {"p99", percentile(idle_ms, 0.99)}, {"samples", idle_ms.size()}}},
      {"loaded_ms",
       {{"p50", loaded_p50},
        {"p99", loaded_ms.empty() ? 0 : percentile(loaded_ms, 0.99)},
        {"max", loaded_ms.empty() ? 0 : percentile(loaded_ms, 1)},
        {"samples", loaded_ms.size()}}},
      {"ratio_p50", idle_p50 > 0 ? loaded_p50 / idle_p50 : 0}};
  if (loaded_ms.empty())  // (its own one-document answer under --json)
    return ctx.fail("the background rooms ended before a timed room could run beside them");
  ctx.out["ok"] = true;
  if (auto rc = ctx.emit_json()) return *rc;
  return exit_code::ok;
}

}  // namespace ferry::bench
