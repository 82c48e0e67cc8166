// ferry-bench: drive a request workload through running prefill and decode ferryds (one per
// rank: several --prefill-socket / --decode-socket for TP or PP geometries) and, in the same
// run, measure a raw-fabric baseline (plain fi_writedata of the same write sizes between two
// processes of this benchmark), then report both and their ratio.
//
// Closed loop in waves: `concurrency` rooms are prepared, sent and committed together; each
// wave's transfer time runs from its first send to its last Success event. Verification and
// clearing of destinations (with --verify) happen between waves, outside the timed windows.
//
// With --json (no file) the results are one JSON document on stdout, the text report on stderr;
// a run that stops early prints {"ok": false, "error": ...} there instead. Exit codes
// (core/exit_codes.hpp): 0 every request committed (and verified), 1 some did not, 2 usage or
// a workload the daemons cannot hold, 3 a daemon cannot be reached or was lost, 4 timed out.

#include <fmt/format.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <variant>

#include "bench/baseline.hpp"
#include "bench/scale.hpp"
#include "cli/common.hpp"
#include "core/geometry.hpp"
#include "core/plan.hpp"
#include "ferry/client.hpp"
#include "ferry/daemon_config.hpp"
#include "ferry/engine_memory.hpp"
#include "ferry/workload.hpp"

using namespace ferry;
using clock_type = std::chrono::steady_clock;

namespace {

struct options {
  std::vector<std::string> prefill_sockets{"/tmp/ferry-prefill.sock"};
  std::vector<std::string> decode_sockets{"/tmp/ferry-decode.sock"};
  uint32_t prompt_tokens = 4096;
  uint32_t requests = 32;
  uint32_t concurrency = 4;
  uint32_t chunk_tokens = 0;
  double fragmentation = 0.0;
  bool verify = false;
  bool pipeline = false;          ///< keep `concurrency` rooms in flight instead of running waves
  uint32_t background_rooms = 0;  ///< fairness: this many large rooms flow meanwhile
  uint32_t background_tokens = 4096;
  bool baseline = true;
  std::string provider;
  uint64_t piece_bytes = 1 << 20;
  uint32_t window = 64;
  uint32_t repeat = 1;
  uint64_t room_base = 0;
  uint32_t poll_many = 0;  ///< after the runs: time poll_many of this many rooms (0: skip)
  std::string
      json;  ///< write the results as JSON here ("-" or no file: stdout, the prose to stderr)
};

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

/// The sum of daemon_cpu_seconds over `clients`; nullopt if one cannot be read.
std::optional<double> cpu_seconds(const std::vector<std::unique_ptr<client::client>>& clients) {
  double sum = 0;
  for (const auto& c : clients) {
    auto s = daemon_cpu_seconds(*c);
    if (!s) return std::nullopt;
    sum += *s;
  }
  return sum;
}

double rusage_seconds(int who) {
  rusage u{};
  getrusage(who, &u);
  auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  return secs(u.ru_utime) + secs(u.ru_stime);
}
double own_cpu_seconds() { return rusage_seconds(RUSAGE_SELF); }
/// Children that have been waited for (the raw baseline's target).
double children_cpu_seconds() { return rusage_seconds(RUSAGE_CHILDREN); }

/// Page lists of one concurrency slot: `pages` destination-order entries from a region of the
/// pool; with fragmentation f, each next page skips ahead with probability f.
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

uint64_t pattern_key(uint32_t slot) { return 0xfe77'0000'0000ull + slot; }

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{
      "ferry-bench: Ferry request throughput and commit latency against a raw-fabric baseline"};
  cli::add_version(app, "ferry-bench");
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
  app.add_option("--requests", o.requests, "requests to move")
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
  bool no_baseline = false;
  app.add_flag("--no-baseline", no_baseline, "skip the raw-fabric baseline");
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
  app.add_option("--background-rooms", o.background_rooms,
                 "fairness: time --requests rooms one at a time, idle and then while this many "
                 "rooms of --background-tokens flow to the same decode (0: off)");
  app.add_option("--background-tokens", o.background_tokens, "tokens of each background room")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--room-base", o.room_base, "first room id (default: time-based)");
  app.add_option("--poll-many", o.poll_many,
                 "after the runs, time a poll_many of this many rooms (the run's, then ids "
                 "never used) against as many single polls, on the decode")
      ->check(CLI::Range(0u, 16384u));
  auto* json_opt = app.add_option("--json", o.json,
                                  "the results as one JSON document: on stdout (the text report "
                                  "then goes to stderr), or written to FILE ('-': stdout)")
                       ->type_name("[FILE]")
                       ->expected(0, 1);
  bench::scale::options scale_opts;
  bench::scale::add_options(app, scale_opts);
  app.footer(
      "Exit codes: 0 all committed, 1 some failed, 2 usage, 3 ferryd unreachable or lost, "
      "4 timed out (docs/cli.md)");
  if (auto rc = cli::parse(app, argc, argv)) return *rc;
  if (json_opt->count() > 0 && o.json.empty()) o.json = "-";
  o.baseline = !no_baseline;
  // Why the run stopped early, on stderr, and with --json on stdout as the one document too.
  auto fail = [&o](const std::string& msg, int rc = exit_code::failed) {
    std::cerr << "ferry-bench: " << msg << "\n";
    if (o.json == "-")
      std::cout << nlohmann::json{{"ok", false}, {"error", msg}, {"exit_code", rc}}.dump(1) << "\n";
    return rc;
  };
  // A client call that failed: the daemon's refusal, or the connection's loss or timeout.
  auto fail_on = [&fail](const client::client& c, const ferry::error& e, const std::string& what) {
    return fail(what + e.message, exit_code::for_error(e.code, c.lost()));
  };
  std::ostream& text = o.json == "-" ? std::cerr : std::cout;
  nlohmann::json out = {{"lent", nlohmann::json::array()}};
  if (o.room_base == 0)
    o.room_base =
        static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) &
        0x7fff'ffff'0000'0000ull;

  if (bench::scale::wanted(scale_opts))  // --hold, --fan-in-socket: src/bench/scale*.cpp
    return bench::scale::run(scale_opts,
                             {o.prefill_sockets, o.decode_sockets, o.prompt_tokens, o.requests,
                              o.concurrency, o.repeat, o.verify, o.room_base, o.json});

  // One client per rank; every prefill rank uses the same page lists and slots (as TP ranks of
  // one engine do), and so does every decode rank.
  // A daemon whose config has `memory: client` pools gets this process's memory for them, as
  // an engine would lend its own (declared first: it must outlive the connections).
  std::vector<client::engine_memory> lent;
  std::vector<std::unique_ptr<client::client>> prefills, decodes;
  for (auto* side : {&prefills, &decodes})
    for (const auto& path : side == &prefills ? o.prefill_sockets : o.decode_sockets) {
      auto c = client::client::connect(path, "ferry-bench");
      if (!c) return fail(c.message, exit_code::unreachable);
      if (auto m = c.value->map_pools(); !m) return fail_on(*c.value, m.error(), "");
      auto mem = client::engine_memory::lend(*c.value);
      if (!mem) return fail_on(*c.value, mem.error(), path + ": ");
      if (mem.value.lent())
        text << fmt::format("{}: lent {} pool(s) of this process's memory (memory: client)\n", path,
                            mem.value.lent());
      out["lent"].push_back({{"socket", path}, {"pools", mem.value.lent()}});
      lent.push_back(std::move(mem.value));
      if (!client::daemon_config(*c.value))
        return fail(path + ": the daemon sent no readable config");
      side->push_back(std::move(c.value));
    }
  auto& p = *prefills[0];
  auto& d = *decodes[0];
  const auto& ph = p.daemon();
  const auto& dh = d.daemon();
  const auto kv = static_cast<int>(pool_kind::kv);
  const auto st = static_cast<int>(pool_kind::state);
  const auto ax = static_cast<int>(pool_kind::aux);
  auto all_have = [&](int k) {
    for (auto* side : {&prefills, &decodes})
      for (const auto& c : *side)
        if (!c->daemon().pools[k].present) return false;
    return true;
  };
  auto min_items = [&](int k) {
    uint64_t n = ~0ull;
    for (auto* side : {&prefills, &decodes})
      for (const auto& c : *side) n = std::min(n, c->daemon().pools[k].layout.buffers[0].items);
    return n;
  };
  if (!all_have(kv)) return fail("every daemon needs a kv pool", exit_code::usage);

  auto info = p.info(proto::info_topic::status);
  const uint32_t page_tokens = ph.page_tokens;
  const uint32_t pages_per_req = (o.prompt_tokens + page_tokens - 1) / page_tokens;
  const uint32_t region =
      pages_per_req + static_cast<uint32_t>(pages_per_req * o.fragmentation * 2) + 1;
  const uint64_t pool_pages = min_items(kv);
  if (uint64_t{region} * o.concurrency > pool_pages)
    return fail(
        fmt::format(
            "{} rooms x {} pages (with fragmentation slack) do not fit the kv pools ({} pages)",
            o.concurrency, region, pool_pages),
        exit_code::usage);
  const bool has_state = all_have(st);
  const bool has_aux = all_have(ax);
  const uint64_t slots = has_state ? min_items(st) : ~0ull;
  const uint64_t rows = has_aux ? min_items(ax) : ~0ull;
  if (o.concurrency > slots || o.concurrency > rows)
    return fail(fmt::format("--concurrency {} exceeds the state slots ({}) or aux rows ({})",
                            o.concurrency, slots, rows),
                exit_code::usage);
  std::vector<std::string> prefill_controls;
  std::vector<rank_schema> prefill_schemas;
  for (const auto& c : prefills) {
    prefill_controls.push_back(c->daemon().control);
    prefill_schemas.push_back(schema_of(*client::daemon_config(*c)));
  }

  struct slot_plan {
    std::vector<uint32_t> src, dst;
  };
  std::vector<slot_plan> plans(o.concurrency);
  for (uint32_t c = 0; c < o.concurrency; ++c) {
    plans[c].src = make_pages(c * region, region, pages_per_req, o.fragmentation, 1000 + c);
    plans[c].dst = make_pages((o.concurrency - 1 - c) * region, region, pages_per_req,
                              o.fragmentation, 2000 + c);
    for (auto& pc : prefills) {
      if (auto e = client::fill_kv(*pc, pattern_key(c), plans[c].src, 0); !e)
        return fail_on(*pc, e.error(), "fill: ");
      if (auto e = client::fill_state_and_aux(*pc, pattern_key(c), has_state ? c : no_index,
                                              has_aux ? c : no_index, 0);
          !e)
        return fail_on(*pc, e.error(), "fill: ");
    }
  }
  std::vector<uint32_t> chunks;
  const uint32_t chunk_pages =
      o.chunk_tokens ? std::max(1u, o.chunk_tokens / page_tokens) : pages_per_req;
  for (uint32_t left = pages_per_req; left > 0;) {
    chunks.push_back(std::min(left, chunk_pages));
    left -= chunks.back();
  }
  if (chunks.empty()) chunks.push_back(0);

  // Bytes and writes of one request over every (prefill rank, decode rank) link, from the same
  // planner ferryd uses (with staging for head-sliced KV, as ferryd uses when it has room).
  std::vector<planned_write> one;
  for (const auto& dc : decodes) {
    const auto ds = schema_of(*client::daemon_config(*dc));
    auto chosen = select_prefill_peers(ds, prefill_schemas);
    if (!chosen) return fail("geometry: " + chosen.message);
    for (size_t i : chosen.value) {
      auto plan = make_link_plan(prefill_schemas[i], ds);
      if (!plan) return fail("geometry: " + plan.message);
      const auto& link = plan.value;
      const auto sl = make_layout(prefill_schemas[i].pools), dl = make_layout(ds.pools);
      std::vector<planned_copy> pack;
      staging_use su{uint64_t{0}, uint64_t{0}, pages_per_req};
      plan_kv_chunk(link, sl, dl, coalesce_runs(plans[0].src, plans[0].dst), su, pack, one);
      if (has_state) plan_state_link(link, sl, dl, 0, 0, one);
      if (has_aux) plan_aux_link(link, sl, dl, 0, 0, one);
    }
  }
  split_pieces(one, o.piece_bytes);
  uint64_t req_bytes = 0, kv_bytes = 0, state_bytes = 0;
  for (const auto& w : one) {
    req_bytes += w.length;
    if (w.dst == space::kv || (w.dst == space::staging && w.src == space::kv)) kv_bytes += w.length;
    if (w.dst == space::state) state_bytes += w.length;
  }
  std::string provider = o.provider;
  if (provider.empty() && info) {
    const auto status = nlohmann::json::parse(info.value, nullptr, false);
    if (status.is_object() && status.value("provider", "") != "") {
      provider = status["provider"].get<std::string>();
      provider = provider.substr(0, provider.find(';'));
    }
  }
  auto geometry_text = [](const ferry_config& c) {
    return fmt::format("TP{}{}", c.tp.size, c.pp.size > 1 ? fmt::format(" PP{}", c.pp.size) : "");
  };
  text << fmt::format("ferry-bench: {} ({}, {} daemon(s)) -> {} ({}, {} daemon(s)) over {}\n",
                      ph.node, geometry_text(*client::daemon_config(p)), prefills.size(), dh.node,
                      geometry_text(*client::daemon_config(d)), decodes.size(), provider);
  text << fmt::format(
      "workload: {} requests x {} tokens ({} pages), concurrency {}, {} chunk(s), fragmentation "
      "{:.2f}\n",
      o.requests, o.prompt_tokens, pages_per_req, o.concurrency, chunks.size(), o.fragmentation);
  text << fmt::format(
      "per request: {:.1f} MiB KV + {:.1f} MiB state + {} B aux = {:.1f} MiB in {} writes\n",
      kv_bytes / 1048576.0, state_bytes / 1048576.0, req_bytes - kv_bytes - state_bytes,
      req_bytes / 1048576.0, one.size());
  out["provider"] = provider;
  out["prefill"] = {{"node", ph.node},
                    {"geometry", geometry_text(*client::daemon_config(p))},
                    {"daemons", prefills.size()}};
  out["decode"] = {{"node", dh.node},
                   {"geometry", geometry_text(*client::daemon_config(d))},
                   {"daemons", decodes.size()}};
  out["workload"] = {{"requests", o.requests},
                     {"prompt_tokens", o.prompt_tokens},
                     {"pages", pages_per_req},
                     {"concurrency", o.concurrency},
                     {"chunks", chunks.size()},
                     {"fragmentation", o.fragmentation},
                     {"repeat", o.repeat},
                     {"room_base", o.room_base},
                     {"memory_lent", !lent.empty() && lent.front().lent() > 0}};
  out["per_request"] = {{"kv_bytes", kv_bytes},
                        {"state_bytes", state_bytes},
                        {"aux_bytes", req_bytes - kv_bytes - state_bytes},
                        {"bytes", req_bytes},
                        {"writes", one.size()}};
  out["runs"] = nlohmann::json::array();
  // --- Ferry runs and raw baselines, interleaved so both see the same machine state ---
  std::vector<double> latencies_ms, ferry_runs, raw_runs;
  uint32_t done = 0, failed = 0, verified = 0;
  std::string first_failure;
  const uint32_t waves = (o.requests + o.concurrency - 1) / o.concurrency;
  auto last_progress = clock_type::now();
  uint64_t next_room = o.room_base;
  // The results document: on stdout with `--json` alone, else in the --json file (if any).
  auto emit_json = [&]() -> std::optional<int> {
    if (o.json == "-") {
      std::cout << out.dump(1) << "\n";
    } else if (!o.json.empty()) {
      std::ofstream f(o.json);
      f << out.dump(1) << "\n";
      if (!f.flush()) return fail("cannot write --json file " + o.json);
    }
    return std::nullopt;
  };
  // A room's decode side: its id in the source aux row (the workload's check), and on every
  // decode rank its destination cleared (`clear`, for --verify), prepared and subscribed to.
  auto open_room = [&](uint64_t id, const std::vector<uint32_t>& dst, uint32_t slot,
                       bool clear) -> std::optional<int> {
    const uint32_t state = has_state ? slot : no_index, row = has_aux ? slot : no_index;
    if (has_aux)
      for (auto& pc : prefills) std::memcpy(pc->item(pool_kind::aux, 0, slot), &id, 8);
    for (auto& dc : decodes) {
      if (clear)
        if (auto e = client::clear_room(*dc, dst, state, row); !e)
          return fail_on(*dc, e.error(), "clear: ");
      if (auto r = dc->prepare({id, prefill_controls, dst, state, row}); !r)
        return fail_on(*dc, r.error(), "prepare: ");
      if (auto sub = dc->subscribe(id); !sub) return fail_on(*dc, sub.error(), "subscribe: ");
    }
    return std::nullopt;
  };
  // --verify: every destination byte of the room that slot `c` moved, on every decode rank.
  auto verify_slot = [&](uint32_t c, uint64_t room) {
    std::string err;
    for (size_t r = 0; r < decodes.size() && err.empty(); ++r) {
      err = client::verify_room(*decodes[r], pattern_key(c), room, plans[c].dst,
                                has_state ? c : no_index, has_aux ? c : no_index)
                .message;
      if (!err.empty()) err = fmt::format("decode rank {}: {}", r, err);
    }
    if (err.empty())
      ++verified;
    else if (first_failure.empty())
      first_failure = "verify: " + err;
  };
  // --background-rooms: the latency of one room at a time, first idle, then while large rooms
  // flow to the same decode (started together right before the first timed room); the timed
  // rooms use slot 0, the large ones the pages, slots and rows after the timed rooms' regions.
  auto run_fairness = [&]() -> int {
    const uint32_t big_pages = (o.background_tokens + page_tokens - 1) / page_tokens;
    const uint64_t first_big = uint64_t{region} * o.concurrency;
    if (first_big + uint64_t{big_pages} * o.background_rooms > pool_pages ||
        o.concurrency + o.background_rooms > std::min(slots, rows))
      return fail(fmt::format("{} background rooms of {} pages do not fit beside the timed rooms "
                              "(kv pages {}, state slots {}, aux rows {})",
                              o.background_rooms, big_pages, pool_pages, slots, rows),
                  exit_code::usage);
    auto one_room = [&](uint64_t id, const std::vector<uint32_t>& src,
                        const std::vector<uint32_t>& dst, uint32_t slot) -> std::optional<int> {
      if (auto rc = open_room(id, dst, slot, false)) return rc;
      for (auto& pc : prefills) {
        auto r = pc->send({id, src, true, has_state ? slot : no_index, has_aux ? slot : no_index});
        if (!r) return fail_on(*pc, r.error(), "send: ");
      }
      return std::nullopt;
    };
    std::set<uint64_t> background_left;  // per decode rank's count below: rooms not yet ended
    std::map<uint64_t, uint32_t> ends_left;
    // Waits for `room` on every decode rank; terminal events of background rooms on the way
    // are counted. Returns the latency in ms, or an exit code.
    auto wait_room = [&](uint64_t room, clock_type::time_point t0) -> std::variant<double, int> {
      for (size_t rank = 0; rank < decodes.size(); ++rank)
        for (bool mine = false; !mine;) {
          auto e = decodes[rank]->next_event(std::chrono::seconds(120));
          if (!e) return fail_on(*decodes[rank], e.error(), "waiting for commits: ");
          if (!is_terminal(e.value.status)) continue;
          if (e.value.status != room_status::success)
            return fail(fmt::format("room {}: {}", e.value.room, e.value.reason));
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
    std::vector<double> idle_ms, loaded_ms;
    for (uint32_t i = 0; i < o.requests; ++i) {
      const auto t0 = clock_type::now();
      if (auto rc = one_room(next_room++, plans[0].src, plans[0].dst, 0)) return *rc;
      auto r = wait_room(next_room - 1, t0);
      if (auto* rc = std::get_if<int>(&r)) return *rc;
      idle_ms.push_back(std::get<double>(r));
    }
    for (uint32_t k = 0; k < o.background_rooms; ++k) {
      std::vector<uint32_t> pages(big_pages);
      for (uint32_t i = 0; i < big_pages; ++i)
        pages[i] = static_cast<uint32_t>(first_big + uint64_t{k} * big_pages + i);
      const uint64_t id = next_room++;
      background_left.insert(id);
      ends_left[id] = static_cast<uint32_t>(decodes.size());
      if (auto rc = one_room(id, pages, pages, o.concurrency + k)) return *rc;
    }
    const auto load_start = clock_type::now();
    for (uint32_t i = 0; i < o.requests && !background_left.empty(); ++i) {
      const auto t0 = clock_type::now();
      if (auto rc = one_room(next_room++, plans[0].src, plans[0].dst, 0)) return *rc;
      auto r = wait_room(next_room - 1, t0);
      if (auto* rc = std::get_if<int>(&r)) return *rc;
      loaded_ms.push_back(std::get<double>(r));
    }
    // The rest of the background rooms, then their time.
    for (size_t rank = 0; rank < decodes.size() && !background_left.empty(); ++rank)
      for (int guard = 0; guard < 1000000 && !background_left.empty(); ++guard) {
        auto e = decodes[rank]->next_event(std::chrono::seconds(120));
        if (!e) return fail_on(*decodes[rank], e.error(), "waiting for background rooms: ");
        if (!is_terminal(e.value.status)) continue;
        if (e.value.status != room_status::success)
          return fail(fmt::format("room {}: {}", e.value.room, e.value.reason));
        if (auto it = ends_left.find(e.value.room); it != ends_left.end() && --it->second == 0) {
          background_left.erase(e.value.room);
          ends_left.erase(it);
        }
      }
    const double load_s = std::chrono::duration<double>(clock_type::now() - load_start).count();
    const double idle_p50 = percentile(idle_ms, 0.5);
    const double loaded_p50 = loaded_ms.empty() ? 0 : percentile(loaded_ms, 0.5);
    text << fmt::format(
        "fairness: {} rooms of {} tokens one at a time: idle p50 {:.2f} ms p99 {:.2f} ms; while "
        "{} rooms of {} tokens flow ({:.3f} s, {:.2f} GB/s of them): {} rooms, p50 {:.2f} ms "
        "p99 {:.2f} ms, max {:.2f} ms; p50 loaded / idle = {:.2f}\n",
        idle_ms.size(), o.prompt_tokens, idle_p50, percentile(idle_ms, 0.99), o.background_rooms,
        o.background_tokens, load_s,
        double(big_pages) * o.background_rooms * kv_bytes / pages_per_req / load_s / 1e9,
        loaded_ms.size(), loaded_p50, loaded_ms.empty() ? 0 : percentile(loaded_ms, 0.99),
        loaded_ms.empty() ? 0 : percentile(loaded_ms, 1), idle_p50 > 0 ? loaded_p50 / idle_p50 : 0);
    out["fairness"] = {
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
      return fail("the background rooms ended before a timed room could run beside them");
    out["ok"] = true;
    if (auto rc = emit_json()) return *rc;
    return exit_code::ok;
  };
  if (o.background_rooms > 0) return run_fairness();

  // --pipeline: every slot starts its next room once its room has committed on every decode
  // rank (and, with --verify, was verified: inside the timed window then). Events are read
  // from the decode where the oldest live room still waits, so none is waited for in vain.
  auto run_pipeline = [&](double& transfer_s, uint32_t& run_done) -> std::optional<int> {
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
        const uint64_t id = next_room++;
        ++started;
        if (auto rc = open_room(id, plans[c].dst, c, o.verify)) return rc;
        live& l = rooms[id];
        l.slot = c;
        l.done_on.assign(decodes.size(), false);
        l.pending = static_cast<uint32_t>(decodes.size());
        l.started = clock_type::now();
        if (!first_send) first_send = l.started;
        for (uint32_t k = 0, pos = 0; k < chunks.size(); pos += chunks[k], ++k) {
          const bool last = k + 1 == chunks.size();
          std::vector<uint32_t> pg(plans[c].src.begin() + pos,
                                   plans[c].src.begin() + pos + chunks[k]);
          for (auto& pc : prefills) {
            auto r = pc->send(
                {id, pg, last, last && has_state ? c : no_index, last && has_aux ? c : no_index});
            if (!r) return fail_on(*pc, r.error(), "send: ");
          }
        }
      }
      const live& oldest = rooms.begin()->second;
      const size_t rank = static_cast<size_t>(
          std::find(oldest.done_on.begin(), oldest.done_on.end(), false) - oldest.done_on.begin());
      auto& dc = *decodes[rank];
      auto e = dc.next_event(std::chrono::seconds(120));
      if (!e) return fail_on(dc, e.error(), "waiting for commits: ");
      if (!is_terminal(e.value.status)) continue;
      auto it = rooms.find(e.value.room);
      if (it == rooms.end() || it->second.done_on[rank]) continue;
      live& l = it->second;
      l.done_on[rank] = true;
      l.finished = clock_type::now();
      if (e.value.status != room_status::success) {
        l.ok = false;
        if (first_failure.empty())
          first_failure = fmt::format("room {}: {}", e.value.room, e.value.reason);
      }
      if (--l.pending > 0) continue;
      if (l.ok && o.verify) verify_slot(l.slot, it->first);
      if (l.ok) {
        ++done;
        ++run_done;
        latencies_ms.push_back(
            std::chrono::duration<double, std::milli>(l.finished - l.started).count());
      } else {
        ++failed;
      }
      last_end = std::max(last_end, l.finished);
      free_slots.push_back(l.slot);
      rooms.erase(it);
      ++ended;
      if (clock_type::now() - last_progress > std::chrono::seconds(2)) {
        std::cerr << fmt::format("  ... {}/{} requests committed\n", run_done, o.requests);
        last_progress = clock_type::now();
      }
    }
    transfer_s = std::chrono::duration<double>(last_end - *first_send).count();
    return std::nullopt;
  };
  for (uint32_t rep = 0; rep < o.repeat; ++rep) {
    double transfer_s = 0;
    uint32_t run_done = 0;
    const auto cpu_prefill = cpu_seconds(prefills), cpu_decode = cpu_seconds(decodes);
    const double cpu_bench = own_cpu_seconds();
    if (o.pipeline)
      if (auto rc = run_pipeline(transfer_s, run_done)) return *rc;
    for (uint32_t w = 0; w < (o.pipeline ? 0 : waves); ++w) {
      const uint32_t n = std::min(o.concurrency, o.requests - w * o.concurrency);
      std::vector<uint64_t> room(n);
      std::vector<clock_type::time_point> started(n);
      for (uint32_t c = 0; c < n; ++c) {
        room[c] = next_room++;
        if (auto rc = open_room(room[c], plans[c].dst, c, o.verify)) return *rc;
      }
      const auto wave_start = clock_type::now();
      for (uint32_t k = 0, pos = 0; k < chunks.size(); pos += chunks[k], ++k) {
        const bool last = k + 1 == chunks.size();
        for (uint32_t c = 0; c < n; ++c) {
          if (k == 0) started[c] = clock_type::now();
          std::vector<uint32_t> pg(plans[c].src.begin() + pos,
                                   plans[c].src.begin() + pos + chunks[k]);
          for (auto& pc : prefills) {
            auto r = pc->send({room[c], pg, last, last && has_state ? c : no_index,
                               last && has_aux ? c : no_index});
            if (!r) return fail_on(*pc, r.error(), "send: ");
          }
        }
      }
      // A request is done when every decode rank reports a terminal status for it.
      clock_type::time_point wave_end = wave_start;
      std::vector<uint32_t> pending(n, static_cast<uint32_t>(decodes.size()));
      std::vector<bool> ok(n, true);
      std::vector<clock_type::time_point> finished(n);
      for (auto& dc : decodes)
        for (uint32_t left = n; left > 0;) {
          auto e = dc->next_event(std::chrono::seconds(120));
          if (!e) return fail_on(*dc, e.error(), "waiting for commits: ");
          if (!is_terminal(e.value.status)) continue;
          auto it = std::find(room.begin(), room.end(), e.value.room);
          if (it == room.end()) continue;
          const auto c = static_cast<size_t>(it - room.begin());
          --left;
          --pending[c];
          finished[c] = std::max(finished[c], clock_type::now());
          if (e.value.status != room_status::success) {
            ok[c] = false;
            if (first_failure.empty())
              first_failure = fmt::format("room {}: {}", e.value.room, e.value.reason);
          }
        }
      for (uint32_t c = 0; c < n; ++c) {
        wave_end = std::max(wave_end, finished[c]);
        if (ok[c]) {
          ++done;
          ++run_done;
          latencies_ms.push_back(
              std::chrono::duration<double, std::milli>(finished[c] - started[c]).count());
        } else {
          ++failed;
        }
      }
      transfer_s += std::chrono::duration<double>(wave_end - wave_start).count();
      if (o.verify)
        for (uint32_t c = 0; c < n; ++c) verify_slot(c, room[c]);
      if (clock_type::now() - last_progress > std::chrono::seconds(2)) {
        std::cerr << fmt::format("  ... run {}/{}: {}/{} requests committed\n", rep + 1, o.repeat,
                                 run_done, o.requests);
        last_progress = clock_type::now();
      }
    }
    const double gbs = transfer_s > 0 ? double(req_bytes) * run_done / transfer_s / 1e9 : 0;
    ferry_runs.push_back(gbs);
    // CPU of the whole run (prepares, sends and waits included), per room, on each side.
    auto per_room_ms = [&](std::optional<double> before, std::optional<double> after) {
      return before && after && run_done > 0 ? nlohmann::json((*after - *before) * 1e3 / run_done)
                                             : nlohmann::json(nullptr);
    };
    const nlohmann::json cpu = {{"prefill", per_room_ms(cpu_prefill, cpu_seconds(prefills))},
                                {"decode", per_room_ms(cpu_decode, cpu_seconds(decodes))},
                                {"bench", per_room_ms(cpu_bench, own_cpu_seconds())}};
    std::string raw_text = "raw baseline skipped";
    nlohmann::json run = {
        {"ferry_gbps", gbs},
        {"requests", run_done},
        {"transfer_s", transfer_s},
        {"rooms_per_s", transfer_s > 0 ? run_done / transfer_s : 0.0},
        {"raw_gbps", nullptr},
        {"ratio", nullptr},
        {"writes_per_s", transfer_s > 0 ? double(run_done) * one.size() / transfer_s : 0.0},
        {"cpu_ms_per_room", cpu}};
    if (o.baseline) {
      // The raw run's CPU: its initiator is this process, its target a child it waits for.
      const double raw_self = own_cpu_seconds(), raw_child = children_cpu_seconds();
      auto r = bench::run_baseline(provider, one, o.concurrency, waves, o.window);
      const double rooms = double(o.concurrency) * waves;
      run["raw_cpu_ms_per_room"] = {{"initiator", (own_cpu_seconds() - raw_self) * 1e3 / rooms},
                                    {"target", (children_cpu_seconds() - raw_child) * 1e3 / rooms}};
      if (!r.error.empty()) {
        raw_text = "raw baseline failed: " + r.error;
        run["raw_error"] = r.error;
      } else {
        raw_runs.push_back(r.gbps);
        run["raw_gbps"] = r.gbps;
        run["ratio"] = r.gbps > 0 ? gbs / r.gbps : 0.0;
        raw_text =
            fmt::format("raw {:.2f} GB/s, ratio {:.2f}", r.gbps, r.gbps > 0 ? gbs / r.gbps : 0.0);
      }
    }
    text << fmt::format(
        "run {}/{}: ferry {:.2f} GB/s ({} requests, {:.3f} s of transfer, {:.0f} rooms/s); {}\n",
        rep + 1, o.repeat, gbs, run_done, transfer_s, transfer_s > 0 ? run_done / transfer_s : 0.0,
        raw_text);
    if (cpu["prefill"].is_number() && cpu["decode"].is_number())
      text << fmt::format(
          "  cpu per room: prefill {:.3f} ms, decode {:.3f} ms, bench {:.3f} ms{}\n",
          cpu["prefill"].get<double>(), cpu["decode"].get<double>(), cpu["bench"].get<double>(),
          run.contains("raw_cpu_ms_per_room")
              ? fmt::format("; raw initiator {:.3f} ms, target {:.3f} ms",
                            run["raw_cpu_ms_per_room"]["initiator"].get<double>(),
                            run["raw_cpu_ms_per_room"]["target"].get<double>())
              : "");
    out["runs"].push_back(std::move(run));
  }
  const double ferry_gbs = percentile(ferry_runs, 0.5);
  text << fmt::format(
      "ferry: {} requests committed, {} failed, {:.2f} GB moved; median {:.2f} GB/s (min {:.2f}, "
      "max {:.2f})\n",
      done, failed, double(req_bytes) * done / 1e9, ferry_gbs, percentile(ferry_runs, 0),
      percentile(ferry_runs, 1));
  text << fmt::format(
      "commit latency (first send -> Success on decode): p50 {:.2f} ms, p99 {:.2f} ms\n",
      percentile(latencies_ms, 0.5), percentile(latencies_ms, 0.99));
  if (!raw_runs.empty()) {
    const double raw_gbs = percentile(raw_runs, 0.5);
    text << fmt::format(
        "raw fabric (same {} writes per request, window {}): median {:.2f} GB/s (min {:.2f}, max "
        "{:.2f})\n",
        one.size(), o.window, raw_gbs, percentile(raw_runs, 0), percentile(raw_runs, 1));
    text << fmt::format("ratio: ferry / raw = {:.2f} (medians)\n",
                        raw_gbs > 0 ? ferry_gbs / raw_gbs : 0.0);
  }
  const uint64_t total_requests = uint64_t{o.requests} * o.repeat;
  {
    std::vector<double> rates, writes, cpu_p, cpu_d;
    for (const auto& r : out["runs"]) {
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
    out["ferry"] = {{"committed", done},
                    {"failed", failed},
                    {"bytes", req_bytes * done},
                    {"gbps_median", ferry_gbs},
                    {"gbps_min", percentile(ferry_runs, 0)},
                    {"gbps_max", percentile(ferry_runs, 1)},
                    {"rooms_per_s_median", percentile(rates, 0.5)},
                    {"writes_per_s_median", percentile(writes, 0.5)},
                    {"cpu_ms_per_room_median",
                     {{"prefill", median_or_null(cpu_p)}, {"decode", median_or_null(cpu_d)}}},
                    {"mode", o.pipeline ? "pipeline" : "waves"}};
    out["commit_latency_ms"] = {{"from", "first send"},
                                {"to", "Success on decode"},
                                {"p50", percentile(latencies_ms, 0.5)},
                                {"p99", percentile(latencies_ms, 0.99)},
                                {"samples", latencies_ms.size()}};
    out["raw"] = nullptr;
    out["ratio"] = nullptr;
    if (!raw_runs.empty()) {
      const double raw_gbs = percentile(raw_runs, 0.5);
      out["raw"] = {{"gbps_median", raw_gbs},
                    {"gbps_min", percentile(raw_runs, 0)},
                    {"gbps_max", percentile(raw_runs, 1)},
                    {"window", o.window}};
      out["ratio"] = raw_gbs > 0 ? ferry_gbs / raw_gbs : 0.0;
    }
    out["verified"] = o.verify ? nlohmann::json(verified) : nlohmann::json(nullptr);
    out["first_failure"] = first_failure;
  }
  if (o.verify)
    text << fmt::format("verified: {}/{} requests, every destination byte\n", verified,
                        total_requests);
  if (!first_failure.empty()) text << "first failure: " << first_failure << "\n";
  if (o.poll_many > 0) {
    // One engine step's batch poll: the run's rooms first, then ids never used (answered
    // unknown_room on a decode). 50 batches, then the same rooms one poll each, once.
    std::vector<uint64_t> rooms;
    for (uint32_t i = 0; i < o.poll_many; ++i) rooms.push_back(o.room_base + i);
    std::vector<double> batch_ms;
    for (int i = 0; i < 50; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = d.poll_many(rooms);
      batch_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
      if (!r) return fail_on(d, r.error(), "poll_many: ");
      if (r.value.size() != rooms.size())
        return fail(
            fmt::format("poll_many: {} answers for {} rooms", r.value.size(), rooms.size()));
    }
    const auto t0 = std::chrono::steady_clock::now();
    for (auto room : rooms) (void)d.poll(room);
    const double singles_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    text << fmt::format(
        "poll_many of {} rooms (one round trip): p50 {:.3f} ms, p99 {:.3f} ms over 50; the same "
        "{} rooms polled one by one: {:.2f} ms\n",
        rooms.size(), percentile(batch_ms, 0.5), percentile(batch_ms, 0.99), rooms.size(),
        singles_ms);
    out["poll_many"] = {{"rooms", rooms.size()},
                        {"p50_ms", percentile(batch_ms, 0.5)},
                        {"p99_ms", percentile(batch_ms, 0.99)},
                        {"single_polls_ms", singles_ms}};
  }
  const bool ok = failed == 0 && (!o.verify || verified == total_requests);
  out["ok"] = ok;
  if (auto rc = emit_json()) return *rc;
  return ok ? exit_code::ok : exit_code::failed;
}
