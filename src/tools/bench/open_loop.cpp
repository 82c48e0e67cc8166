// ferry-bench --open-loop RATE: Poisson arrivals of rooms of mixed sizes (--mix), each prepared
// and sent at its arrival time whatever the rooms before it are doing, for --duration-s seconds
// (or --requests arrivals). A room's latency runs from its arrival (the scheduled instant, so a
// bench that falls behind is counted, not hidden) to Success on every decode rank. Pages come
// from an allocator over each side's kv pool, state slots and aux rows from another; an arrival
// that finds none free is refused and counted, never waited for.
#include <fmt/format.h>
#include <poll.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <map>

#include "tools/bench/bench.hpp"
#include "tools/bench/open_loop_plan.hpp"
#include "tools/workload/daemon_config.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::bench {
namespace {

/// After the last arrival, rooms still in flight must end within this.
constexpr auto drain_limit = std::chrono::seconds(120);
/// At most this many due arrivals are started before the events are read again.
constexpr int arrivals_per_turn = 64;

struct klass {
  mix_class mix;
  uint32_t pages = 0;
  uint64_t bytes = 0;   ///< per room, every link
  uint64_t writes = 0;  ///< per room, every link
  uint64_t arrivals = 0, started = 0, refused_no_pages = 0, refused_no_slot = 0;
  uint64_t committed = 0, failed = 0;
  std::vector<double> latency_ms;
  std::vector<double> issue_ms;  ///< the bench's prepare, subscribe and send calls
};

struct live_room {
  size_t k = 0;
  std::vector<uint32_t> src, dst;
  uint32_t slot = 0;
  clock_type::time_point arrival;
  std::vector<bool> done_on;  ///< per decode rank
  uint32_t pending = 0;
  bool ok = true;
};

class open_loop {
 public:
  explicit open_loop(context& ctx) : ctx_(ctx), o_(ctx.o) {}
  int run();

 private:
  std::optional<int> setup();
  /// Start the arrival of class `k` due at `due`, or count why it could not start.
  std::optional<int> arrive(size_t k, clock_type::time_point due);
  /// One event from decode rank `rank`.
  std::optional<int> on_event(size_t rank, const proto::event& e);
  /// Every event already read or readable now; waits up to `wait` for the next one.
  std::optional<int> pump(std::chrono::nanoseconds wait);
  void report();

  context& ctx_;
  const options& o_;
  std::vector<klass> classes_;
  std::optional<page_allocator> src_pages_, dst_pages_;
  std::optional<index_allocator> slots_;
  uint32_t slot_count_ = 0;
  std::map<uint64_t, live_room> live_;
  std::vector<double> lag_ms_;
  uint64_t arrivals_ = 0, late_ = 0, fragmented_ = 0;
  size_t in_flight_max_ = 0, in_flight_at_end_ = 0;
  clock_type::time_point first_arrival_{}, last_arrival_{}, last_end_{};
};

std::optional<int> open_loop::setup() {
  auto mix = parse_mix(o_.mix);
  if (!mix) return ctx_.fail(mix.message, exit_code::usage);
  // Rooms in flight at once: the state slots and aux rows, and each side's admission bound.
  uint64_t bound = std::min(ctx_.slots, ctx_.rows);
  for (auto* side : {&ctx_.prefills, &ctx_.decodes})
    for (const auto& c : *side)
      bound = std::min<uint64_t>(bound, client::daemon_config(*c)->limits.max_active_rooms);
  slot_count_ = static_cast<uint32_t>(std::min<uint64_t>(bound, 1u << 20));
  for (const auto& m : mix.value) {
    klass k;
    k.mix = m;
    k.pages = (m.tokens + ctx_.page_tokens - 1) / ctx_.page_tokens;
    if (k.pages > ctx_.pool_pages)
      return ctx_.fail(
          fmt::format("--mix: a room of {} tokens needs {} kv pages, the kv pools hold {}: start "
                      "the pair with more pools.kv.pages (scripts/bench.sh: KV_TOKENS)",
                      m.tokens, k.pages, ctx_.pool_pages),
          exit_code::usage);
    std::vector<uint32_t> pages(k.pages);
    for (uint32_t i = 0; i < k.pages; ++i) pages[i] = i;
    auto writes = ctx_.plan_room(pages, pages);
    if (!writes) return ctx_.fail(writes.message);
    k.writes = writes.value.size();
    for (const auto& w : writes.value) k.bytes += w.length;
    classes_.push_back(std::move(k));
  }
  const auto pool = static_cast<uint32_t>(std::min<uint64_t>(ctx_.pool_pages, ~0u));
  src_pages_.emplace(0, pool);
  dst_pages_.emplace(0, pool);
  slots_.emplace(slot_count_);
  return std::nullopt;
}

std::optional<int> open_loop::arrive(size_t k, clock_type::time_point due) {
  klass& c = classes_[k];
  ++c.arrivals;
  ++arrivals_;
  if (arrivals_ == 1) first_arrival_ = due;
  last_arrival_ = due;
  auto slot = slots_->take();
  if (!slot) {
    ++c.refused_no_slot;
    return std::nullopt;
  }
  bool frag_src = false, frag_dst = false;
  auto src = src_pages_->allocate(c.pages, &frag_src);
  auto dst = src ? dst_pages_->allocate(c.pages, &frag_dst) : std::nullopt;
  if (!src || !dst) {
    if (src) src_pages_->release(*src);
    slots_->give(*slot);
    ++c.refused_no_pages;
    return std::nullopt;
  }
  fragmented_ += (frag_src ? 1 : 0) + (frag_dst ? 1 : 0);
  const auto start = clock_type::now();
  const double lag = ms_between(due, start);
  lag_ms_.push_back(lag);
  if (lag > o_.max_lag_ms) ++late_;
  const uint64_t id = ctx_.next_room++;
  if (o_.verify)  // each room its own pattern, filled when it arrives (inside the timing)
    for (auto& pc : ctx_.prefills) {
      if (auto e = client::fill_kv(*pc, id, *src, 0); !e)
        return ctx_.fail_on(*pc, e.error(), "fill: ");
      if (auto e =
              client::fill_state_and_aux(*pc, id, ctx_.state_of(*slot), ctx_.row_of(*slot), id);
          !e)
        return ctx_.fail_on(*pc, e.error(), "fill: ");
    }
  if (auto rc = ctx_.open_room(id, *dst, *slot, o_.verify)) return rc;
  if (auto rc = ctx_.send_room(id, *src, *slot)) return rc;
  c.issue_ms.push_back(ms_between(start, clock_type::now()));
  ++c.started;
  live_room& l = live_[id];
  l.k = k;
  l.src = std::move(*src);
  l.dst = std::move(*dst);
  l.slot = *slot;
  l.arrival = due;
  l.done_on.assign(ctx_.decodes.size(), false);
  l.pending = static_cast<uint32_t>(ctx_.decodes.size());
  in_flight_max_ = std::max(in_flight_max_, live_.size());
  return std::nullopt;
}

std::optional<int> open_loop::on_event(size_t rank, const proto::event& e) {
  if (!is_terminal(e.status)) return std::nullopt;
  auto it = live_.find(e.room);
  if (it == live_.end() || it->second.done_on[rank]) return std::nullopt;
  live_room& l = it->second;
  l.done_on[rank] = true;
  if (e.status != room_status::success) {
    l.ok = false;
    if (ctx_.first_failure.empty())
      ctx_.first_failure = fmt::format("room {}: {}", e.room, e.reason);
  }
  if (--l.pending > 0) return std::nullopt;
  const auto end = clock_type::now();
  klass& c = classes_[l.k];
  if (l.ok) {
    ++c.committed;
    c.latency_ms.push_back(ms_between(l.arrival, end));
    last_end_ = std::max(last_end_, end);
    if (o_.verify) ctx_.verify_room(e.room, e.room, l.dst, l.slot);
  } else {
    ++c.failed;
  }
  // A terminal room's memory may be reused: its pages, slot and row go back.
  if (!src_pages_->release(l.src) || !dst_pages_->release(l.dst) || !slots_->give(l.slot))
    return ctx_.fail(fmt::format("internal: room {}'s pages or slot were freed twice", e.room));
  live_.erase(it);
  return std::nullopt;
}

std::optional<int> open_loop::pump(std::chrono::nanoseconds wait) {
  // Events already read (they come with replies too), then what the sockets hold.
  for (size_t r = 0; r < ctx_.decodes.size(); ++r)
    for (int guard = 0; guard < 100000; ++guard) {
      auto e = ctx_.decodes[r]->next_event(std::chrono::milliseconds(0));
      if (!e) {
        if (ctx_.decodes[r]->lost())
          return ctx_.fail_on(*ctx_.decodes[r], e.error(), "waiting for commits: ");
        break;
      }
      if (auto rc = on_event(r, e.value)) return rc;
    }
  std::vector<pollfd> fds;
  for (const auto& d : ctx_.decodes) fds.push_back({d->native_handle(), POLLIN, 0});
  wait = std::max<std::chrono::nanoseconds>(wait, std::chrono::nanoseconds(0));
  timespec ts{static_cast<time_t>(wait.count() / 1000000000),
              static_cast<long>(wait.count() % 1000000000)};
  if (::ppoll(fds.data(), fds.size(), &ts, nullptr) <= 0) return std::nullopt;
  for (size_t r = 0; r < fds.size(); ++r) {
    if ((fds[r].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    // Readable: a frame is there or arriving; a partial one is waited for briefly. (The client
    // counts its wait in whole milliseconds: 1 ms would round down to no read at all.)
    auto e = ctx_.decodes[r]->next_event(std::chrono::milliseconds(10));
    if (!e) {
      if (ctx_.decodes[r]->lost())
        return ctx_.fail_on(*ctx_.decodes[r], e.error(), "waiting for commits: ");
      continue;
    }
    if (auto rc = on_event(r, e.value)) return rc;
  }
  return std::nullopt;
}

int open_loop::run() {
  if (auto rc = setup()) return *rc;
  std::string mix_text;
  for (const auto& c : classes_)
    mix_text +=
        fmt::format("{}{} tokens ({:.3g}, {:.1f} MiB in {} writes)", mix_text.empty() ? "" : ", ",
                    c.mix.tokens, c.mix.fraction, c.bytes / 1048576.0, c.writes);
  ctx_.report() << fmt::format(
      "open loop: {} rooms/s offered for {} s{}; mix {}; {} slots, {} kv pages per side{}\n",
      o_.open_loop_rate, o_.duration_s,
      o_.requests_given ? fmt::format(" or {} arrivals", o_.requests) : "", mix_text, slot_count_,
      ctx_.pool_pages, o_.verify ? "; every room verified" : "");
  std::vector<mix_class> mix;
  for (const auto& c : classes_) mix.push_back(c.mix);
  arrival_schedule schedule(o_.open_loop_rate, mix, o_.seed);
  const uint64_t max_arrivals = o_.requests_given ? o_.requests : ~0ull;
  const auto start = clock_type::now();
  const auto end_of_arrivals = start + std::chrono::duration_cast<clock_type::duration>(
                                           std::chrono::duration<double>(o_.duration_s));
  auto at = [&](double s) {
    return start +
           std::chrono::duration_cast<clock_type::duration>(std::chrono::duration<double>(s));
  };
  auto next = schedule.next();
  bool arriving = arrivals_ < max_arrivals && at(next.at_s) <= end_of_arrivals;
  std::optional<clock_type::time_point> drain_deadline;
  auto last_note = start;
  while (arriving || !live_.empty()) {
    int started_now = 0;
    while (arriving && at(next.at_s) <= clock_type::now() && started_now++ < arrivals_per_turn) {
      if (auto rc = arrive(next.klass, at(next.at_s))) return *rc;
      next = schedule.next();
      arriving = arrivals_ < max_arrivals && at(next.at_s) <= end_of_arrivals;
    }
    const auto now = clock_type::now();
    if (!arriving && !drain_deadline) {
      drain_deadline = now + drain_limit;
      in_flight_at_end_ = live_.size();
    }
    if (drain_deadline && now > *drain_deadline)
      return ctx_.fail(fmt::format("{} rooms still in flight {} s after the last arrival",
                                   live_.size(), drain_limit.count()),
                       exit_code::timed_out);
    if (now - last_note > std::chrono::seconds(2)) {
      std::cerr << fmt::format("  ... {} arrivals, {} in flight\n", arrivals_, live_.size());
      last_note = now;
    }
    const auto wait =
        arriving ? at(next.at_s) - now : clock_type::duration(std::chrono::milliseconds(100));
    if (auto rc = pump(wait)) return *rc;
  }
  report();
  uint64_t failed = 0, committed = 0;
  for (const auto& c : classes_) failed += c.failed, committed += c.committed;
  const bool ok = failed == 0 && (!o_.verify || ctx_.verified == committed);
  ctx_.out["ok"] = ok;
  if (auto rc = ctx_.emit_json()) return *rc;
  return ok ? exit_code::ok : exit_code::failed;
}

void open_loop::report() {
  uint64_t started = 0, committed = 0, failed = 0, no_pages = 0, no_slot = 0, bytes = 0;
  nlohmann::json classes = nlohmann::json::array();
  for (const auto& c : classes_) {
    started += c.started;
    committed += c.committed;
    failed += c.failed;
    no_pages += c.refused_no_pages;
    no_slot += c.refused_no_slot;
    bytes += c.committed * c.bytes;
    const auto lat = summary(c.latency_ms);
    ctx_.report() << fmt::format(
        "  {:>6} tokens: {} arrivals, {} started, {} committed, {} failed, refused {} (no pages) "
        "+ {} (no slot); latency p50 {:.2f} ms p99 {:.2f} ms max {:.2f} ms; prepare + send "
        "calls p50 {:.2f} ms max {:.2f} ms\n",
        c.mix.tokens, c.arrivals, c.started, c.committed, c.failed, c.refused_no_pages,
        c.refused_no_slot, percentile(c.latency_ms, 0.5), percentile(c.latency_ms, 0.99),
        percentile(c.latency_ms, 1), percentile(c.issue_ms, 0.5), percentile(c.issue_ms, 1));
    classes.push_back({{"tokens", c.mix.tokens},
                       {"fraction", c.mix.fraction},
                       {"pages", c.pages},
                       {"bytes_per_room", c.bytes},
                       {"writes_per_room", c.writes},
                       {"arrivals", c.arrivals},
                       {"started", c.started},
                       {"refused_no_pages", c.refused_no_pages},
                       {"refused_no_slot", c.refused_no_slot},
                       {"committed", c.committed},
                       {"failed", c.failed},
                       {"latency_ms", lat},
                       {"issue_ms", summary(c.issue_ms)}});
  }
  const double arrival_s =
      arrivals_ > 1 ? std::chrono::duration<double>(last_arrival_ - first_arrival_).count() : 0;
  const double window_s =
      committed > 0 ? std::chrono::duration<double>(last_end_ - first_arrival_).count() : 0;
  const double offered = arrival_s > 0 ? (arrivals_ - 1) / arrival_s : 0;
  const double achieved = window_s > 0 ? committed / window_s : 0;
  const double gbps = window_s > 0 ? bytes / window_s / 1e9 : 0;
  const uint64_t refused = no_pages + no_slot;
  // Sustained: every arrival started, none failed, and the bench kept up (its own synchronous
  // calls delayed at most 1 % of the starts by more than --max-lag-ms).
  const bool sustained =
      arrivals_ > 0 && refused == 0 && failed == 0 && percentile(lag_ms_, 0.99) <= o_.max_lag_ms;
  const double drain_s = committed > 0 && last_end_ > last_arrival_
                             ? std::chrono::duration<double>(last_end_ - last_arrival_).count()
                             : 0;
  ctx_.report() << fmt::format(
      "open loop: {} arrivals in {:.2f} s ({:.1f} rooms/s offered), {} started, {} committed, "
      "{} failed, {} refused; achieved {:.1f} rooms/s, {:.2f} GB/s; start lag p50 {:.3f} ms p99 "
      "{:.3f} ms, {} later than {} ms; in flight max {}, {} at the last arrival, drained in "
      "{:.3f} s; {}\n",
      arrivals_, arrival_s, offered, started, committed, failed, refused, achieved, gbps,
      percentile(lag_ms_, 0.5), percentile(lag_ms_, 0.99), late_, o_.max_lag_ms, in_flight_max_,
      in_flight_at_end_, drain_s,
      sustained ? "the offered load was sustained"
                : "the offered load was NOT sustained (refusals, failures or start lag p99 over "
                  "--max-lag-ms)");
  if (o_.verify)
    ctx_.report() << fmt::format("verified: {}/{} rooms, every destination byte\n", ctx_.verified,
                                 committed);
  if (!ctx_.first_failure.empty()) ctx_.report() << "first failure: " << ctx_.first_failure << "\n";
  ctx_.out["open_loop"] = {
      {"rate", o_.open_loop_rate},
      {"mix", o_.mix},
      {"seed", o_.seed},
      {"duration_s", o_.duration_s},
      {"max_arrivals", o_.requests_given ? nlohmann::json(o_.requests) : nlohmann::json(nullptr)},
      {"slots", slot_count_},
      {"kv_pages", ctx_.pool_pages},
      {"arrivals", arrivals_},
      {"arrival_s", arrival_s},
      {"offered_rooms_per_s", offered},
      {"started", started},
      {"committed", committed},
      {"failed", failed},
      {"refused", {{"no_pages", no_pages}, {"no_slot", no_slot}}},
      {"verified", o_.verify ? nlohmann::json(ctx_.verified) : nlohmann::json(nullptr)},
      {"achieved_rooms_per_s", achieved},
      {"gbps", gbps},
      {"bytes", bytes},
      {"window_s", window_s},
      {"start_lag_ms", summary(lag_ms_)},
      {"late_starts", late_},
      {"max_lag_ms", o_.max_lag_ms},
      {"fragmented_allocations", fragmented_},
      {"in_flight_max", in_flight_max_},
      {"in_flight_at_last_arrival", in_flight_at_end_},
      {"drain_s", drain_s},
      {"sustained", sustained},
      {"classes", classes}};
  ctx_.out["first_failure"] = ctx_.first_failure;
}

}  // namespace

int run_open_loop(context& ctx) { return open_loop(ctx).run(); }

}  // namespace ferry::bench
