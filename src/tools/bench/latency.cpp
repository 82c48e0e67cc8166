// ferry-bench --latency: one room at a time (concurrency 1), from the decode client's prepare
// sent to its Success event (the prefill's send is issued by this process right after the
// prepare and the subscription), --requests times after each --gap-ms idle gap, and in the same
// run the raw latency reference (raw_fabric.hpp: one TCP control message, the room's writes and
// their notifications with Ferry's wait policy), for the room's writes and as one write of all
// its bytes. The rooms use slot 0 of the closed-loop workload.
#include <fmt/format.h>

#include <thread>

#include "tools/bench/bench.hpp"
#include "tools/bench/raw_fabric.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::bench {
namespace {

/// Untimed rooms before the first gap (connections, first touches), on each side of the
/// comparison and for each raw variant.
constexpr uint32_t warmup_rooms = 2;

/// Where one room's time went, as the bench's thread saw it (ms from the prepare sent).
struct room_phases {
  double opened = 0;  ///< prepare and subscribe answered (one pipelined round trip)
  double sent = 0;    ///< the prefill's send answered
  double done = 0;    ///< Success at every decode rank
};

/// One Ferry room, timed from its prepare to Success on every decode rank; nullopt and the
/// failure counted when it did not succeed; an exit code when the run must stop. The decode
/// client pipelines its prepare and subscription, as an engine would: one round trip.
std::optional<int> ferry_room(context& ctx, std::optional<room_phases>& out) {
  const uint64_t id = ctx.next_room++;
  if (ctx.o.verify)
    for (auto& dc : ctx.decodes)
      if (auto e = client::clear_room(*dc, ctx.plans[0].dst, ctx.state_of(0), ctx.row_of(0)); !e)
        return ctx.fail_on(*dc, e.error(), "clear: ");
  const auto t0 = clock_type::now();
  if (auto rc = ctx.open_rooms({id}, false)) return rc;
  const auto t_open = clock_type::now();
  if (auto rc = ctx.send_room(id, ctx.plans[0].src, 0)) return rc;
  const auto t_sent = clock_type::now();
  bool ok = true;
  for (auto& dc : ctx.decodes) {
    auto e = dc->wait_terminal(id, std::chrono::seconds(120));
    if (!e) return ctx.fail_on(*dc, e.error(), "waiting for Success: ");
    if (e.value.status != room_status::success) {
      ok = false;
      if (ctx.first_failure.empty())
        ctx.first_failure = fmt::format("room {}: {}", id, e.value.reason);
    }
  }
  const auto t1 = clock_type::now();
  out.reset();
  if (ok) out = room_phases{ms_between(t0, t_open), ms_between(t0, t_sent), ms_between(t0, t1)};
  if (ok && ctx.o.verify) ctx.verify_slot(0, id);
  return std::nullopt;
}

/// Per-phase times on each daemon's own clock, from the `timelines` info document of every
/// daemon of one side: for rooms [first, last), the p50 in ms of each milestone from the room's
/// start there (the decode's prepare taken; the prefill room's opening). Null where the daemon
/// does not keep timelines (before 0.6); `text` gets one readable line.
nlohmann::json daemon_phases(std::vector<std::unique_ptr<client::client>>& clients,
                             const char* side, uint64_t first, uint64_t last, std::string& text) {
  std::vector<std::string> marks;
  std::vector<std::vector<double>> ms;
  for (auto& c : clients) {
    auto doc = c->info(proto::info_topic::timelines);
    if (!doc) return nullptr;
    const auto j = nlohmann::json::parse(doc.value, nullptr, false);
    if (j.is_discarded() || !j.contains(side)) return nullptr;
    const auto& s = j.at(side);
    marks = s.at("marks").get<std::vector<std::string>>();
    ms.resize(marks.size());
    for (const auto& row : s.at("rooms")) {
      const auto room = row.at(0).get<uint64_t>();
      if (room < first || room >= last) continue;
      for (size_t i = 0; i < marks.size() && i + 1 < row.size(); ++i)
        if (row.at(i + 1).is_number()) ms[i].push_back(row.at(i + 1).get<double>() / 1000.0);
    }
  }
  nlohmann::json out = nlohmann::json::object();
  text = fmt::format("{} clock, p50 from its start:", side);
  for (size_t i = 1; i < marks.size(); ++i) {  // the first mark is the start itself
    if (ms[i].empty()) continue;
    out[marks[i]] = percentile(ms[i], 0.5);
    text += fmt::format(" {} {:.3f} ms", marks[i], percentile(ms[i], 0.5));
  }
  return out;
}

nlohmann::json with_min(const std::vector<double>& v) {
  auto j = summary(v);
  j["min"] = v.empty() ? nlohmann::json(nullptr) : nlohmann::json(percentile(v, 0));
  return j;
}

}  // namespace

int run_latency(context& ctx) {
  const options& o = ctx.o;
  // The raw reference's room: the same writes, laid out one after the other in its buffers.
  std::vector<raw_write> writes;
  uint64_t offset = 0;
  for (const auto& w : ctx.one) {
    writes.push_back({offset, offset, w.length});
    offset += w.length;
  }
  std::unique_ptr<raw_latency_reference> ref;
  std::string raw_error, raw_provider;
  if (o.baseline) {
    raw_options ro;
    ro.provider = ctx.provider;
    ro.timeout_ms = 120000;
    ref = raw_latency_reference::start(ro, writes, o.window, raw_error);
    if (ref) raw_provider = ref->provider();
    if (!ref) ctx.report() << "raw latency reference failed to start: " << raw_error << "\n";
  }
  ctx.report() << fmt::format(
      "latency: {} rooms of {} tokens one at a time after each idle gap ({} ms), prepare sent -> "
      "Success at the decode client; raw reference: one TCP message + the same {} writes{}\n",
      o.requests, o.prompt_tokens, fmt::join(o.gaps_ms, ", "), writes.size(),
      raw_provider.empty() ? "" : " over " + raw_provider);
  uint32_t committed = 0, failed = 0;
  for (uint32_t i = 0; i < warmup_rooms; ++i) {
    std::optional<room_phases> ph;
    if (auto rc = ferry_room(ctx, ph)) return *rc;
    ++(ph ? committed : failed);
  }
  auto raw_series = [&](bool single, double gap_ms, std::vector<double>& out, nlohmann::json& doc) {
    if (!ref) return;
    const auto gap = std::chrono::microseconds(static_cast<int64_t>(gap_ms * 1000));
    if (auto e = ref->measure(single, gap, warmup_rooms, o.requests, out); !e.empty()) {
      raw_error = e;
      doc[single ? "raw_single_write_error" : "raw_error"] = e;
      ref.reset();  // a failed reference is not used again
    }
  };
  nlohmann::json gaps = nlohmann::json::array();
  for (double gap_ms : o.gaps_ms) {
    std::vector<double> ferry_ms, raw_ms, single_ms, open_ms, send_ms, commit_ms;
    const auto gap = std::chrono::duration<double, std::milli>(gap_ms);
    const uint64_t first_room = ctx.next_room;
    for (uint32_t i = 0; i < o.requests; ++i) {
      if (gap_ms > 0) std::this_thread::sleep_for(gap);
      std::optional<room_phases> ph;
      if (auto rc = ferry_room(ctx, ph)) return *rc;
      if (ph) {
        ++committed;
        ferry_ms.push_back(ph->done);
        open_ms.push_back(ph->opened);
        send_ms.push_back(ph->sent - ph->opened);
        commit_ms.push_back(ph->done - ph->sent);
      } else {
        ++failed;
      }
    }
    nlohmann::json g = {{"gap_ms", gap_ms},
                        {"ferry_ms", with_min(ferry_ms)},
                        {"ferry_phases_ms",
                         {{"prepare_and_subscribe", with_min(open_ms)},
                          {"send", with_min(send_ms)},
                          {"send_answered_to_success", with_min(commit_ms)}}}};
    std::string decode_text, prefill_text;
    g["daemon_phases_ms"] = {
        {"decode", daemon_phases(ctx.decodes, "decode", first_room, ctx.next_room, decode_text)},
        {"prefill",
         daemon_phases(ctx.prefills, "prefill", first_room, ctx.next_room, prefill_text)}};
    raw_series(false, gap_ms, raw_ms, g);
    raw_series(true, gap_ms, single_ms, g);
    g["raw_ms"] = raw_ms.empty() ? nlohmann::json(nullptr) : with_min(raw_ms);
    g["raw_single_write_ms"] = single_ms.empty() ? nlohmann::json(nullptr) : with_min(single_ms);
    const double f50 = percentile(ferry_ms, 0.5);
    auto ratio = [&](const std::vector<double>& raw) {
      const double r50 = percentile(raw, 0.5);
      return raw.empty() || r50 <= 0 || ferry_ms.empty() ? nlohmann::json(nullptr)
                                                         : nlohmann::json(f50 / r50);
    };
    g["ratio_p50"] = ratio(raw_ms);
    g["ratio_p50_single_write"] = ratio(single_ms);
    auto text_of = [](const std::vector<double>& v) {
      return v.empty() ? std::string("-")
                       : fmt::format("p50 {:.3f} ms p99 {:.3f} ms", percentile(v, 0.5),
                                     percentile(v, 0.99));
    };
    auto ratio_text = [](const nlohmann::json& r) {
      return r.is_number() ? fmt::format("{:.2f}", r.get<double>()) : std::string("-");
    };
    ctx.report() << fmt::format(
        "latency, gap {} ms: ferry {}; raw {} writes {}; raw single write {}; ferry / raw p50 = "
        "{} (single write: {})\n",
        gap_ms, text_of(ferry_ms), writes.size(), text_of(raw_ms), text_of(single_ms),
        ratio_text(g["ratio_p50"]), ratio_text(g["ratio_p50_single_write"]));
    if (!ferry_ms.empty())
      ctx.report() << fmt::format(
          "latency, gap {} ms, ferry p50 by phase: prepare+subscribe answered {:.3f} ms, send "
          "answered {:.3f} ms later, Success {:.3f} ms after that\n",
          gap_ms, percentile(open_ms, 0.5), percentile(send_ms, 0.5), percentile(commit_ms, 0.5));
    for (const auto* t : {&decode_text, &prefill_text})
      if (!t->empty()) ctx.report() << fmt::format("latency, gap {} ms, {}\n", gap_ms, *t);
    gaps.push_back(std::move(g));
  }
  if (!raw_error.empty()) ctx.report() << "raw latency reference failed: " << raw_error << "\n";
  if (o.verify)
    ctx.report() << fmt::format("verified: {}/{} rooms, every destination byte\n", ctx.verified,
                                committed);
  if (!ctx.first_failure.empty()) ctx.report() << "first failure: " << ctx.first_failure << "\n";
  ctx.out["latency"] = {
      {"from", "prepare sent by the decode client"},
      {"to", "Success event at the decode client"},
      {"rooms_per_gap", o.requests},
      {"warmup", warmup_rooms},
      {"raw_provider",
       raw_provider.empty() ? nlohmann::json(nullptr) : nlohmann::json(raw_provider)},
      {"raw_writes", writes.size()},
      {"raw_error", raw_error.empty() ? nlohmann::json(nullptr) : nlohmann::json(raw_error)},
      {"gaps", gaps}};
  ctx.out["ferry"] = {{"committed", committed}, {"failed", failed}};
  ctx.out["verified"] = o.verify ? nlohmann::json(ctx.verified) : nlohmann::json(nullptr);
  ctx.out["first_failure"] = ctx.first_failure;
  const bool ok = failed == 0 && (!o.verify || ctx.verified == committed);
  ctx.out["ok"] = ok;
  if (auto rc = ctx.emit_json()) return *rc;
  return ok ? exit_code::ok : exit_code::failed;
}

}  // namespace ferry::bench
