// ferry-bench: drive a request workload through running prefill and decode ferryds (one per
// rank: several --prefill-socket / --decode-socket for TP or PP geometries) and, in the same
// run, measure a raw-fabric reference (plain fi_writedata of the same writes between two
// processes of this benchmark, src/tools/bench/raw_fabric.cpp), then report both and their ratio.
//
// This file: the command line, the connections, the pools and the closed-loop workload; the
// modes are in their own files (bench.hpp lists them).
//
// With --json (no file) the results are one JSON document on stdout, the text report on stderr;
// a run that stops early prints {"ok": false, "error": ...} there instead. Exit codes
// (core/exit_codes.hpp): 0 every request committed (and verified), 1 some did not, 2 usage or
// a workload the daemons cannot hold, 3 a daemon cannot be reached or was lost, 4 timed out.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>

#include "cli/common.hpp"
#include "tools/bench/bench.hpp"
#include "tools/bench/rolling.hpp"
#include "tools/bench/scale.hpp"
#include "tools/workload/daemon_config.hpp"
#include "tools/workload/workload.hpp"

using namespace ferry;
using namespace ferry::bench;

namespace {

/// The options on `app`, read into `o`; returns the --json option (it takes an optional value).
CLI::Option* add_options(CLI::App& app, options& o, bool& no_baseline) {
  app.add_option("--prefill-socket", o.prefill_sockets,
                 "client socket of a prefill ferryd; repeat (or comma-separate) for every "
                 "prefill rank of a TP/PP geometry")
      ->capture_default_str()
      ->delimiter(',');
  app.add_option("--decode-socket", o.decode_sockets,
                 "client socket of a decode ferryd; repeat (or comma-separate) for every decode "
                 "rank")
      ->capture_default_str()
      ->delimiter(',');
  app.add_option("--prompt-tokens", o.prompt_tokens, "tokens per request")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--requests", o.requests,
                 "requests to move (--latency: timed rooms per gap; --open-loop: at most this "
                 "many arrivals)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--concurrency", o.concurrency,
                 "rooms in flight together (at most the state slots / aux rows)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--chunk-tokens", o.chunk_tokens,
                 "chunked prefill: tokens per chunk (0: one chunk)")
      ->capture_default_str();
  app.add_option("--fragmentation", o.fragmentation,
                 "probability that the next page is not adjacent (0..1)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 1.0));
  app.add_flag("--verify", o.verify, "check every destination byte of every request");
  app.add_flag("--pipeline", o.pipeline,
               "keep --concurrency rooms in flight: a slot starts its next room as soon as its "
               "room has committed (default: waves of --concurrency rooms)");
  app.add_flag("--serial-requests", o.serial_requests,
               "waves: one request per round trip (default: each wave's prepares and subscribes, "
               "and then its sends, in one pipelined write per daemon, as an engine's scheduler "
               "step would)");
  app.add_flag("--no-baseline", no_baseline, "skip the raw-fabric baseline (and reference)");
  app.add_flag("--paced-baseline", o.paced_baseline,
               "also a paced raw baseline per run: each room's writes wait for one control "
               "message from the target, --concurrency rooms in flight (the raw bound with a "
               "control round trip per room)");
  app.add_option("--provider", o.provider,
                 "libfabric provider of the baseline (default: the daemons' provider)");
  app.add_option("--piece-bytes", o.piece_bytes,
                 "baseline write split size (match fabric.write_piece_bytes)")
      ->capture_default_str();
  app.add_option("--window", o.window,
                 "baseline writes in flight (match fabric.max_inflight_writes)")
      ->capture_default_str();
  app.add_option("--repeat", o.repeat,
                 "repeat the run (each followed by a baseline run); medians are reported")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup-waves", o.warmup_waves,
                 "untimed waves of the same rooms before the first timed run, so both Ferry and "
                 "the raw baseline are timed over memory touched before, as an engine's is")
      ->capture_default_str()
      ->check(CLI::Range(0, 100));
  app.add_option("--background-rooms", o.background_rooms,
                 "fairness: time --requests rooms one at a time, idle and then while this many "
                 "rooms of --background-tokens flow to the same decode (0: off)");
  app.add_option("--background-tokens", o.background_tokens, "tokens of each background room")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_flag("--latency", o.latency,
               "latency: one room at a time, the decode's prepare sent to its Success event, "
               "--requests times after each --gap-ms idle gap, beside the raw reference");
  app.add_option("--gap-ms", o.gaps_ms,
                 "--latency: idle gaps before each timed room, in ms (comma-separated)")
      ->capture_default_str()
      ->delimiter(',')
      ->check(CLI::Range(0.0, 10000.0));
  app.add_option("--open-loop", o.open_loop_rate,
                 "open loop: Poisson arrivals at RATE rooms/s of the --mix sizes, each room "
                 "prepared and sent at its arrival time")
      ->type_name("RATE")
      ->check(CLI::Range(0.001, 1e6));
  app.add_option("--mix", o.mix,
                 "--open-loop: room sizes as TOKENS:FRACTION,... (fractions sum to 1)")
      ->capture_default_str();
  app.add_option("--duration-s", o.duration_s,
                 "--open-loop: arrivals stop after this many seconds (or --requests arrivals)")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 3600.0));
  app.add_option("--seed", o.seed, "--open-loop: seed of the arrivals and sizes")
      ->capture_default_str();
  app.add_option("--max-lag-ms", o.max_lag_ms,
                 "--open-loop: a room started later than this after its arrival counts as late")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0));
  app.add_option("--layer-wise", o.layer_wise_ms,
                 "layer-wise streaming: per room, send each layer group as a forward pass making "
                 "one every T_MS ms would, then the same room whole after the last layer; report "
                 "last send -> Success of both (src/tools/bench/layerwise.cpp)")
      ->type_name("T_MS")
      ->check(CLI::PositiveNumber);
  app.add_option("--layer-group", o.layer_group, "with --layer-wise: global layers per send")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--room-base", o.room_base, "first room id (default: time-based)");
  app.add_option("--poll-many", o.poll_many,
                 "after the runs, time a poll_many of this many rooms (the run's, then ids "
                 "never used) against as many single polls, on the decode")
      ->check(CLI::Range(0u, 16384u));
  return app
      .add_option("--json", o.json,
                  "the results as one JSON document: on stdout (the text report then goes to "
                  "stderr), or written to FILE ('-': stdout)")
      ->type_name("[FILE]")
      ->expected(0, 1);
}

/// Connect one client per socket, lend memory to `memory: client` pools, read each daemon's
/// config; the exit code when one cannot be used.
std::optional<int> connect_all(context& ctx) {
  for (auto* side : {&ctx.prefills, &ctx.decodes})
    for (const auto& path : side == &ctx.prefills ? ctx.o.prefill_sockets : ctx.o.decode_sockets) {
      auto c = client::client::connect(path, "ferry-bench");
      if (!c) return ctx.fail(c.message, exit_code::unreachable);
      if (auto m = c.value->map_pools(); !m) return ctx.fail_on(*c.value, m.error(), "");
      auto mem = client::engine_memory::lend(*c.value);
      if (!mem) return ctx.fail_on(*c.value, mem.error(), path + ": ");
      if (mem.value.lent())
        ctx.report() << fmt::format(
            "{}: lent {} pool(s) of this process's memory (memory: client)\n", path,
            mem.value.lent());
      ctx.out["lent"].push_back({{"socket", path}, {"pools", mem.value.lent()}});
      ctx.lent.push_back(std::move(mem.value));
      if (!client::daemon_config(*c.value))
        return ctx.fail(path + ": the daemon sent no readable config");
      side->push_back(std::move(c.value));
    }
  for (const auto& c : ctx.prefills) {
    ctx.prefill_controls.push_back(c->daemon().control);
    ctx.prefill_schemas.push_back(schema_of(*client::daemon_config(*c)));
  }
  return std::nullopt;
}

/// The pools every daemon has and their smallest sizes.
std::optional<int> read_pools(context& ctx) {
  const auto kv = static_cast<int>(pool_kind::kv);
  const auto st = static_cast<int>(pool_kind::state);
  const auto ax = static_cast<int>(pool_kind::aux);
  auto all_have = [&](int k) {
    for (auto* side : {&ctx.prefills, &ctx.decodes})
      for (const auto& c : *side)
        if (!c->daemon().pools[k].present) return false;
    return true;
  };
  auto min_items = [&](int k) {
    uint64_t n = ~0ull;
    for (auto* side : {&ctx.prefills, &ctx.decodes})
      for (const auto& c : *side) n = std::min(n, c->daemon().pools[k].layout.buffers[0].items);
    return n;
  };
  if (!all_have(kv)) return ctx.fail("every daemon needs a kv pool", exit_code::usage);
  ctx.page_tokens = ctx.prefills[0]->daemon().page_tokens;
  ctx.pool_pages = min_items(kv);
  ctx.has_state = all_have(st);
  ctx.has_aux = all_have(ax);
  ctx.slots = ctx.has_state ? min_items(st) : ~0ull;
  ctx.rows = ctx.has_aux ? min_items(ax) : ~0ull;
  return std::nullopt;
}

/// The closed-loop workload: `concurrency` slots' page lists (filled with their pattern on
/// every prefill rank), the chunks, and one request's planned writes.
std::optional<int> prepare_workload(context& ctx) {
  const options& o = ctx.o;
  ctx.pages_per_req = (o.prompt_tokens + ctx.page_tokens - 1) / ctx.page_tokens;
  ctx.region =
      ctx.pages_per_req + static_cast<uint32_t>(ctx.pages_per_req * o.fragmentation * 2) + 1;
  if (uint64_t{ctx.region} * o.concurrency > ctx.pool_pages)
    return ctx.fail(
        fmt::format(
            "{} rooms x {} pages (with fragmentation slack) do not fit the kv pools ({} pages)",
            o.concurrency, ctx.region, ctx.pool_pages),
        exit_code::usage);
  if (o.concurrency > ctx.slots || o.concurrency > ctx.rows)
    return ctx.fail(fmt::format("--concurrency {} exceeds the state slots ({}) or aux rows ({})",
                                o.concurrency, ctx.slots, ctx.rows),
                    exit_code::usage);
  ctx.plans.resize(o.concurrency);
  for (uint32_t c = 0; c < o.concurrency; ++c) {
    auto& plan = ctx.plans[c];
    plan.src = make_pages(c * ctx.region, ctx.region, ctx.pages_per_req, o.fragmentation, 1000 + c);
    plan.dst = make_pages((o.concurrency - 1 - c) * ctx.region, ctx.region, ctx.pages_per_req,
                          o.fragmentation, 2000 + c);
    for (auto& pc : ctx.prefills) {
      if (auto e = client::fill_kv(*pc, pattern_key(c), plan.src, 0); !e)
        return ctx.fail_on(*pc, e.error(), "fill: ");
      if (auto e =
              client::fill_state_and_aux(*pc, pattern_key(c), ctx.state_of(c), ctx.row_of(c), 0);
          !e)
        return ctx.fail_on(*pc, e.error(), "fill: ");
    }
  }
  const uint32_t chunk_pages =
      o.chunk_tokens ? std::max(1u, o.chunk_tokens / ctx.page_tokens) : ctx.pages_per_req;
  for (uint32_t left = ctx.pages_per_req; left > 0;) {
    ctx.chunks.push_back(std::min(left, chunk_pages));
    left -= ctx.chunks.back();
  }
  if (ctx.chunks.empty()) ctx.chunks.push_back(0);
  auto one = ctx.plan_room(ctx.plans[0].src, ctx.plans[0].dst);
  if (!one) return ctx.fail(one.message);
  ctx.one = std::move(one.value);
  for (const auto& w : ctx.one) {
    ctx.req_bytes += w.length;
    if (w.dst == space::kv || (w.dst == space::staging && w.src == space::kv))
      ctx.kv_bytes += w.length;
    if (w.dst == space::state) ctx.state_bytes += w.length;
  }
  return std::nullopt;
}

/// The header of the report and of the document: the pair, its geometry and provider.
void describe_pair(context& ctx) {
  auto& p = *ctx.prefills[0];
  auto& d = *ctx.decodes[0];
  if (ctx.provider.empty()) {
    if (auto info = p.info(proto::info_topic::status)) {
      const auto status = nlohmann::json::parse(info.value, nullptr, false);
      if (status.is_object() && status.value("provider", "") != "") {
        ctx.provider = status["provider"].get<std::string>();
        ctx.provider = ctx.provider.substr(0, ctx.provider.find(';'));
      }
    }
  }
  auto geometry_text = [](const ferry_config& c) {
    return fmt::format("TP{}{}", c.tp.size, c.pp.size > 1 ? fmt::format(" PP{}", c.pp.size) : "");
  };
  ctx.report() << fmt::format(
      "ferry-bench: {} ({}, {} daemon(s)) -> {} ({}, {} daemon(s)) over {}\n", p.daemon().node,
      geometry_text(*client::daemon_config(p)), ctx.prefills.size(), d.daemon().node,
      geometry_text(*client::daemon_config(d)), ctx.decodes.size(), ctx.provider);
  ctx.out["provider"] = ctx.provider;
  ctx.out["prefill"] = {{"node", p.daemon().node},
                        {"geometry", geometry_text(*client::daemon_config(p))},
                        {"daemons", ctx.prefills.size()}};
  ctx.out["decode"] = {{"node", d.daemon().node},
                       {"geometry", geometry_text(*client::daemon_config(d))},
                       {"daemons", ctx.decodes.size()}};
}

/// Connect, then run the mode asked for; the exit code.
int run_modes(context& ctx) {
  const options& o = ctx.o;
  if (auto rc = connect_all(ctx)) return *rc;
  if (auto rc = read_pools(ctx)) return *rc;
  describe_pair(ctx);
  if (o.open_loop_rate > 0) return run_open_loop(ctx);
  if (auto rc = prepare_workload(ctx)) return *rc;
  ctx.report() << fmt::format(
      "workload: {} requests x {} tokens ({} pages), concurrency {}, {} chunk(s), fragmentation "
      "{:.2f}\n",
      o.requests, o.prompt_tokens, ctx.pages_per_req, o.concurrency, ctx.chunks.size(),
      o.fragmentation);
  ctx.report() << fmt::format(
      "per request: {:.1f} MiB KV + {:.1f} MiB state + {} B aux = {:.1f} MiB in {} writes\n",
      ctx.kv_bytes / 1048576.0, ctx.state_bytes / 1048576.0,
      ctx.req_bytes - ctx.kv_bytes - ctx.state_bytes, ctx.req_bytes / 1048576.0, ctx.one.size());
  ctx.out["workload"] = {{"requests", o.requests},
                         {"prompt_tokens", o.prompt_tokens},
                         {"pages", ctx.pages_per_req},
                         {"concurrency", o.concurrency},
                         {"chunks", ctx.chunks.size()},
                         {"fragmentation", o.fragmentation},
                         {"repeat", o.repeat},
                         {"room_base", o.room_base},
                         {"memory_lent", !ctx.lent.empty() && ctx.lent.front().lent() > 0}};
  ctx.out["per_request"] = {{"kv_bytes", ctx.kv_bytes},
                            {"state_bytes", ctx.state_bytes},
                            {"aux_bytes", ctx.req_bytes - ctx.kv_bytes - ctx.state_bytes},
                            {"bytes", ctx.req_bytes},
                            {"writes", ctx.one.size()}};
  if (o.background_rooms > 0) return run_fairness(ctx);
  if (o.latency) return run_latency(ctx);
  if (o.layer_wise_ms > 0) return run_layer_wise(ctx);
  return run_throughput(ctx);
}

/// Once a mode has reported (`emit_json`), wait until every room of the run has ended on every
/// prefill rank before the connections close: a prefill room ends one peer message after its
/// decode's Success, and closing the connection that sent it cancels it. Without this wait the
/// last room of a run was often left Failed `cancelled` on the prefill while the report said
/// 0 failed (issue 28). A run that stopped early exits at once, as before.
int settle_prefills(context& ctx, int rc) {
  if (!ctx.reported || ctx.next_room == ctx.o.room_base) return rc;
  std::vector<uint64_t> rooms;
  for (uint64_t id = ctx.o.room_base; id < ctx.next_room; ++id) rooms.push_back(id);
  for (auto& pc : ctx.prefills) {
    if (pc->lost()) continue;
    if (auto e = settle_rooms(*pc, rooms, std::chrono::seconds(120)); !e && !pc->lost()) {
      std::cerr << fmt::format("ferry-bench: {}: rooms still active on the prefill at exit: {}\n",
                               pc->daemon().node, e.message);
      if (rc == exit_code::ok) rc = exit_code::for_error(e.code, false);
    }
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  context ctx;
  options& o = ctx.o;
  CLI::App app{"ferry-bench: Ferry request throughput and latency against a raw-fabric reference"};
  cli::add_version(app, "ferry-bench");
  bool no_baseline = false;
  auto* json_opt = add_options(app, o, no_baseline);
  bench::scale::options scale_opts;
  bench::scale::add_options(app, scale_opts);
  bench::rolling::options rolling_opts;
  bench::rolling::add_options(app, rolling_opts);
  bool digest_rate = false;
  app.add_flag("--digest-rate", digest_rate,
               "no daemons: one core's XXH3-64 rate (integrity.checksums' hash) over 256 MiB, "
               "--repeat passes");
  app.footer(
      "Exit codes: 0 all committed, 1 some failed, 2 usage, 3 ferryd unreachable or lost, "
      "4 timed out (docs/cli.md)");
  if (auto rc = cli::parse(app, argc, argv)) return *rc;
  if (json_opt->count() > 0 && o.json.empty()) o.json = "-";
  o.requests_given = app.count("--requests") > 0;
  o.baseline = !no_baseline;
  ctx.provider = o.provider;
  ctx.text = o.json == "-" ? &std::cerr : &std::cout;
  if (digest_rate) return bench::digest_rate(o.repeat, o.json);
  const int modes = (o.latency ? 1 : 0) + (o.open_loop_rate > 0 ? 1 : 0) +
                    (o.background_rooms > 0 ? 1 : 0) + (o.pipeline ? 1 : 0) +
                    (o.layer_wise_ms > 0 ? 1 : 0);
  if (modes > 1)
    return ctx.fail(
        "--latency, --open-loop, --background-rooms, --layer-wise and --pipeline are separate "
        "modes: choose one",
        exit_code::usage);
  if (rolling_opts.on && (modes > 0 || bench::scale::wanted(scale_opts)))
    return ctx.fail(
        "--rolling is a mode of its own: without --latency, --open-loop, "
        "--background-rooms, --layer-wise, --pipeline, --hold or --fan-in-socket",
        exit_code::usage);
  if (rolling_opts.pause_after > 0 && !rolling_opts.on)
    return ctx.fail("--pause-after is a --rolling option", exit_code::usage);
  // Time-based ids: the milliseconds since the epoch, shifted past 2^20 ids per run, so runs
  // one after the other against the same pair never reuse a room id (a finished room's id is
  // refused for its history's lifetime).
  if (o.room_base == 0)
    o.room_base = static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            std::chrono::system_clock::now().time_since_epoch())
                                            .count())
                  << 20;
  ctx.next_room = o.room_base;
  if (rolling_opts.on)  // src/tools/bench/rolling.cpp
    return bench::rolling::run(rolling_opts,
                               {o.prefill_sockets, o.decode_sockets, o.prompt_tokens, o.requests,
                                o.concurrency, o.repeat, o.verify, o.room_base, o.json});
  if (bench::scale::wanted(scale_opts))  // --hold, --fan-in-socket: src/tools/bench/scale*.cpp
    return bench::scale::run(scale_opts,
                             {o.prefill_sockets, o.decode_sockets, o.prompt_tokens, o.requests,
                              o.concurrency, o.repeat, o.verify, o.room_base, o.json});
  if (o.latency) o.concurrency = 1;  // one room at a time, by definition

  return settle_prefills(ctx, run_modes(ctx));
}
