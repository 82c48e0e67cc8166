// What the soak tells: anomalies as they happen, a progress line every --progress-seconds, and at
// the end the daemons' own status next to this run's tallies, then the whole run in one SOAK line.

#include <fmt/format.h>
#include <poll.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "tools/soak/soak.hpp"

namespace ferry::soak {

using namespace std::chrono_literals;

namespace {

/// A counter of a daemon's status document (docs/protocol.md, "Info documents") at `pointer`,
/// e.g. "/decode/active"; -1 when absent.
int64_t counter(const nlohmann::json& status, const std::string& pointer) {
  const nlohmann::json::json_pointer at(pointer);
  return status.is_object() && status.contains(at) && status[at].is_number_integer()
             ? status[at].get<int64_t>()
             : -1;
}

}  // namespace

void soak::anomaly(const std::string& what) {
  ++anomalies_;
  if (anomalies_ <= 20) std::cout << "anomaly: " << what << std::endl;
}

void soak::progress(clock_type::time_point now) {
  const double t = std::chrono::duration<double>(now - t0_).count();
  const double dt = std::chrono::duration<double>(now - last_progress_).count();
  // The decode's count of writes that arrived for a room already ended (docs/reliability.md 3).
  std::string stray = "?";
  if (sides_[decode].up) {
    if (auto st = sides_[decode].c->info(proto::info_topic::status))
      stray =
          std::to_string(counter(nlohmann::json::parse(st.value, nullptr, false), "/stray_writes"));
    else
      conn_error(decode, st.code, st.message);
  }
  fmt::print(
      "[{:7.1f}s] started={} success={} cancelled={} peer_failed={} restarted={} timed_out={} "
      "other={} lost={} corrupted={} in_flight={} rate={:.0f}/s (last {:.0f}/s) "
      "decode_stray_writes={}\n",
      t, started_, outcome_[k_success], outcome_[k_cancelled], outcome_[k_peer_failed],
      outcome_[k_restarted], outcome_[k_timed_out], outcome_[k_other], outcome_[k_lost], corrupted_,
      rooms_.size(), t > 0 ? started_ / t : 0.0, dt > 0 ? (started_ - last_started_) / dt : 0.0,
      stray);
  std::fflush(stdout);
  last_started_ = started_;
  last_progress_ = now;
}

/// Read a daemon's status until it shows no active room and no staging in use (bounded: the
/// staging is given back after the terminal event, and nothing announces it).
std::string soak::final_status(side_id s, nlohmann::json& status) {
  auto& d = sides_[s];
  const auto until = clock_type::now() + 10s;
  for (;;) {
    if (!d.up) return "not connected";
    auto st = d.c->info(proto::info_topic::status);
    if (!st) {
      conn_error(s, st.code, st.message);
      return "status failed: " + st.message;
    }
    status = nlohmann::json::parse(st.value, nullptr, false);
    if (!status.is_object()) return "status is not a JSON document: " + st.value.substr(0, 200);
    const auto active = counter(status, "/prefill/active") + counter(status, "/decode/active");
    if ((active == 0 && counter(status, "/staging/in_use") <= 0) || clock_type::now() > until)
      return "";
    pollfd p{d.c->native_handle(), POLLIN, 0};
    ::poll(&p, 1, 100);  // bounded re-read: no event announces the staging release
    drain_events(s);
  }
}

/// Print the summary and the SOAK line; true when nothing was lost, corrupted or leaked.
bool soak::summary(double run_s, double drain_s) {
  auto& P = sides_[prefill];
  auto& D = sides_[decode];
  // --- the daemons after the drain ---
  nlohmann::json status[2];
  std::string err[2];
  for (auto s : {prefill, decode}) err[s] = final_status(s, status[s]);
  auto field = [&](side_id s, const std::string& pointer) {
    return err[s].empty() ? counter(status[s], pointer) : -1;
  };
  // A side's own room counters: "/prefill/active" on the prefill, "/decode/..." on the decode.
  auto own = [&](side_id s, const char* counter_name) {
    return field(s, fmt::format("/{}/{}", side_names[s], counter_name));
  };
  const int64_t stray = field(decode, "/stray_writes");
  const int64_t p_active = own(prefill, "active");
  const int64_t d_active = own(decode, "active");
  const int64_t staging =
      std::max(field(prefill, "/staging/in_use"), field(decode, "/staging/in_use"));

  uint64_t lost = outcome_[k_lost];
  std::cout << "\nferry-soak summary\n";
  fmt::print("  duration          {:.1f} s of starts, then {:.1f} s to drain\n", run_s,
             std::max(0.0, drain_s));
  fmt::print("  rooms started     {} ({:.1f}/s achieved, target {}/s); {} prepares refused\n",
             started_, run_s > 0 ? started_ / run_s : 0.0, o_.rate, prepare_refused_);
  fmt::print("  outcome by kind   ");
  for (int k = 0; k < kind_count; ++k)
    fmt::print("{}{}={}", k ? " " : "", kind_names[k], outcome_[k]);
  fmt::print("\n  lost              {}\n", lost);
  fmt::print("  corrupted         {} ({} Success rooms verified byte-exact)\n", corrupted_,
             verified_);
  for (auto s : {decode, prefill}) {
    fmt::print("  {:<8} side     ", side_names[s]);
    for (int k = 0; k < kind_count; ++k)
      fmt::print("{}{}={}", k ? " " : "", kind_names[k], side_kind_[s][k]);
    fmt::print("\n");
  }
  fmt::print(
      "  late lookups      {} rooms failed on the decode before the prefill showed them: the "
      "prefill did not know {}, had already ended {} (not counted per side: may be an earlier "
      "incarnation's status), was followed to its end for {}\n",
      late_[0] + late_[1] + late_[2], late_[0], late_[1], late_[2]);
  fmt::print("  cancels           accepted={} too_late={} unknown_room={} refused={}\n",
             cancels_[0], cancels_[1], cancels_[2], cancels_[3]);
  fmt::print("  sends             {} ({} refused because the room had already failed)\n", sends_,
             sends_after_failure_);
  fmt::print(
      "  restarts seen     prefill {} (instances {}), decode {} (instances {}); rooms "
      "failed by restart: prefill side {}, decode side {}\n",
      P.reconnects, P.instances, D.reconnects, D.instances, disconnect_rooms_[prefill],
      disconnect_rooms_[decode]);
  fmt::print("  room ids          {} in the pool, {} quarantined (lost rooms)\n", ids_.capacity(),
             quarantined_ids_);
  fmt::print("  anomalies         {}\n", anomalies_);
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print("  ferry-soak cpu    {:.1f} s user + {:.1f} s system\n",
             ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6,
             ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6);
  for (auto s : {prefill, decode}) {
    if (!err[s].empty()) {
      fmt::print("  {} status     unavailable: {}\n", side_names[s], err[s]);
      continue;
    }
    fmt::print(
        "  {:<8} status  instance {} rooms_active={} succeeded={} failed={} stray_writes={} "
        "staging_in_use={}\n",
        side_names[s], sides_[s].instance, own(s, "active"), own(s, "succeeded"), own(s, "failed"),
        field(s, "/stray_writes"), field(s, "/staging/in_use"));
  }
  if (D.instances == 1 && err[decode].empty()) {
    const int64_t daemon_total = own(decode, "succeeded") + own(decode, "failed");
    fmt::print("  decode cross-check: the daemon ended {} rooms, this run prepared {} ({})\n",
               daemon_total, started_,
               daemon_total == static_cast<int64_t>(started_) ? "equal" : "DIFFERENT");
  }
  std::vector<std::pair<uint64_t, std::string>> top;
  for (const auto& [r, n] : reasons_) top.emplace_back(n, r);
  std::sort(top.rbegin(), top.rend());
  fmt::print("  failure reasons   {} distinct (numbers as #, instance ids as <inst>){}\n",
             top.size(), top.size() > 25 ? "; the 25 most frequent:" : ":");
  for (size_t i = 0; i < top.size() && i < 25; ++i)
    fmt::print("    {:>8}  {}\n", top[i].first, top[i].second);
  if (!evidence_.empty()) {
    std::cout << "  evidence:\n";
    for (const auto& e : evidence_) std::cout << "    " << e << "\n";
  }
  const bool leak = p_active != 0 || d_active != 0 || staging > 0;
  fmt::print(
      "SOAK seconds={:.0f} started={} rate={:.1f} success={} cancelled={} peer_failed={} "
      "restarted={} timed_out={} other={} lost={} corrupted={} verified={} stray_writes={} "
      "prefill_active={} decode_active={} staging_in_use={} anomalies={} prefill_instances={} "
      "seed={}\n",
      run_s, started_, run_s > 0 ? started_ / run_s : 0.0, outcome_[k_success],
      outcome_[k_cancelled], outcome_[k_peer_failed], outcome_[k_restarted], outcome_[k_timed_out],
      outcome_[k_other], lost, corrupted_, verified_, stray, p_active, d_active, staging,
      anomalies_, P.instances, o_.seed);
  std::fflush(stdout);
  return !(lost || corrupted_ || leak);
}

}  // namespace ferry::soak
