// ferry-bench --fan-in-socket A,B,...: independent prefill instances feed one decode together;
// their rate against the first of them alone, in the same run (scale.hpp).

#include <fmt/format.h>

#include <algorithm>

#include "core/exit_codes.hpp"
#include "tools/bench/scale_report.hpp"

namespace ferry::bench::scale {

int run_fan_in(const options& o, report& rep) {
  const common& c = rep.c;
  const auto g = static_cast<uint32_t>(o.fan_in_sockets.size());
  std::vector<instance> prefills;
  instance decode;
  if (auto s = connect_independent(prefills, decode, o.fan_in_sockets, c.decode_sockets,
                                   "--fan-in-socket", "fan-in", rep.text))
    return rep.fail(*s);
  std::vector<const instance*> all{&decode};
  std::vector<const instance*> sources;
  for (const auto& p : prefills) all.push_back(&p), sources.push_back(&p);
  const uint32_t conc = c.concurrency, requests = c.requests;
  const uint32_t ppr = pages_per_room(all, c.prompt_tokens);
  if (ppr == 0)
    return rep.fail(stop{exit_code::usage, "the daemons need kv pools of one page_tokens"});
  if (auto s = check_fit(conc, ppr, decode, sources, all)) return rep.fail(*s);
  const uint64_t src_pages = min_items(sources, pool_kind::kv);
  const auto regions = static_cast<uint32_t>(std::min<uint64_t>(conc, src_pages / ppr));
  driver d(prefills, decode, ppr, regions, c.verify);
  auto bytes = d.room_bytes(piece_bytes_of(prefills[0]));
  if (!bytes) return rep.fail(stop{exit_code::failed, bytes.message});
  const auto [room_bytes, room_writes] = bytes.value;
  const std::string provider = provider_of(prefills[0]);
  std::string names;
  for (const auto& p : prefills) names += (names.empty() ? "" : ", ") + p.ranks[0]->daemon().node;
  rep.text << fmt::format(
      "ferry-bench fan-in: {} prefill instance(s) ({}) -> {} over {}; rooms of {} tokens ({} "
      "pages, {} B in {} writes), {} in flight, {} per measurement\n",
      g, names, decode.ranks[0]->daemon().node, provider, c.prompt_tokens, ppr, room_bytes,
      room_writes, conc, requests);
  rep.out = {{"mode", "fan_in"},
             {"provider", provider},
             {"prefills", g},
             {"concurrency", conc},
             {"requests", requests},
             {"per_room",
              {{"tokens", c.prompt_tokens},
               {"pages", ppr},
               {"bytes", room_bytes},
               {"writes", room_writes}}},
             {"runs", nlohmann::json::array()}};
  if (auto s = d.fill(conc)) return rep.fail(*s);

  // CPU per room, summed by side (every prefill instance is "prefill"): on a shared machine
  // the rate follows the CPU all the daemons spend per room.
  std::vector<daemon_ref> daemons;
  for (auto& p : prefills)
    for (auto& r : p.ranks) daemons.push_back({"prefill", r.get()});
  for (auto& r : decode.ranks) daemons.push_back({"decode", r.get()});
  uint64_t next_id = c.room_base;
  uint32_t failed = 0, verified = 0;
  std::string first_failure;
  const auto timeout = std::chrono::seconds(120);
  // `sources` prefills feed the decode: room k comes from prefill k % sources.
  auto measure = [&](uint32_t from, uint64_t rooms, pipeline_result& pr) -> maybe_stop {
    auto next = [&](uint64_t k, uint32_t slot) {
      return room_plan{next_id++, static_cast<uint32_t>(k % from), slot, slot};
    };
    pipeline_plan plan;
    plan.slots = conc;
    plan.max_rooms = rooms;
    if (auto s = run_pipeline(d, plan, next, {}, timeout, pr)) return s;
    failed += pr.failed;
    verified += pr.verified;
    if (first_failure.empty()) first_failure = pr.first_failure;
    return std::nullopt;
  };
  // Every peer connection made (and warm) before anything is timed.
  {
    pipeline_result warm;
    if (auto s = measure(g, std::max<uint64_t>(conc, 4ull * g), warm)) return rep.fail(*s);
  }
  std::vector<double> one_rates, fan_rates;
  for (uint32_t r = 0; r < c.repeat; ++r) {
    pipeline_result one, fan;
    const auto cpu0 = cpu(daemons);
    if (auto s = measure(1, requests, one)) return rep.fail(*s);
    const auto cpu1 = cpu(daemons);
    if (auto s = measure(g, requests, fan)) return rep.fail(*s);
    const auto one_cpu = cpu_per_room(daemons, cpu0, cpu1, one.committed);
    const auto fan_cpu = cpu_per_room(daemons, cpu1, cpu(daemons), fan.committed);
    const double one_rate = one.transfer_s > 0 ? one.committed / one.transfer_s : 0;
    const double fan_rate = fan.transfer_s > 0 ? fan.committed / fan.transfer_s : 0;
    one_rates.push_back(one_rate);
    fan_rates.push_back(fan_rate);
    rep.text << fmt::format(
        "run {}/{}: 1 -> 1 {:.0f} rooms/s ({:.2f} GB/s, p50 {:.1f} ms); {} -> 1 {:.0f} rooms/s "
        "({:.2f} GB/s, p50 {:.1f} ms); ratio {:.2f}\n  cpu per room: 1 -> 1 {}; {} -> 1 {}\n",
        r + 1, c.repeat, one_rate, one_rate * room_bytes / 1e9, quantile(one.latency_ms, 0.5), g,
        fan_rate, fan_rate * room_bytes / 1e9, quantile(fan.latency_ms, 0.5),
        one_rate > 0 ? fan_rate / one_rate : 0.0, cpu_text(one_cpu), g, cpu_text(fan_cpu));
    auto doc = [&](const pipeline_result& pr, double rate, const nlohmann::json& cpu_ms) {
      return nlohmann::json{{"committed", pr.committed},
                            {"transfer_s", pr.transfer_s},
                            {"rooms_per_s", rate},
                            {"gbps", rate * room_bytes / 1e9},
                            {"latency_ms", latency_json(pr.latency_ms)},
                            {"cpu_ms_per_room", cpu_ms}};
    };
    rep.out["runs"].push_back({{"one_to_one", doc(one, one_rate, one_cpu)},
                               {"fan_in", doc(fan, fan_rate, fan_cpu)},
                               {"ratio", one_rate > 0 ? fan_rate / one_rate : 0.0}});
  }
  const double one_med = quantile(one_rates, 0.5), fan_med = quantile(fan_rates, 0.5);
  rep.out["one_to_one_rooms_per_s_median"] = one_med;
  rep.out["fan_in_rooms_per_s_median"] = fan_med;
  rep.out["one_to_one_gbps_median"] = one_med * room_bytes / 1e9;
  rep.out["fan_in_gbps_median"] = fan_med * room_bytes / 1e9;
  rep.out["ratio_median"] = one_med > 0 ? fan_med / one_med : 0.0;
  rep.text << fmt::format(
      "medians: 1 -> 1 {:.0f} rooms/s ({:.2f} GB/s); {} -> 1 {:.0f} rooms/s ({:.2f} GB/s); ratio "
      "{:.2f}\n",
      one_med, one_med * room_bytes / 1e9, g, fan_med, fan_med * room_bytes / 1e9,
      one_med > 0 ? fan_med / one_med : 0.0);
  rep.out["failed"] = failed;
  rep.out["verified"] = c.verify ? nlohmann::json(verified) : nlohmann::json(nullptr);
  rep.out["first_failure"] = first_failure;
  if (!first_failure.empty()) rep.text << "first failure: " << first_failure << "\n";
  if (auto s = settle(prefills, c.room_base, next_id, timeout)) return rep.fail(*s);
  return rep.finish(failed == 0 && first_failure.empty());
}

}  // namespace ferry::bench::scale
