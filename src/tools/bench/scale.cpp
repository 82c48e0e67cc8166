// ferry-bench --hold N: N rooms prepared and waiting at once, then sent; each daemon's memory
// per open room and the committed rate against waves of --hold-reference rooms of the same size,
// in the same run; with --sustain-s, N rooms kept open for that long, a window of them flowing,
// with the memory sampled.
// Also the options and dispatch of the scale modes (scale.hpp).

#include "tools/bench/scale.hpp"

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <fstream>
#include <iostream>

#include "core/exit_codes.hpp"
#include "tools/bench/scale_report.hpp"
#include "tools/workload/daemon_config.hpp"

namespace ferry::bench::scale {

void add_options(CLI::App& app, options& o) {
  app.add_option("--hold", o.hold,
                 "scale: prepare this many rooms of --prompt-tokens and hold them all waiting, "
                 "report each daemon's memory before and with them open, then send them all and "
                 "report the rate against waves of --hold-reference rooms (needs as many state "
                 "slots, aux rows and room-sized KV regions on the decode)")
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--hold-reference", o.reference,
                 "--hold: rooms per wave of the reference rate (as many rooms in all as --hold)")
      ->capture_default_str()
      ->check(CLI::Range(1u, 1u << 20));
  app.add_option("--sustain-s", o.sustain_s,
                 "--hold: then keep --hold rooms open for this many seconds, --sustain-window of "
                 "them flowing, a room's end opening the next, and sample each daemon's memory "
                 "every --sample-s (0: skip)")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  app.add_option("--sustain-window", o.sustain_window,
                 "--sustain-s: rooms sent and not ended at most; the other open rooms wait, "
                 "prepared, and the oldest is sent next (0: each room is sent once open)")
      ->capture_default_str();
  app.add_option("--sample-s", o.sample_s, "--sustain-s: seconds between memory samples")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--fan-in-socket", o.fan_in_sockets,
                 "scale: the client socket of an independent prefill instance (its own node and "
                 "control address); repeat or comma-separate: their rooms go to the decode "
                 "together, against the first alone, --concurrency in flight, --requests each")
      ->delimiter(',');
}

int report::fail(const stop& s) {
  std::cerr << "ferry-bench: " << s.message << "\n";
  if (c.json == "-")
    std::cout << nlohmann::json{{"ok", false}, {"error", s.message}, {"exit_code", s.rc}}.dump(1)
              << "\n";
  return s.rc;
}

int report::finish(bool ok) {
  out["ok"] = ok;
  if (c.json == "-") {
    std::cout << out.dump(1) << "\n";
  } else if (!c.json.empty()) {
    std::ofstream f(c.json);
    f << out.dump(1) << "\n";
    if (!f.flush()) return fail(stop{exit_code::failed, "cannot write --json file " + c.json});
  }
  return ok ? exit_code::ok : exit_code::failed;
}

uint64_t min_items(const std::vector<const instance*>& of, pool_kind k) {
  uint64_t n = ~0ull;
  const auto i = static_cast<int>(k);
  for (const auto* in : of)
    for (const auto& c : in->ranks) {
      const auto& pool = c->daemon().pools[i];
      if (!pool.present) return ~0ull;
      n = std::min(n, pool.layout.buffers[0].items);
    }
  return n;
}

uint32_t pages_per_room(const std::vector<const instance*>& of, uint32_t tokens) {
  const uint32_t page = of.front()->ranks.front()->daemon().page_tokens;
  for (const auto* in : of)
    for (const auto& c : in->ranks)
      if (c->daemon().page_tokens != page || page == 0) return 0;
  return (tokens + page - 1) / page;
}

maybe_stop check_fit(uint32_t conc, uint32_t ppr, const instance& decode,
                     const std::vector<const instance*>& sources,
                     const std::vector<const instance*>& all) {
  const uint64_t dst_pages = min_items({&decode}, pool_kind::kv);
  const uint64_t src_pages = min_items(sources, pool_kind::kv);
  const uint64_t slots = std::min(min_items(all, pool_kind::state), min_items(all, pool_kind::aux));
  if (uint64_t{conc} * ppr <= dst_pages && conc <= slots && src_pages >= ppr) return std::nullopt;
  return stop{
      exit_code::usage,
      fmt::format("--concurrency {} rooms of {} pages need {} kv pages on the decode (it has "
                  "{}), {} state slots and aux rows on every daemon (the smallest has {}) and "
                  "{} kv pages on each prefill (the smallest has {})",
                  conc, ppr, uint64_t{conc} * ppr, dst_pages, conc, slots, ppr, src_pages)};
}

std::string provider_of(instance& i) {
  auto info = i.ranks.front()->info(proto::info_topic::status);
  if (!info) return "";
  const auto status = nlohmann::json::parse(info.value, nullptr, false);
  if (!status.is_object()) return "";
  const auto p = status.value("provider", "");
  return p.substr(0, p.find(';'));
}

uint64_t piece_bytes_of(const instance& i) {
  return client::daemon_config(*i.ranks.front())->fabric.write_piece_bytes;
}

nlohmann::json to_json(const std::optional<daemon_memory>& m) {
  if (!m) return nullptr;
  return {{"rss_kib", m->rss_kib}, {"anon_kib", m->anon_kib}, {"shmem_kib", m->shmem_kib}};
}

nlohmann::json latency_json(const std::vector<double>& ms) {
  return {{"p50", quantile(ms, 0.5)}, {"p99", quantile(ms, 0.99)}, {"samples", ms.size()}};
}

/// CPU seconds of each daemon and, last, of this process.
std::vector<double> cpu(const std::vector<daemon_ref>& ds) {
  std::vector<double> out;
  for (const auto& d : ds) out.push_back(cpu_seconds_of(*d.c).value_or(0));
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto secs = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) / 1e6; };
  out.push_back(secs(u.ru_utime) + secs(u.ru_stime));
  return out;
}

/// Milliseconds of CPU per room of each daemon and of the bench between two `cpu` readings.
nlohmann::json cpu_per_room(const std::vector<daemon_ref>& ds, const std::vector<double>& a,
                            const std::vector<double>& b, uint64_t rooms) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t k = 0; k < a.size() && rooms > 0; ++k) {
    const std::string who = k < ds.size() ? ds[k].side : "bench";
    out[who] = out.value(who, 0.0) + (b[k] - a[k]) * 1e3 / double(rooms);
  }
  return out;
}

std::string cpu_text(const nlohmann::json& c) {
  std::string t;
  for (const auto& [who, ms] : c.items())
    t += fmt::format("{}{} {:.3f} ms", t.empty() ? "" : ", ", who, ms.get<double>());
  return t;
}

namespace {

std::vector<std::optional<daemon_memory>> sample(const std::vector<daemon_ref>& ds) {
  std::vector<std::optional<daemon_memory>> out;
  for (const auto& d : ds) out.push_back(memory_of(*d.c));
  return out;
}

/// KiB per room between two samples of one daemon (null when unread).
nlohmann::json per_room(const std::optional<daemon_memory>& before,
                        const std::optional<daemon_memory>& with, uint64_t rooms) {
  if (!before || !with || rooms == 0) return nullptr;
  auto diff = [&](uint64_t a, uint64_t b) { return (double(b) - double(a)) / double(rooms); };
  return {{"rss_kib", diff(before->rss_kib, with->rss_kib)},
          {"anon_kib", diff(before->anon_kib, with->anon_kib)}};
}

}  // namespace

int run_hold(const options& o, report& rep) {
  const common& c = rep.c;
  std::vector<instance> prefills(1);
  instance decode;
  if (auto s = connect(prefills[0], c.prefill_sockets, rep.text)) return rep.fail(*s);
  if (auto s = connect(decode, c.decode_sockets, rep.text)) return rep.fail(*s);
  const uint32_t n = o.hold, ref = std::min(o.reference, o.hold);
  const uint32_t ppr = pages_per_room({&prefills[0], &decode}, c.prompt_tokens);
  if (ppr == 0)
    return rep.fail(stop{exit_code::usage, "the daemons need kv pools of one page_tokens"});
  const uint64_t dst_pages = min_items({&decode}, pool_kind::kv);
  const uint64_t src_pages = min_items({&prefills[0]}, pool_kind::kv);
  const uint64_t slots = std::min(min_items({&prefills[0], &decode}, pool_kind::state),
                                  min_items({&prefills[0], &decode}, pool_kind::aux));
  if (uint64_t{n} * ppr > dst_pages || n > slots || src_pages < ppr)
    return rep.fail(stop{
        exit_code::usage,
        fmt::format("--hold {} rooms of {} pages need {} kv pages on the decode (it has {}), {} "
                    "state slots and aux rows on both sides (they have {}) and {} kv pages on "
                    "the prefill (it has {}): size the pools with ferryd --set "
                    "(scripts/bench-scale.sh)",
                    n, ppr, uint64_t{n} * ppr, dst_pages, n, slots, ppr, src_pages)});
  const auto regions = static_cast<uint32_t>(std::min<uint64_t>(n, src_pages / ppr));
  driver d(prefills, decode, ppr, regions, c.verify);
  auto bytes = d.room_bytes(piece_bytes_of(prefills[0]));
  if (!bytes) return rep.fail(stop{exit_code::failed, bytes.message});
  const auto [room_bytes, room_writes] = bytes.value;
  const std::string provider = provider_of(prefills[0]);
  rep.text << fmt::format(
      "ferry-bench --hold: {} -> {} over {}; {} rooms of {} tokens ({} pages, {} B in {} writes) "
      "held at once, against waves of {}\n",
      prefills[0].ranks[0]->daemon().node, decode.ranks[0]->daemon().node, provider, n,
      c.prompt_tokens, ppr, room_bytes, room_writes, ref);
  rep.out = {{"mode", "hold"},
             {"provider", provider},
             {"rooms", n},
             {"reference_rooms", ref},
             {"per_room",
              {{"tokens", c.prompt_tokens},
               {"pages", ppr},
               {"bytes", room_bytes},
               {"writes", room_writes}}},
             {"runs", nlohmann::json::array()}};
  if (auto s = d.fill(n)) return rep.fail(*s);

  std::vector<daemon_ref> daemons;
  for (auto& r : prefills[0].ranks) daemons.push_back({"prefill", r.get()});
  for (auto& r : decode.ranks) daemons.push_back({"decode", r.get()});
  uint64_t next_id = c.room_base;
  uint32_t failed = 0, verified = 0;
  std::string first_failure;
  auto tally = [&](const std::string& f, uint32_t fails, uint32_t ver) {
    failed += fails;
    verified += ver;
    if (first_failure.empty()) first_failure = f;
  };
  const auto timeout = std::chrono::seconds(300);
  std::vector<double> ref_rates, hold_rates;
  for (uint32_t rep_i = 0; rep_i < c.repeat; ++rep_i) {
    // The reference: waves of `ref` rooms, as many rooms in all as the hold.
    double ref_s = 0;
    uint32_t ref_done = 0;
    const auto ref_cpu0 = cpu(daemons);
    std::vector<double> ref_lat;
    for (uint32_t moved = 0; moved < n;) {
      std::vector<room_plan> rooms;
      for (uint32_t i = 0; i < ref && moved + i < n; ++i) rooms.push_back({next_id++, 0, i, i});
      moved += static_cast<uint32_t>(rooms.size());
      wave_result w;
      if (auto s = run_wave(d, rooms, {}, timeout, w)) return rep.fail(*s);
      ref_s += w.transfer_s;
      ref_done += w.committed;
      ref_lat.insert(ref_lat.end(), w.latency_ms.begin(), w.latency_ms.end());
      tally(w.first_failure, w.failed, w.verified);
    }
    const auto ref_cpu = cpu_per_room(daemons, ref_cpu0, cpu(daemons), ref_done);
    // The hold: every room open at once, the memory sampled before and with them.
    const auto before = sample(daemons);
    std::vector<std::optional<daemon_memory>> held;
    std::vector<double> hold_cpu0;
    std::vector<room_plan> rooms;
    rooms.reserve(n);
    for (uint32_t i = 0; i < n; ++i) rooms.push_back({next_id++, 0, i, i});
    wave_result w;
    auto on_ready = [&] {
      held = sample(daemons);
      hold_cpu0 = cpu(daemons);
    };
    if (auto s = run_wave(d, rooms, on_ready, timeout, w)) return rep.fail(*s);
    const auto hold_cpu = cpu_per_room(daemons, hold_cpu0, cpu(daemons), w.committed);
    const auto after = sample(daemons);
    tally(w.first_failure, w.failed, w.verified);
    const double ref_rate = ref_s > 0 ? ref_done / ref_s : 0;
    const double hold_rate = w.transfer_s > 0 ? w.committed / w.transfer_s : 0;
    ref_rates.push_back(ref_rate);
    hold_rates.push_back(hold_rate);
    nlohmann::json mem = nlohmann::json::array();
    for (size_t k = 0; k < daemons.size(); ++k)
      mem.push_back({{"side", daemons[k].side},
                     {"node", daemons[k].c->daemon().node},
                     {"before", to_json(before[k])},
                     {"held", to_json(held[k])},
                     {"after", to_json(after[k])},
                     {"per_room_held_kib", per_room(before[k], held[k], n)}});
    rep.text << fmt::format(
        "run {}/{}: reference {} rooms in waves of {}: {:.0f} rooms/s ({:.2f} GB/s, p50 {:.1f} "
        "ms); held {} rooms (opened in {:.2f} s, all WaitingForInput {:.2f} s later): {:.0f} "
        "rooms/s ({:.2f} GB/s, p50 {:.1f} ms; the sends took {:.2f} s); held / reference = "
        "{:.2f}\n  cpu per room: reference {}; held {}\n",
        rep_i + 1, c.repeat, ref_done, ref, ref_rate, ref_rate * room_bytes / 1e9,
        quantile(ref_lat, 0.5), w.committed, w.open_s, w.ready_s, hold_rate,
        hold_rate * room_bytes / 1e9, quantile(w.latency_ms, 0.5), w.send_s,
        ref_rate > 0 ? hold_rate / ref_rate : 0.0, cpu_text(ref_cpu), cpu_text(hold_cpu));
    for (const auto& m : mem)
      if (m["per_room_held_kib"].is_object())
        rep.text << fmt::format(
            "  {} {}: resident {} -> {} KiB with the rooms open ({:.2f} KiB per room; anonymous "
            "{} -> {} KiB, {:.2f} KiB per room), {} KiB after they ended\n",
            m["side"].get<std::string>(), m["node"].get<std::string>(),
            m["before"]["rss_kib"].get<uint64_t>(), m["held"]["rss_kib"].get<uint64_t>(),
            m["per_room_held_kib"]["rss_kib"].get<double>(),
            m["before"]["anon_kib"].get<uint64_t>(), m["held"]["anon_kib"].get<uint64_t>(),
            m["per_room_held_kib"]["anon_kib"].get<double>(),
            m["after"]["rss_kib"].get<uint64_t>());
    rep.out["runs"].push_back({{"reference",
                                {{"rooms", ref_done},
                                 {"transfer_s", ref_s},
                                 {"rooms_per_s", ref_rate},
                                 {"gbps", ref_rate * room_bytes / 1e9},
                                 {"latency_ms", latency_json(ref_lat)},
                                 {"cpu_ms_per_room", ref_cpu}}},
                               {"hold",
                                {{"rooms", w.committed},
                                 {"open_s", w.open_s},
                                 {"ready_s", w.ready_s},
                                 {"send_s", w.send_s},
                                 {"transfer_s", w.transfer_s},
                                 {"rooms_per_s", hold_rate},
                                 {"gbps", hold_rate * room_bytes / 1e9},
                                 {"latency_ms", latency_json(w.latency_ms)},
                                 {"cpu_ms_per_room", hold_cpu}}},
                               {"ratio", ref_rate > 0 ? hold_rate / ref_rate : 0.0},
                               {"memory", mem}});
  }
  const double ref_med = quantile(ref_rates, 0.5), hold_med = quantile(hold_rates, 0.5);
  rep.out["reference_rooms_per_s_median"] = ref_med;
  rep.out["hold_rooms_per_s_median"] = hold_med;
  rep.out["ratio_median"] = ref_med > 0 ? hold_med / ref_med : 0.0;
  if (c.repeat > 1)
    rep.text << fmt::format(
        "medians: reference {:.0f} rooms/s, held {:.0f} rooms/s, ratio {:.2f}\n", ref_med, hold_med,
        ref_med > 0 ? hold_med / ref_med : 0.0);

  if (o.sustain_s > 0) {
    // N rooms in flight for sustain_s seconds, the memory sampled as it goes.
    const auto before = sample(daemons);
    nlohmann::json samples = nlohmann::json::array();
    std::vector<std::optional<daemon_memory>> last;
    size_t last_in_flight = 0;
    auto on_sample = [&](double t, size_t in_flight) {
      last = sample(daemons);
      last_in_flight = in_flight;
      nlohmann::json at = {
          {"t_s", t}, {"in_flight", in_flight}, {"daemons", nlohmann::json::array()}};
      for (const auto& m : last) at["daemons"].push_back(to_json(m));
      samples.push_back(std::move(at));
    };
    pipeline_result pr;
    auto next = [&](uint64_t, uint32_t slot) { return room_plan{next_id++, 0, slot, slot}; };
    pipeline_plan plan;
    plan.slots = n;
    plan.send_window = o.sustain_window;
    plan.duration_s = o.sustain_s;
    plan.sample_s = o.sample_s;
    if (auto s = run_pipeline(d, plan, next, on_sample, timeout, pr)) return rep.fail(*s);
    const auto after = sample(daemons);
    tally(pr.first_failure, pr.failed, pr.verified);
    const double rate = pr.transfer_s > 0 ? pr.committed / pr.transfer_s : 0;
    rep.text << fmt::format(
        "sustained: {} rooms open for {:.0f} s, {} of them sent at once: {} committed, {:.0f} "
        "rooms/s ({:.2f} GB/s), p50 {:.1f} ms from send to Success; {:.1f} s of it in this "
        "process's calls that open and send rooms\n",
        n, o.sustain_s, o.sustain_window, pr.committed, rate, rate * room_bytes / 1e9,
        quantile(pr.latency_ms, 0.5), pr.calls_s);
    nlohmann::json mem = nlohmann::json::array();
    for (size_t k = 0; k < daemons.size(); ++k) {
      mem.push_back({{"side", daemons[k].side},
                     {"node", daemons[k].c->daemon().node},
                     {"before", to_json(before[k])},
                     {"at_end", to_json(last[k])},
                     {"after", to_json(after[k])},
                     {"per_room_at_end_kib", per_room(before[k], last[k], last_in_flight)}});
      if (before[k] && last[k])
        rep.text << fmt::format(
            "  {} {}: anonymous {} KiB before, {} KiB at the end with {} rooms open ({:.2f} KiB "
            "per room), {} KiB after they ended; resident {} -> {} KiB\n",
            daemons[k].side, daemons[k].c->daemon().node, before[k]->anon_kib, last[k]->anon_kib,
            last_in_flight,
            last_in_flight
                ? (double(last[k]->anon_kib) - double(before[k]->anon_kib)) / double(last_in_flight)
                : 0.0,
            after[k] ? after[k]->anon_kib : 0, before[k]->rss_kib, last[k]->rss_kib);
    }
    rep.out["sustain"] = {{"seconds", o.sustain_s},
                          {"open", n},
                          {"send_window", o.sustain_window},
                          {"committed", pr.committed},
                          {"failed", pr.failed},
                          {"rooms_per_s", rate},
                          {"gbps", rate * room_bytes / 1e9},
                          {"latency_ms", latency_json(pr.latency_ms)},
                          {"calls_s", pr.calls_s},
                          {"memory", mem},
                          {"samples", samples}};
  }
  rep.out["failed"] = failed;
  rep.out["verified"] = c.verify ? nlohmann::json(verified) : nlohmann::json(nullptr);
  rep.out["first_failure"] = first_failure;
  if (c.verify) rep.text << fmt::format("verified: {} rooms, every destination byte\n", verified);
  if (!first_failure.empty()) rep.text << "first failure: " << first_failure << "\n";
  if (auto s = settle(prefills, c.room_base, next_id, timeout)) return rep.fail(*s);
  return rep.finish(failed == 0 && first_failure.empty());
}

int run(const options& o, const common& c) {
  report rep{c, c.json == "-" ? std::cerr : std::cout};
  if (o.hold > 0 && !o.fan_in_sockets.empty())
    return rep.fail(stop{exit_code::usage, "--hold and --fan-in-socket are separate modes"});
  if (o.hold > 0) return run_hold(o, rep);
  return run_fan_in(o, rep);
}

}  // namespace ferry::bench::scale
