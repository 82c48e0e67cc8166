// ferry-bench --layer-wise T_MS: the time an engine waits for its room after its forward pass,
// sending layer by layer against sending whole.
//
// Per timed pair, one room at a time on the same pages, slot and row:
// - layer-wise: the room is prepared, then its layers (in groups of --layer-group global ids,
//   chunk after chunk) are "produced" one step every T ms and each is sent as it is made, to
//   every prefill rank that holds some of its layers; timed from the last step's send to
//   Success on every decode rank;
// - whole: the same room is prepared, and sent whole at the moment its last layer would have
//   been made (T x (steps - 1) after the start); timed from that send to Success.
// The ratio of the two p50s is what layer-wise streaming saves: with T x steps at least the
// whole room's transfer time, the layers before the last have landed by the end of the pass.

#include "tools/bench/layerwise.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>
#include <variant>

#include "core/status.hpp"
#include "tools/bench/bench.hpp"

namespace ferry::bench {
namespace {

using clock_type = std::chrono::steady_clock;

/// One step of the forward pass: a chunk's group of layers, as each prefill rank sends it
/// ({first, count}; count 0: this rank holds none of the group).
struct step {
  uint32_t chunk = 0;
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
};

std::vector<step> make_steps(const layer_wise_options& o,
                             const std::vector<std::unique_ptr<client::client>>& prefills) {
  std::vector<std::vector<uint32_t>> rank_layers;
  std::vector<uint32_t> all;
  for (const auto& p : prefills) {
    rank_layers.push_back(p->layers());
    all.insert(all.end(), rank_layers.back().begin(), rank_layers.back().end());
  }
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::vector<step> out;
  const uint32_t g = std::max(1u, o.group);
  for (uint32_t k = 0; k < o.chunks.size(); ++k)
    for (size_t i = 0; i < all.size(); i += g) {
      const uint64_t first = all[i];
      const uint64_t end = uint64_t{all[std::min(all.size(), i + g) - 1]} + 1;
      step s;
      s.chunk = k;
      for (const auto& mine : rank_layers) {
        // The group clipped to the rank's own span; empty when it holds none of it.
        const auto lo = std::lower_bound(mine.begin(), mine.end(), first);
        if (lo == mine.end() || *lo >= end) {
          s.ranges.emplace_back(0, 0);
          continue;
        }
        const uint64_t a = std::max<uint64_t>(first, mine.front());
        const uint64_t b = std::min<uint64_t>(end, uint64_t{mine.back()} + 1);
        s.ranges.emplace_back(static_cast<uint32_t>(a), static_cast<uint32_t>(b - a));
      }
      out.push_back(std::move(s));
    }
  return out;
}

}  // namespace

std::optional<int> run_layer_wise(const layer_wise_options& o, layer_wise_env& env) {
  for (const auto& p : env.prefills)
    if (p->version() < 6)
      return env.fail(fmt::format("--layer-wise needs protocol version 6; {} speaks {}",
                                  p->daemon().node, p->version()));
  const auto steps = make_steps(o, env.prefills);
  if (steps.empty()) return env.fail("--layer-wise: the prefill ranks hold no layers");
  const auto period = std::chrono::duration<double, std::milli>(o.t_ms);
  const uint32_t slot = env.has_state ? env.slot : no_index;
  const uint32_t row = env.has_aux ? env.slot : no_index;

  // Chunk k's pages and whether it is the last.
  auto chunk_pages = [&](uint32_t k) {
    uint32_t pos = 0;
    for (uint32_t i = 0; i < k; ++i) pos += o.chunks[i];
    return std::vector<uint32_t>(env.src_pages.begin() + pos,
                                 env.src_pages.begin() + pos + o.chunks[k]);
  };
  // Wait for `room`'s terminal event on every decode rank; the time of the last, or an exit code.
  auto wait_success = [&](uint64_t room) -> std::variant<clock_type::time_point, int> {
    for (auto& d : env.decodes)
      for (bool done = false; !done;) {
        auto e = d->next_event(std::chrono::seconds(120));
        if (!e) return env.fail_on(*d, e.error(), "waiting for commits: ");
        if (e.value.room != room || !is_terminal(e.value.status)) continue;
        if (e.value.status != room_status::success)
          return env.fail(fmt::format("room {}: {}", room, e.value.reason));
        done = true;
      }
    return clock_type::now();
  };
  auto send = [&](client::client& p, const proto::send& s) -> std::optional<int> {
    if (auto r = p.send(s); !r) return env.fail_on(p, r.error(), "send: ");
    return std::nullopt;
  };
  // The room sent whole at `at`, chunk after chunk; Success's time, or an exit code.
  auto send_whole = [&](uint64_t id) -> std::optional<int> {
    for (uint32_t k = 0; k < o.chunks.size(); ++k) {
      const bool last = k + 1 == o.chunks.size();
      for (auto& p : env.prefills)
        if (auto rc =
                send(*p, {id, chunk_pages(k), last, last ? slot : no_index, last ? row : no_index}))
          return rc;
    }
    return std::nullopt;
  };

  // A first room, not timed, connects the daemons and measures the whole room's transfer.
  {
    const uint64_t id = env.next_room++;
    if (auto rc = env.open_room(id)) return rc;
    const auto t = clock_type::now();
    if (auto rc = send_whole(id)) return rc;
    auto end = wait_success(id);
    if (auto* rc = std::get_if<int>(&end)) return *rc;
    env.text << fmt::format(
        "layer-wise: a first room sent whole (not timed) took {:.2f} ms\n",
        std::chrono::duration<double, std::milli>(std::get<clock_type::time_point>(end) - t)
            .count());
  }
  std::vector<double> layered_ms, whole_ms, pass_ms;
  for (uint32_t i = 0; i < o.requests; ++i) {
    // Layer by layer, as the forward pass makes them.
    const uint64_t id = env.next_room++;
    if (auto rc = env.open_room(id)) return rc;
    const auto t0 = clock_type::now();
    clock_type::time_point last_send{};
    for (size_t j = 0; j < steps.size(); ++j) {
      std::this_thread::sleep_until(
          t0 + std::chrono::duration_cast<clock_type::duration>(period * static_cast<double>(j)));
      const auto& s = steps[j];
      const bool last = s.chunk + 1 == o.chunks.size();
      if (j + 1 == steps.size()) last_send = clock_type::now();
      for (size_t r = 0; r < env.prefills.size(); ++r) {
        const auto [first, count] = s.ranges[r];
        if (count == 0) continue;
        if (auto rc =
                send(*env.prefills[r], {id, chunk_pages(s.chunk), last, last ? slot : no_index,
                                        last ? row : no_index, first, count}))
          return rc;
      }
    }
    auto end = wait_success(id);
    if (auto* rc = std::get_if<int>(&end)) return *rc;
    layered_ms.push_back(
        std::chrono::duration<double, std::milli>(std::get<clock_type::time_point>(end) - last_send)
            .count());
    pass_ms.push_back(std::chrono::duration<double, std::milli>(last_send - t0).count());
    if (env.verify) env.verify(id);

    // Whole, sent when the last layer would have been made.
    const uint64_t w = env.next_room++;
    if (auto rc = env.open_room(w)) return rc;
    const auto w0 = clock_type::now();
    std::this_thread::sleep_until(w0 + std::chrono::duration_cast<clock_type::duration>(
                                           period * static_cast<double>(steps.size() - 1)));
    const auto sent = clock_type::now();
    if (auto rc = send_whole(w)) return rc;
    auto wend = wait_success(w);
    if (auto* rc = std::get_if<int>(&wend)) return *rc;
    whole_ms.push_back(
        std::chrono::duration<double, std::milli>(std::get<clock_type::time_point>(wend) - sent)
            .count());
    if (env.verify) env.verify(w);
  }
  const double lw = percentile(layered_ms, 0.5), wh = percentile(whole_ms, 0.5);
  const double ratio = wh > 0 ? lw / wh : 0;
  const double pass = o.t_ms * static_cast<double>(steps.size());
  env.text << fmt::format(
      "layer-wise: {} rooms, {} steps of {} layer(s) every {:.2f} ms over {} chunk(s) (a pass "
      "of {:.1f} ms; measured p50 {:.1f} ms to the last send)\n"
      "  last layer's send -> Success: p50 {:.2f} ms, p99 {:.2f} ms\n"
      "  whole room sent after the last layer, send -> Success: p50 {:.2f} ms, p99 {:.2f} ms\n"
      "  ratio layer-wise / whole (p50s): {:.3f}\n",
      layered_ms.size(), steps.size(), std::max(1u, o.group), o.t_ms, o.chunks.size(), pass,
      percentile(pass_ms, 0.5), lw, percentile(layered_ms, 0.99), wh, percentile(whole_ms, 0.99),
      ratio);
  if (pass < wh)
    env.text << fmt::format(
        "  note: T x steps = {:.1f} ms is below the whole room's transfer time ({:.1f} ms): the "
        "layers cannot all have landed by the end of the pass; raise T_MS\n",
        pass, wh);
  env.out["layer_wise"] = {
      {"t_ms", o.t_ms},
      {"group", std::max(1u, o.group)},
      {"steps", steps.size()},
      {"chunks", o.chunks.size()},
      {"pass_ms", pass},
      {"last_send_to_success_ms",
       {{"p50", lw}, {"p99", percentile(layered_ms, 0.99)}, {"samples", layered_ms.size()}}},
      {"whole_send_to_success_ms",
       {{"p50", wh}, {"p99", percentile(whole_ms, 0.99)}, {"samples", whole_ms.size()}}},
      {"ratio_p50", ratio}};
  return std::nullopt;
}

int run_layer_wise(context& ctx) {
  const options& o = ctx.o;
  layer_wise_env env{
      ctx.prefills,
      ctx.decodes,
      ctx.plans[0].src,
      0,
      ctx.has_state,
      ctx.has_aux,
      [&](uint64_t id) { return ctx.open_room(id, ctx.plans[0].dst, 0, o.verify); },
      o.verify ? std::function<void(uint64_t)>([&](uint64_t id) { ctx.verify_slot(0, id); })
               : std::function<void(uint64_t)>(),
      [&](const client::client& c, const ferry::error& e, const std::string& what) {
        return ctx.fail_on(c, e, what);
      },
      [&](const std::string& m) { return ctx.fail(m); },
      ctx.next_room,
      ctx.report(),
      ctx.out};
  if (auto rc = run_layer_wise({o.layer_wise_ms, o.layer_group, o.requests, ctx.chunks}, env))
    return *rc;
  if (o.verify)  // both rooms of every pair, every destination byte
    ctx.report() << fmt::format("verified: {}/{} rooms\n", ctx.verified, 2 * o.requests);
  if (!ctx.first_failure.empty()) ctx.report() << "first failure: " << ctx.first_failure << "\n";
  const bool ok = ctx.first_failure.empty() && (!o.verify || ctx.verified == 2 * o.requests);
  ctx.out["ok"] = ok;
  ctx.out["verified"] = o.verify ? nlohmann::json(ctx.verified) : nlohmann::json(nullptr);
  ctx.out["first_failure"] = ctx.first_failure;
  if (auto rc = ctx.emit_json()) return *rc;
  return ok ? exit_code::ok : exit_code::failed;
}

}  // namespace ferry::bench
