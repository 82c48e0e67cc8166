// ferry-bench --rolling: rooms over several independent prefill instances, a room refused by a
// draining (or gone) prefill sent again to another, every room's outcome counted; --pause-after
// holds a room on each instance while a daemon is drained (rolling.hpp).

#include "tools/bench/rolling.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include "core/exit_codes.hpp"
#include "tools/bench/bench.hpp"
#include "tools/bench/scale_report.hpp"
#include "tools/workload/workload.hpp"

namespace ferry::bench::rolling {

void add_options(CLI::App& app, options& o) {
  app.add_flag("--rolling", o.on,
               "rolling restart rehearsal: every --prefill-socket is an independent prefill "
               "instance; rooms go to them in turn, and a room refused with 407 (its prefill "
               "drains) or whose prefill has gone is sent again to the next one; every room's "
               "outcome is counted, and no room a draining daemon accepted is cancelled");
  app.add_option("--pause-after", o.pause_after,
                 "--rolling: once this many requests ended, hold one room prepared and accepted "
                 "on every prefill instance, say 'ferry-bench: paused' on stderr and go on at a "
                 "line on stdin (the moment to drain a daemon)")
      ->check(CLI::PositiveNumber);
}

namespace {

using scale::instance;
using scale::maybe_stop;
using scale::stop;
using scale::stop_on;
using clock_type = std::chrono::steady_clock;

/// What one prefill instance did in the run.
struct target {
  std::string socket;
  bool draining = false;  ///< it refused a room with 407: no new room goes to it
  bool gone = false;      ///< its connection closed (it exited): no new room goes to it
  uint32_t committed = 0, refused = 0;
  std::vector<uint64_t> accepted;  ///< rooms whose send it answered
};

/// One attempt at a request: one room.
struct attempt {
  uint64_t id = 0;
  uint32_t target = 0, slot = 0;
  std::vector<bool> ready_on, done_on;  ///< per decode rank: WaitingForInput or beyond; ended
  std::vector<bool> prepared_on;        ///< per decode rank: it took the prepare
  bool sent = false, ok = true, retry = false;
  errc code = errc::ok;
  std::string reason;
  clock_type::time_point started, finished;
};

std::string code_key(errc e) { return std::to_string(static_cast<int>(e)); }

struct rehearsal {
  rehearsal(const options& o_, const scale::common& c_, std::vector<instance>& p, instance& d,
            scale::driver& dr)
      : o(o_), c(c_), prefills(p), decode(d), drv(dr) {}

  const options& o;
  const scale::common& c;
  std::vector<instance>& prefills;
  instance& decode;
  scale::driver& drv;
  std::vector<target> targets;
  bool state = false, aux = false;
  std::chrono::seconds timeout{120};

  std::map<uint64_t, attempt> live;  // by id: the first is the oldest
  std::vector<uint32_t> free_slots;
  std::vector<uint64_t> held;  // prepared at the pause, sent once the bench goes on
  uint64_t next_id = 0;
  uint32_t rr = 0;  // the next instance in turn
  uint32_t begun = 0, ended = 0, again = 0;
  uint32_t committed = 0, failed = 0, verified = 0, retried = 0, attempts = 0;
  std::map<std::string, uint32_t> failed_by, retried_by;
  std::vector<double> latency_ms;
  std::string first_failure, first_refusal;
  bool pausing = false, paused = false;
  std::optional<clock_type::time_point> first_send;
  clock_type::time_point last_end{};

  bool usable(uint32_t j) const { return !targets[j].draining && !targets[j].gone; }
  std::optional<uint32_t> pick() {
    for (uint32_t i = 0; i < targets.size(); ++i) {
      const auto j = static_cast<uint32_t>((rr + i) % targets.size());
      if (usable(j)) {
        rr = j + 1;
        return j;
      }
    }
    return std::nullopt;
  }
  void fail_request(errc code, const std::string& why) {
    ++ended;
    ++failed;
    ++failed_by[code_key(code)];
    if (first_failure.empty()) first_failure = why;
  }
  client::client* lost_rank(instance& in) {
    for (auto& r : in.ranks)
      if (r->lost()) return r.get();
    return nullptr;
  }

  /// The room's decode side: its id in the source aux row (ferryd checks it on send), on every
  /// decode rank its destination cleared (with --verify), prepared naming its prefill, and
  /// subscribed to.
  result<none> open(attempt& a) {
    if (aux)
      for (auto& r : prefills[a.target].ranks)
        std::memcpy(r->item(pool_kind::aux, 0, a.slot), &a.id, sizeof a.id);
    const auto dst = drv.dst_pages(a.slot);
    const uint32_t slot = state ? a.slot : no_index, row = aux ? a.slot : no_index;
    for (auto& dc : decode.ranks) {
      if (c.verify)
        if (auto e = client::clear_room(*dc, dst, slot, row); !e) return e;
      if (auto e = dc->prepare({a.id, prefills[a.target].controls, dst, slot, row}); !e) return e;
      a.prepared_on[&dc - decode.ranks.data()] = true;
      if (auto e = dc->subscribe(a.id); !e) return e;
    }
    return none{};
  }

  /// Send the attempt from every rank of its prefill; a refusal by a draining or gone prefill
  /// marks it for a retry (its decode room cancelled: no send will come for it).
  maybe_stop send(attempt& a) {
    target& t = targets[a.target];
    const auto src = drv.src_pages(a.slot);
    const uint32_t slot = state ? a.slot : no_index, row = aux ? a.slot : no_index;
    a.started = clock_type::now();
    if (!first_send) first_send = a.started;
    for (auto& r : prefills[a.target].ranks) {
      auto e = r->send({a.id, src, true, slot, row});
      if (e) continue;
      const bool gone = r->lost();
      if (e.code != errc::draining && !gone) return stop_on(*r, e.error(), "send: ");
      (gone ? t.gone : t.draining) = true;
      ++t.refused;
      a.retry = true;
      a.code = gone ? errc::peer_lost : errc::draining;
      a.reason = e.message;
      for (auto& dc : decode.ranks)
        if (auto x = dc->cancel(a.id); !x && dc->lost()) return stop_on(*dc, x.error(), "cancel: ");
      return std::nullopt;
    }
    a.sent = true;
    t.accepted.push_back(a.id);
    return std::nullopt;
  }

  /// Begin the next request (or the next retry) as a room; sent at once unless `hold`.
  maybe_stop start(bool hold) {
    if (again > 0)
      --again;
    else
      ++begun;
    const auto j = pick();
    if (!j) {
      fail_request(errc::draining, "no prefill instance takes rooms: every one drains or left");
      return std::nullopt;
    }
    attempt a;
    a.id = next_id++;
    a.target = *j;
    a.slot = free_slots.back();
    free_slots.pop_back();
    a.ready_on.assign(decode.ranks.size(), false);
    a.done_on.assign(decode.ranks.size(), false);
    a.prepared_on.assign(decode.ranks.size(), false);
    ++attempts;
    if (auto e = open(a); !e) {
      if (auto* lost = lost_rank(decode)) return stop_on(*lost, e.error(), "prepare: ");
      if (e.code != errc::draining) return stop{exit_code::failed, "prepare: " + e.message};
      const bool decode_drains = std::any_of(decode.ranks.begin(), decode.ranks.end(),
                                             [](const auto& r) { return r->draining(); });
      const bool taken =
          std::find(a.prepared_on.begin(), a.prepared_on.end(), true) != a.prepared_on.end();
      if (decode_drains && !taken) {  // there is no other decode to send the request to
        free_slots.push_back(a.slot);
        fail_request(e.code, fmt::format("room {}: {}", a.id, e.message));
        return std::nullopt;
      }
      // The prefill it names drains, and the decode knew it: retried as a send's 407 is. A
      // decode rank that took the prepare before another refused it has its room cancelled,
      // and holds the slot's pages until that room ends: the attempt stays live until then
      // (finish() counts the retry and frees the slot).
      for (size_t k = 0; k < decode.ranks.size(); ++k) {
        auto& dc = decode.ranks[k];
        if (!a.prepared_on[k]) {
          a.done_on[k] = true;
          continue;
        }
        if (auto x = dc->cancel(a.id); !x && dc->lost()) return stop_on(*dc, x.error(), "cancel: ");
      }
      targets[a.target].draining = true;
      ++targets[a.target].refused;
      if (taken) {
        a.retry = true;
        a.code = errc::draining;
        a.reason = e.message;
        live.emplace(a.id, std::move(a));
        return std::nullopt;
      }
      free_slots.push_back(a.slot);
      ++retried;
      ++retried_by[code_key(e.code)];
      ++again;
      if (first_refusal.empty())
        first_refusal = fmt::format("room {} on {}: {}", a.id, targets[a.target].socket, e.message);
      return std::nullopt;
    }
    auto& l = live.emplace(a.id, std::move(a)).first->second;
    if (hold) {
      held.push_back(l.id);
      return std::nullopt;
    }
    return send(l);
  }

  /// A room's event from decode rank k; a room ended on every rank is counted.
  void on_event(size_t k, const proto::event& e) {
    auto it = live.find(e.room);
    if (it == live.end()) return;
    attempt& a = it->second;
    if (e.status >= room_status::waiting_for_input || is_terminal(e.status)) a.ready_on[k] = true;
    if (!is_terminal(e.status) || a.done_on[k]) return;
    a.done_on[k] = true;
    a.finished = clock_type::now();
    if (e.status != room_status::success) {
      if (a.ok && !a.retry) a.code = e.code, a.reason = e.reason;
      a.ok = false;
      // Refused before its send by a prefill that drains (the decode heard it leave).
      if (!a.sent && !a.retry && e.code == errc::draining) {
        a.retry = true;
        targets[a.target].draining = true;
        ++targets[a.target].refused;
      }
    }
    if (std::find(a.done_on.begin(), a.done_on.end(), false) != a.done_on.end()) return;
    finish(it);
  }

  void finish(std::map<uint64_t, attempt>::iterator it) {
    attempt& a = it->second;
    if (a.retry) {
      ++retried;
      ++retried_by[code_key(a.code)];
      ++again;
      if (first_refusal.empty())
        first_refusal = fmt::format("room {} on {}: {}", a.id, targets[a.target].socket, a.reason);
    } else if (a.ok) {
      if (c.verify) {
        auto err = drv.check({a.id, a.target, a.slot, a.slot});
        if (err.empty())
          ++verified;
        else if (first_failure.empty())
          first_failure = "verify: " + err;
      }
      ++committed;
      ++ended;
      ++targets[a.target].committed;
      latency_ms.push_back(
          std::chrono::duration<double, std::milli>(a.finished - a.started).count());
    } else {
      fail_request(a.code,
                   fmt::format("room {} on {}: {}", a.id, targets[a.target].socket, a.reason));
    }
    if (a.sent) last_end = std::max(last_end, a.finished);
    free_slots.push_back(a.slot);
    live.erase(it);
  }

  /// Read one event from the decode rank the oldest room still waits on.
  maybe_stop next_event() {
    const attempt& oldest = live.begin()->second;
    const auto k = static_cast<size_t>(
        std::find(oldest.done_on.begin(), oldest.done_on.end(), false) - oldest.done_on.begin());
    auto e = decode.ranks[k]->next_event(timeout);
    if (!e) return stop_on(*decode.ranks[k], e.error(), "waiting for rooms: ");
    on_event(k, e.value);
    return std::nullopt;
  }

  /// --pause-after: one room held prepared on every instance that takes rooms, accepted by it
  /// (WaitingForInput on every decode rank), then a line on stdin.
  maybe_stop hold() {
    pausing = false;
    paused = true;
    std::string on;
    for (uint32_t j = 0; j < targets.size(); ++j)
      if (usable(j) && !free_slots.empty() && (again > 0 || begun < c.requests)) {
        rr = j;
        if (auto s = start(true)) return s;
        on += (on.empty() ? "" : ", ") + targets[j].socket;
      }
    for (;;) {
      std::optional<size_t> k;
      for (auto id : held)
        if (auto it = live.find(id); it != live.end())
          for (size_t r = 0; r < it->second.ready_on.size() && !k; ++r)
            if (!it->second.ready_on[r]) k = r;
      if (!k) break;
      auto e = decode.ranks[*k]->next_event(timeout);
      if (!e) return stop_on(*decode.ranks[*k], e.error(), "waiting for the held rooms: ");
      on_event(*k, e.value);
    }
    std::cerr << fmt::format(
                     "ferry-bench: paused after {} requests ended, holding {} room(s) prepared "
                     "and accepted, not sent, on {}: drain or restart a daemon now; a line on "
                     "stdin (or its end) goes on\n",
                     ended, held.size(), on.empty() ? "none" : on)
              << std::flush;
    std::string line;
    std::getline(std::cin, line);
    rr = 0;
    return std::nullopt;
  }

  maybe_stop loop() {
    for (uint32_t s = c.concurrency; s-- > 0;) free_slots.push_back(s);
    while (ended < c.requests) {
      if (o.pause_after > 0 && !paused && ended >= o.pause_after) pausing = true;
      while (!pausing && !free_slots.empty() && (again > 0 || begun < c.requests))
        if (auto s = start(false)) return s;
      // Held rooms go after the first new ones: a drained daemon cannot have exited before
      // its next new room was refused.
      for (auto id : held)
        if (auto it = live.find(id); it != live.end())
          if (auto s = send(it->second)) return s;
      held.clear();
      if (pausing && live.empty()) {
        if (auto s = hold()) return s;
        continue;
      }
      if (live.empty()) continue;
      if (auto s = next_event()) return s;
    }
    return std::nullopt;
  }

  /// Every room each daemon accepted ended on it, so the bench's exit cancels none. A daemon
  /// whose connection closed has ended its rooms (a drain exits after them).
  maybe_stop settle() {
    for (uint32_t j = 0; j < targets.size(); ++j)
      for (auto& r : prefills[j].ranks) {
        if (r->lost()) continue;
        if (auto e = settle_rooms(*r, targets[j].accepted, timeout); !e && !r->lost())
          return stop_on(*r, e.error(), targets[j].socket + ": waiting for its rooms to end: ");
      }
    return std::nullopt;
  }
};

nlohmann::json by_code(const std::map<std::string, uint32_t>& m) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [k, n] : m) out[k] = n;
  return out;
}

std::string by_code_text(const std::map<std::string, uint32_t>& m) {
  std::string t;
  for (const auto& [k, n] : m)
    t += fmt::format("{}{} {}: {}", t.empty() ? "" : ", ", k,
                     to_string(static_cast<errc>(std::stoi(k))), n);
  return t.empty() ? "none" : t;
}

}  // namespace

int run(const options& o, const scale::common& c) {
  scale::report rep{c, c.json == "-" ? std::cerr : std::cout};
  const auto g = static_cast<uint32_t>(c.prefill_sockets.size());
  std::vector<instance> prefills;
  instance decode;
  if (auto s = scale::connect_independent(prefills, decode, c.prefill_sockets, c.decode_sockets,
                                          "--prefill-socket", "--rolling", rep.text))
    return rep.fail(*s);
  std::vector<const instance*> all{&decode}, sources;
  for (const auto& p : prefills) all.push_back(&p), sources.push_back(&p);
  const uint32_t conc = c.concurrency;
  const uint32_t ppr = scale::pages_per_room(all, c.prompt_tokens);
  if (ppr == 0)
    return rep.fail(stop{exit_code::usage, "the daemons need kv pools of one page_tokens"});
  if (auto s = scale::check_fit(conc, ppr, decode, sources, all)) return rep.fail(*s);
  const uint64_t src_pages = scale::min_items(sources, pool_kind::kv);
  const auto regions = static_cast<uint32_t>(std::min<uint64_t>(conc, src_pages / ppr));
  scale::driver drv(prefills, decode, ppr, regions, c.verify);
  auto bytes = drv.room_bytes(scale::piece_bytes_of(prefills[0]));
  if (!bytes) return rep.fail(stop{exit_code::failed, bytes.message});
  if (auto s = drv.fill(conc)) return rep.fail(*s);

  rehearsal r(o, c, prefills, decode, drv);
  for (const auto& s : c.prefill_sockets) {
    r.targets.emplace_back();
    r.targets.back().socket = s;
  }
  auto all_have = [&](pool_kind k) { return scale::min_items(all, k) != ~0ull; };
  r.state = all_have(pool_kind::state);
  r.aux = all_have(pool_kind::aux);
  r.next_id = c.room_base;
  const std::string provider = scale::provider_of(prefills[0]);
  rep.text << fmt::format(
      "ferry-bench --rolling: {} prefill instance(s) -> {} over {}; {} requests of {} tokens ({} "
      "pages, {} B), {} in flight{}\n",
      g, decode.ranks[0]->daemon().node, provider, c.requests, c.prompt_tokens, ppr,
      bytes.value.first, conc,
      o.pause_after ? fmt::format(", a pause after {} requests", o.pause_after) : "");
  if (auto s = r.loop()) return rep.fail(*s);
  if (auto s = r.settle()) return rep.fail(*s);

  const double transfer_s =
      r.first_send ? std::chrono::duration<double>(r.last_end - *r.first_send).count() : 0;
  const uint32_t lost = c.requests - r.committed - r.failed;
  rep.out = {
      {"mode", "rolling"},
      {"provider", provider},
      {"requests", c.requests},
      {"concurrency", conc},
      {"per_room",
       {{"tokens", c.prompt_tokens},
        {"pages", ppr},
        {"bytes", bytes.value.first},
        {"writes", bytes.value.second}}},
      {"committed", r.committed},
      {"failed", r.failed},
      {"failed_by_code", by_code(r.failed_by)},
      {"retried", r.retried},
      {"retried_by_code", by_code(r.retried_by)},
      {"attempts", r.attempts},
      {"lost", lost},
      {"verified", c.verify ? nlohmann::json(r.verified) : nlohmann::json(nullptr)},
      {"paused_after", o.pause_after ? nlohmann::json(o.pause_after) : nlohmann::json(nullptr)},
      {"transfer_s", transfer_s},
      {"rooms_per_s", transfer_s > 0 ? r.committed / transfer_s : 0.0},
      {"latency_ms", scale::latency_json(r.latency_ms)},
      {"first_failure", r.first_failure},
      {"first_refusal", r.first_refusal},
      {"prefills", nlohmann::json::array()}};
  rep.text << fmt::format(
      "rolling: {} requests: {} committed, {} failed ({}), {} lost; {} attempt(s) refused and "
      "retried ({}); {} rooms in all\n",
      c.requests, r.committed, r.failed, by_code_text(r.failed_by), lost, r.retried,
      by_code_text(r.retried_by), r.attempts);
  for (uint32_t j = 0; j < g; ++j) {
    const auto& t = r.targets[j];
    rep.out["prefills"].push_back({{"socket", t.socket},
                                   {"node", prefills[j].ranks[0]->daemon().node},
                                   {"accepted", t.accepted.size()},
                                   {"committed", t.committed},
                                   {"refused", t.refused},
                                   {"draining", t.draining},
                                   {"gone", t.gone}});
    rep.text << fmt::format("  {} ({}): accepted {}, committed {}, refused {}{}{}\n", t.socket,
                            prefills[j].ranks[0]->daemon().node, t.accepted.size(), t.committed,
                            t.refused, t.draining ? ", draining" : "", t.gone ? ", gone" : "");
  }
  if (c.verify)
    rep.text << fmt::format("verified: {}/{} committed requests, every destination byte\n",
                            r.verified, r.committed);
  if (!r.first_refusal.empty()) rep.text << "first refusal: " << r.first_refusal << "\n";
  if (!r.first_failure.empty()) rep.text << "first failure: " << r.first_failure << "\n";
  return rep.finish(r.failed == 0 && lost == 0 && r.first_failure.empty() &&
                    (!c.verify || r.verified == r.committed));
}

}  // namespace ferry::bench::rolling
