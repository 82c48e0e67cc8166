#pragma once
// The table tests' harness, written once for every room machine (core/sender_room.hpp,
// core/receiver_room.hpp): a machine fed events (core/inspect.hpp), its effects written the way
// the tables write them, and the deadlines its `life` effects arm kept the way the actors keep
// them (one live deadline per kind, by generation); then a table's named cases and its two
// checks: every (phase, case) pair has exactly one row, and each row does what it says.

#include <catch2/catch.hpp>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/inspect.hpp"
#include "core/room_lifecycle.hpp"

namespace ferry::test {

/// A room machine with what its actor would keep.
template <class Machine, class Event, class Effects>
struct room_harness {
  Machine m;
  std::map<deadline_kind, uint64_t> live;  ///< armed deadlines, by kind
  std::string last_reason;                 ///< of the last report
  Effects last;                            ///< the effects of the last event

  /// Carry out `fx` the way the actor does; the effects as the table writes them: each one's
  /// name, `_ok` or `_err` after an effect that carries an outcome (`outcome` or `ok`), and a
  /// `life` effect as `report:<status>` when it reports, else `life`.
  std::string apply(const Effects& fx) {
    std::string s;
    for (const auto& e : fx) {
      if (!s.empty()) s += ' ';
      s += std::visit([&](const auto& x) { return label(x); }, e);
    }
    last = fx;
    return s;
  }
  std::string feed(Event e) { return apply(m.on(std::move(e))); }
  /// Deadline `k` fires, with the generation it was armed with (when not armed, any is stale);
  /// it is no longer armed, whatever the room made of it.
  std::string expire(deadline_kind k) {
    const auto it = live.find(k);
    const uint64_t gen = it == live.end() ? 12345 : it->second;
    if (it != live.end()) live.erase(it);
    return feed(expired_event(k, gen));
  }
  /// The last effect of type E the last event gave, or nullptr.
  template <class E>
  const E* last_of() const {
    const E* out = nullptr;
    for (const auto& e : last)
      if (auto* x = std::get_if<E>(&e)) out = x;
    return out;
  }

 private:
  template <class E>
  std::string label(const E& x) {
    if constexpr (requires { x.effects.arm; }) {
      const auto& l = x.effects;
      for (auto k : l.cancel) REQUIRE(live.erase(k) == 1);  // only what is armed is cancelled
      for (const auto& a : l.arm) live[a.kind] = a.generation;
      if (l.quit) REQUIRE(live.empty());  // an ended room leaves no deadline behind
      if (!l.report) return "life";
      last_reason = l.reason;
      return std::string("report:") + to_string(*l.report);
    } else if constexpr (requires { x.outcome.code; }) {
      return std::string(E::name) + (x.outcome ? "_ok" : "_err");
    } else if constexpr (requires { x.ok; }) {
      return std::string(E::name) + (x.ok ? "_ok" : "_err");
    } else {
      return std::string(E::name);
    }
  }
  static Event expired_event(deadline_kind k, uint64_t gen) {
    auto e = make_named<Event>("expired");
    REQUIRE(e);
    std::visit(
        [&](auto& x) {
          if constexpr (requires { x.generation; }) {
            x.kind = k;
            x.generation = gen;
          }
        },
        *e);
    return *e;
  }
};

/// A named case of a table: what it feeds a harness, the effects of its last event.
template <class Harness>
struct table_case {
  const char* name;
  std::function<std::string(Harness&)> run;
};

/// A row: in `phase`, case `c` gives effects `fx` and leaves the machine in `next`.
template <class Phase>
struct table_row {
  Phase phase;
  const char* c;
  Phase next;
  const char* fx;
};

/// Every (phase, case) pair has exactly one row, and every row names a phase and a case.
template <class Phase, class Harness, size_t P, size_t C, size_t R>
void check_complete(const Phase (&phases)[P], const table_case<Harness> (&cases)[C],
                    const table_row<Phase> (&rows)[R]) {
  std::set<std::string> names;
  for (const auto& c : cases) REQUIRE(names.insert(c.name).second);  // each once
  std::set<std::pair<Phase, std::string>> seen;
  for (const auto& r : rows) {
    INFO(to_string(r.phase) << " x " << r.c);
    CHECK(names.count(r.c) == 1);
    CHECK(seen.insert({r.phase, r.c}).second);
  }
  for (auto p : phases)
    for (const auto& c : cases) {
      INFO(to_string(p) << " x " << c.name);
      CHECK(seen.count({p, c.name}) == 1);
    }
}

/// Each row, run on a fresh harness brought to its phase, gives its effects and next phase; a
/// room that ended leaves no deadline armed.
template <class Phase, class Harness, size_t C, size_t R, class BringTo>
void check_rows(const table_case<Harness> (&cases)[C], const table_row<Phase> (&rows)[R],
                BringTo&& bring_to) {
  for (const auto& r : rows) {
    INFO(to_string(r.phase) << " x " << r.c);
    const table_case<Harness>* c = nullptr;
    for (const auto& x : cases)
      if (std::string_view(x.name) == r.c) c = &x;
    REQUIRE(c);
    Harness h;
    bring_to(h, r.phase);
    CHECK(c->run(h) == r.fx);
    CHECK(std::string(to_string(h.m.phase())) == to_string(r.next));
    if (h.m.lifecycle().terminal()) CHECK(h.live.empty());
  }
}

}  // namespace ferry::test
