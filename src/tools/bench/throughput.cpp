// ferry-bench's closed-loop throughput: waves of --concurrency rooms (or --pipeline), each run
// followed by the raw-fabric baseline of the same writes, then the medians, commit latency, CPU
// per room and, with --poll-many, the batch poll's round trip.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <map>

#include "tools/bench/baseline.hpp"
#include "tools/bench/bench.hpp"

namespace ferry::bench {
namespace {

/// What a run accumulates across repeats.
struct tally {
  std::vector<double> latencies_ms, ferry_runs, raw_runs, raw_paced_runs;
  uint32_t done = 0, failed = 0;
  clock_type::time_point last_progress = clock_type::now();
};

/// --pipeline: every slot starts its next room once its room has committed on every decode
/// rank (and, with --verify, was verified: inside the timed window then). Events are read
/// from the decode where the oldest live room still waits, so none is waited for in vain.
std::optional<int> run_pipeline(context& ctx, tally& t, double& transfer_s, uint32_t& run_done) {
  const options& o = ctx.o;
  struct live {
    uint32_t slot;
    std::vector<bool> done_on;  // per decode rank
    uint32_t pending;
    bool ok = true;
    clock_type::time_point started, finished;
  };
  std::map<uint64_t, live> rooms;  // by id: the first is the oldest
  std::vector<uint32_t> free_slots;
  for (uint32_t c = o.concurrency; c-- > 0;) free_slots.push_back(c);
  uint32_t started = 0, ended = 0;
  std::optional<clock_type::time_point> first_send;
  clock_type::time_point last_end{};
  while (ended < o.requests) {
    while (!free_slots.empty() && started < o.requests) {
      const uint32_t c = free_slots.back();
      free_slots.pop_back();
      const uint64_t id = ctx.next_room++;
      ++started;
      if (auto rc = ctx.open_room(id, ctx.plans[c].dst, c, o.verify)) return rc;
      live& l = rooms[id];
      l.slot = c;
      l.done_on.assign(ctx.decodes.size(), false);
      l.pending = static_cast<uint32_t>(ctx.decodes.size());
      l.started = clock_type::now();
      if (!first_send) first_send = l.started;
      for (uint32_t k = 0, pos = 0; k < ctx.chunks.size(); pos += ctx.chunks[k], ++k) {
        const bool last = k + 1 == ctx.chunks.size();
        std::vector<uint32_t> pg(ctx.plans[c].src.begin() + pos,
                                 ctx.plans[c].src.begin() + pos + ctx.chunks[k]);
        for (auto& pc : ctx.prefills) {
          auto r = pc->send({id, pg, last, last && ctx.has_state ? c : no_index,
                             last && ctx.has_aux ? c : no_index});
          if (!r) return ctx.fail_on(*pc, r.error(), "send: ");
        }
      }
    }
    const live& oldest = rooms.begin()->second;
    const size_t rank = static_cast<size_t>(
        std::find(oldest.done_on.begin(), oldest.done_on.end(), false) - oldest.done_on.begin());
    auto& dc = *ctx.decodes[rank];
    auto e = dc.next_event(std::chrono::seconds(120));
    if (!e) return ctx.fail_on(dc, e.error(), "waiting for commits: ");
    if (!is_terminal(e.value.status)) continue;
    auto it = rooms.find(e.value.room);
    if (it == rooms.end() || it->second.done_on[rank]) continue;
    live& l = it->second;
    l.done_on[rank] = true;
    l.finished = clock_type::now();
    if (e.value.status != room_status::success) {
      l.ok = false;
      if (ctx.first_failure.empty())
        ctx.first_failure = fmt::format("room {}: {}", e.value.room, e.value.reason);
    }
    if (--l.pending > 0) continue;
    if (l.ok && o.verify) ctx.verify_slot(l.slot, it->first);
    if (l.ok) {
      ++t.done;
      ++run_done;
      t.latencies_ms.push_back(
          std::chrono::duration<double, std::milli>(l.finished - l.started).count());
    } else {
      ++t.failed;
    }
    last_end = std::max(last_end, l.finished);
    free_slots.push_back(l.slot);
    rooms.erase(it);
    ++ended;
    if (clock_type::now() - t.last_progress > std::chrono::seconds(2)) {
      std::cerr << fmt::format("  ... {}/{} requests committed\n", run_done, o.requests);
      t.last_progress = clock_type::now();
    }
  }
  transfer_s = std::chrono::duration<double>(last_end - *first_send).count();
  return std::nullopt;
}

/// Wave `w` of run `rep`: its rooms prepared, then sent, then waited for; the wave's time
/// (first send to last Success) is added to `transfer_s`. An untimed wave (the warm-up before
/// the first run) counts and verifies nothing.
std::optional<int> run_wave(context& ctx, tally& t, uint32_t rep, uint32_t w, double& transfer_s,
                            uint32_t& run_done, bool timed = true) {
  const options& o = ctx.o;
  const uint32_t n = std::min(o.concurrency, o.requests - w * o.concurrency);
  std::vector<uint64_t> room(n);
  std::vector<clock_type::time_point> started(n);
  for (uint32_t c = 0; c < n; ++c) room[c] = ctx.next_room++;
  if (o.serial_requests) {
    for (uint32_t c = 0; c < n; ++c)
      if (auto rc = ctx.open_room(room[c], ctx.plans[c].dst, c, o.verify)) return rc;
  } else if (auto rc = ctx.open_rooms(room, o.verify)) {
    return rc;
  }
  const auto wave_start = clock_type::now();
  for (uint32_t k = 0, pos = 0; k < ctx.chunks.size(); pos += ctx.chunks[k], ++k) {
    const bool last = k + 1 == ctx.chunks.size();
    std::vector<proto::message> sends;  // the wave's sends of chunk k, pipelined
    for (uint32_t c = 0; c < n; ++c) {
      if (k == 0) started[c] = clock_type::now();
      std::vector<uint32_t> pg(ctx.plans[c].src.begin() + pos,
                               ctx.plans[c].src.begin() + pos + ctx.chunks[k]);
      const proto::send s{room[c], std::move(pg), last, last && ctx.has_state ? c : no_index,
                          last && ctx.has_aux ? c : no_index};
      if (!o.serial_requests) {
        sends.push_back(s);
        continue;
      }
      for (auto& pc : ctx.prefills)
        if (auto r = pc->send(s); !r) return ctx.fail_on(*pc, r.error(), "send: ");
    }
    if (sends.empty()) continue;
    for (auto& pc : ctx.prefills)
      for (const auto& r : pc->pipeline(sends))
        if (!r) return ctx.fail_on(*pc, r.error(), "send: ");
  }
  // A request is done when every decode rank reports a terminal status for it.
  clock_type::time_point wave_end = wave_start;
  std::vector<uint32_t> pending(n, static_cast<uint32_t>(ctx.decodes.size()));
  std::vector<bool> ok(n, true);
  std::vector<clock_type::time_point> finished(n);
  for (auto& dc : ctx.decodes)
    for (uint32_t left = n; left > 0;) {
      auto e = dc->next_event(std::chrono::seconds(120));
      if (!e) return ctx.fail_on(*dc, e.error(), "waiting for commits: ");
      if (!is_terminal(e.value.status)) continue;
      auto it = std::find(room.begin(), room.end(), e.value.room);
      if (it == room.end()) continue;
      const auto c = static_cast<size_t>(it - room.begin());
      --left;
      --pending[c];
      finished[c] = std::max(finished[c], clock_type::now());
      if (e.value.status != room_status::success) {
        ok[c] = false;
        if (ctx.first_failure.empty())
          ctx.first_failure = fmt::format("room {}: {}", e.value.room, e.value.reason);
      }
    }
  if (!timed) {
    if (std::find(ok.begin(), ok.end(), false) != ok.end())
      return ctx.fail("warm-up wave: " + ctx.first_failure);
    return std::nullopt;
  }
  for (uint32_t c = 0; c < n; ++c) {
    wave_end = std::max(wave_end, finished[c]);
    if (ok[c]) {
      ++t.done;
      ++run_done;
      t.latencies_ms.push_back(
          std::chrono::duration<double, std::milli>(finished[c] - started[c]).count());
    } else {
      ++t.failed;
    }
  }
  transfer_s += std::chrono::duration<double>(wave_end - wave_start).count();
  if (o.verify)
    for (uint32_t c = 0; c < n; ++c) ctx.verify_slot(c, room[c]);
  if (clock_type::now() - t.last_progress > std::chrono::seconds(2)) {
    std::cerr << fmt::format("  ... run {}/{}: {}/{} requests committed\n", rep + 1, o.repeat,
                             run_done, o.requests);
    t.last_progress = clock_type::now();
  }
  return std::nullopt;
}

/// One repeat's figures after its Ferry run: GB/s, rooms/s, CPU per room, and the raw baseline
/// of the same writes run right after it.
nlohmann::json finish_run(context& ctx, tally& t, uint32_t rep, double transfer_s,
                          uint32_t run_done, std::optional<double> cpu_prefill,
                          std::optional<double> cpu_decode, double cpu_bench) {
  const options& o = ctx.o;
  const uint32_t waves = (o.requests + o.concurrency - 1) / o.concurrency;
  const double gbs = transfer_s > 0 ? double(ctx.req_bytes) * run_done / transfer_s / 1e9 : 0;
  t.ferry_runs.push_back(gbs);
  // CPU of the whole run (prepares, sends and waits included), per room, on each side.
  auto per_room_ms = [&](std::optional<double> before, std::optional<double> after) {
    return before && after && run_done > 0 ? nlohmann::json((*after - *before) * 1e3 / run_done)
                                           : nlohmann::json(nullptr);
  };
  const nlohmann::json cpu = {{"prefill", per_room_ms(cpu_prefill, cpu_seconds(ctx.prefills))},
                              {"decode", per_room_ms(cpu_decode, cpu_seconds(ctx.decodes))},
                              {"bench", per_room_ms(cpu_bench, own_cpu_seconds())}};
  std::string raw_text = "raw baseline skipped";
  nlohmann::json run = {
      {"ferry_gbps", gbs},
      {"requests", run_done},
      {"transfer_s", transfer_s},
      {"rooms_per_s", transfer_s > 0 ? run_done / transfer_s : 0.0},
      {"raw_gbps", nullptr},
      {"ratio", nullptr},
      {"writes_per_s", transfer_s > 0 ? double(run_done) * ctx.one.size() / transfer_s : 0.0},
      {"cpu_ms_per_room", cpu}};
  if (o.baseline) {
    // The raw run's CPU: its initiator is this process, its target a child it waits for.
    const double raw_self = own_cpu_seconds(), raw_child = children_cpu_seconds();
    auto r =
        run_baseline(ctx.provider, ctx.one, o.concurrency, waves, o.window, false, o.warmup_waves);
    // Per room written, its untimed warm-up waves included (baseline.cpp); the process's setup
    // (buffers, endpoint, registration) is in it too, so this is an upper bound.
    const double rooms = double(o.concurrency) * (waves + o.warmup_waves);
    run["raw_cpu_ms_per_room"] = {{"initiator", (own_cpu_seconds() - raw_self) * 1e3 / rooms},
                                  {"target", (children_cpu_seconds() - raw_child) * 1e3 / rooms}};
    if (!r.error.empty()) {
      raw_text = "raw baseline failed: " + r.error;
      run["raw_error"] = r.error;
    } else {
      t.raw_runs.push_back(r.gbps);
      run["raw_gbps"] = r.gbps;
      run["ratio"] = r.gbps > 0 ? gbs / r.gbps : 0.0;
      raw_text =
          fmt::format("raw {:.2f} GB/s, ratio {:.2f}", r.gbps, r.gbps > 0 ? gbs / r.gbps : 0.0);
    }
    if (o.paced_baseline) {
      auto p = run_baseline(ctx.provider, ctx.one, o.concurrency, waves, o.window, true);
      if (!p.error.empty()) {
        raw_text += "; paced raw failed: " + p.error;
        run["raw_paced_error"] = p.error;
      } else {
        t.raw_paced_runs.push_back(p.gbps);
        run["raw_paced_gbps"] = p.gbps;
        run["ratio_paced"] = p.gbps > 0 ? gbs / p.gbps : 0.0;
        raw_text += fmt::format("; paced raw {:.2f} GB/s, ratio {:.2f}", p.gbps,
                                p.gbps > 0 ? gbs / p.gbps : 0.0);
      }
    }
  }
  ctx.report() << fmt::format(
      "run {}/{}: ferry {:.2f} GB/s ({} requests, {:.3f} s of transfer, {:.0f} rooms/s); {}\n",
      rep + 1, o.repeat, gbs, run_done, transfer_s, transfer_s > 0 ? run_done / transfer_s : 0.0,
      raw_text);
  if (cpu["prefill"].is_number() && cpu["decode"].is_number())
    ctx.report() << fmt::format(
        "  cpu per room: prefill {:.3f} ms, decode {:.3f} ms, bench {:.3f} ms{}\n",
        cpu["prefill"].get<double>(), cpu["decode"].get<double>(), cpu["bench"].get<double>(),
        run.contains("raw_cpu_ms_per_room")
            ? fmt::format("; raw initiator {:.3f} ms, target {:.3f} ms",
                          run["raw_cpu_ms_per_room"]["initiator"].get<double>(),
                          run["raw_cpu_ms_per_room"]["target"].get<double>())
            : "");
  return run;
}

/// The medians over the repeats, in the report and the document.
void summarize(context& ctx, const tally& t) {
  const options& o = ctx.o;
  const double ferry_gbs = percentile(t.ferry_runs, 0.5);
  ctx.report() << fmt::format(
      "ferry: {} requests committed, {} failed, {:.2f} GB moved; median {:.2f} GB/s (min {:.2f}, "
      "max {:.2f})\n",
      t.done, t.failed, double(ctx.req_bytes) * t.done / 1e9, ferry_gbs,
      percentile(t.ferry_runs, 0), percentile(t.ferry_runs, 1));
  ctx.report() << fmt::format(
      "commit latency (first send -> Success on decode): p50 {:.2f} ms, p99 {:.2f} ms\n",
      percentile(t.latencies_ms, 0.5), percentile(t.latencies_ms, 0.99));
  if (!t.raw_runs.empty()) {
    const double raw_gbs = percentile(t.raw_runs, 0.5);
    ctx.report() << fmt::format(
        "raw fabric (same {} writes per request, window {}): median {:.2f} GB/s (min {:.2f}, max "
        "{:.2f})\n",
        ctx.one.size(), o.window, raw_gbs, percentile(t.raw_runs, 0), percentile(t.raw_runs, 1));
    ctx.report() << fmt::format("ratio: ferry / raw = {:.2f} (medians)\n",
                                raw_gbs > 0 ? ferry_gbs / raw_gbs : 0.0);
  }
  if (!t.raw_paced_runs.empty()) {
    const double paced = percentile(t.raw_paced_runs, 0.5);
    ctx.report() << fmt::format(
        "paced raw fabric (one control message per room, {} rooms in flight): median {:.2f} GB/s; "
        "ferry / paced raw = {:.2f}\n",
        o.concurrency, paced, paced > 0 ? ferry_gbs / paced : 0.0);
  }
  std::vector<double> rates, writes, cpu_p, cpu_d;
  for (const auto& r : ctx.out["runs"]) {
    rates.push_back(r["rooms_per_s"].get<double>());
    writes.push_back(r["writes_per_s"].get<double>());
    if (r["cpu_ms_per_room"]["prefill"].is_number())
      cpu_p.push_back(r["cpu_ms_per_room"]["prefill"].get<double>());
    if (r["cpu_ms_per_room"]["decode"].is_number())
      cpu_d.push_back(r["cpu_ms_per_room"]["decode"].get<double>());
  }
  auto median_or_null = [](std::vector<double>& v) {
    return v.empty() ? nlohmann::json(nullptr) : nlohmann::json(percentile(v, 0.5));
  };
  ctx.out["ferry"] = {{"committed", t.done},
                      {"failed", t.failed},
                      {"bytes", ctx.req_bytes * t.done},
                      {"gbps_median", ferry_gbs},
                      {"gbps_min", percentile(t.ferry_runs, 0)},
                      {"gbps_max", percentile(t.ferry_runs, 1)},
                      {"rooms_per_s_median", percentile(rates, 0.5)},
                      {"writes_per_s_median", percentile(writes, 0.5)},
                      {"cpu_ms_per_room_median",
                       {{"prefill", median_or_null(cpu_p)}, {"decode", median_or_null(cpu_d)}}},
                      {"mode", o.pipeline ? "pipeline" : "waves"},
                      {"requests", o.pipeline || o.serial_requests ? "serial" : "pipelined"}};
  ctx.out["commit_latency_ms"] = {{"from", "first send"},
                                  {"to", "Success on decode"},
                                  {"p50", percentile(t.latencies_ms, 0.5)},
                                  {"p99", percentile(t.latencies_ms, 0.99)},
                                  {"samples", t.latencies_ms.size()}};
  ctx.out["raw"] = nullptr;
  ctx.out["ratio"] = nullptr;
  if (!t.raw_runs.empty()) {
    const double raw_gbs = percentile(t.raw_runs, 0.5);
    ctx.out["raw"] = {{"gbps_median", raw_gbs},
                      {"gbps_min", percentile(t.raw_runs, 0)},
                      {"gbps_max", percentile(t.raw_runs, 1)},
                      {"window", o.window}};
    ctx.out["ratio"] = raw_gbs > 0 ? ferry_gbs / raw_gbs : 0.0;
  }
  ctx.out["raw_paced"] = nullptr;
  if (!t.raw_paced_runs.empty()) {
    const double paced = percentile(t.raw_paced_runs, 0.5);
    ctx.out["raw_paced"] = {{"gbps_median", paced},
                            {"gbps_min", percentile(t.raw_paced_runs, 0)},
                            {"gbps_max", percentile(t.raw_paced_runs, 1)},
                            {"rooms_in_flight", o.concurrency},
                            {"ratio", paced > 0 ? ferry_gbs / paced : 0.0}};
  }
  ctx.out["verified"] = o.verify ? nlohmann::json(ctx.verified) : nlohmann::json(nullptr);
  ctx.out["first_failure"] = ctx.first_failure;
  if (o.verify)
    ctx.report() << fmt::format("verified: {}/{} requests, every destination byte\n", ctx.verified,
                                uint64_t{o.requests} * o.repeat);
  if (!ctx.first_failure.empty()) ctx.report() << "first failure: " << ctx.first_failure << "\n";
}

/// --poll-many: one engine step's batch poll: the run's rooms first, then ids never used
/// (answered unknown_room on a decode). 50 batches, then the same rooms one poll each, once.
std::optional<int> time_poll_many(context& ctx) {
  auto& d = *ctx.decodes[0];
  std::vector<uint64_t> rooms;
  for (uint32_t i = 0; i < ctx.o.poll_many; ++i) rooms.push_back(ctx.o.room_base + i);
  std::vector<double> batch_ms;
  for (int i = 0; i < 50; ++i) {
    const auto t0 = clock_type::now();
    auto r = d.poll_many(rooms);
    batch_ms.push_back(ms_between(t0, clock_type::now()));
    if (!r) return ctx.fail_on(d, r.error(), "poll_many: ");
    if (r.value.size() != rooms.size())
      return ctx.fail(
          fmt::format("poll_many: {} answers for {} rooms", r.value.size(), rooms.size()));
  }
  const auto t0 = clock_type::now();
  for (auto room : rooms) (void)d.poll(room);
  const double singles_ms = ms_between(t0, clock_type::now());
  ctx.report() << fmt::format(
      "poll_many of {} rooms (one round trip): p50 {:.3f} ms, p99 {:.3f} ms over 50; the same "
      "{} rooms polled one by one: {:.2f} ms\n",
      rooms.size(), percentile(batch_ms, 0.5), percentile(batch_ms, 0.99), rooms.size(),
      singles_ms);
  ctx.out["poll_many"] = {{"rooms", rooms.size()},
                          {"p50_ms", percentile(batch_ms, 0.5)},
                          {"p99_ms", percentile(batch_ms, 0.99)},
                          {"single_polls_ms", singles_ms}};
  return std::nullopt;
}

}  // namespace

int run_throughput(context& ctx) {
  const options& o = ctx.o;
  const uint32_t waves = (o.requests + o.concurrency - 1) / o.concurrency;
  tally t;
  ctx.out["runs"] = nlohmann::json::array();
  // One untimed wave first, as the raw reference does (run_baseline): this VM's first touch of
  // a page costs ~30 x a later one (performance §24), and an engine's pools are touched over
  // and over, so a timed first pass would measure the machine, not the transfer.
  uint32_t warmup_rooms = 0;
  for (uint32_t w = 0; w < o.warmup_waves; ++w) {
    tally warm;
    double warm_s = 0;
    uint32_t warm_done = 0;
    if (auto rc = run_wave(ctx, warm, 0, 0, warm_s, warm_done, false)) return *rc;
    warmup_rooms += std::min(o.concurrency, o.requests);
  }
  ctx.out["warmup_rooms"] = warmup_rooms;
  // Ferry runs and raw baselines interleaved, so both see the same machine state.
  for (uint32_t rep = 0; rep < o.repeat; ++rep) {
    double transfer_s = 0;
    uint32_t run_done = 0;
    const auto cpu_prefill = cpu_seconds(ctx.prefills), cpu_decode = cpu_seconds(ctx.decodes);
    const double cpu_bench = own_cpu_seconds();
    if (o.pipeline)
      if (auto rc = run_pipeline(ctx, t, transfer_s, run_done)) return *rc;
    for (uint32_t w = 0; w < (o.pipeline ? 0 : waves); ++w)
      if (auto rc = run_wave(ctx, t, rep, w, transfer_s, run_done)) return *rc;
    ctx.out["runs"].push_back(
        finish_run(ctx, t, rep, transfer_s, run_done, cpu_prefill, cpu_decode, cpu_bench));
  }
  summarize(ctx, t);
  if (o.poll_many > 0)
    if (auto rc = time_poll_many(ctx)) return *rc;
  const uint64_t total_requests = uint64_t{o.requests} * o.repeat;
  const bool ok = t.failed == 0 && (!o.verify || ctx.verified == total_requests);
  ctx.out["ok"] = ok;
  if (auto rc = ctx.emit_json()) return *rc;
  return ok ? exit_code::ok : exit_code::failed;
}

}  // namespace ferry::bench
