// core/room_lifecycle.hpp: every (phase, event) pair, table-driven; a test enumerates the pairs
// so a phase or an event without its row fails.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "core/room_lifecycle.hpp"

// Named, so that the unity build may put this file beside the other machines' tables.
namespace test_room_lifecycle {
using namespace ferry;

namespace {

constexpr lifecycle_limits limits{100, 200, 300, 1000, 50};

/// Applies effects the way an actor does: one live deadline per kind, by generation.
struct harness {
  room_lifecycle life{limits, {"waiting for A", "waiting for B", "waiting for C"}};
  std::map<deadline_kind, uint64_t> live;  // armed deadlines, by kind
  std::vector<room_status> reports;
  std::string last_reason;
  errc last_code = errc::ok;
  bool quit = false;

  void apply(const lifecycle_effects& e) {
    for (auto k : e.cancel) REQUIRE(live.erase(k) == 1);  // only what is armed is cancelled
    for (const auto& a : e.arm) {
      REQUIRE(live.count(a.kind) == 0);  // re-arming cancels first
      live[a.kind] = a.generation;
    }
    if (e.report) {
      reports.push_back(*e.report);
      last_reason = e.reason;
      last_code = e.code;
    }
    if (e.quit) {
      REQUIRE_FALSE(quit);  // once
      quit = true;
      REQUIRE(live.empty());  // an ended room leaves no deadline behind
    }
  }
  void advance(room_status s) { apply(life.on(life_ev::advance{s})); }
  bool fail(bool in_flight) {
    const auto e = life.on(life_ev::fail{errc::cancelled, "cancelled by test", in_flight});
    apply(e);
    return e.began_drain;
  }
};

enum class event {
  advance_waiting,
  advance_transferring,
  advance_success,
  advance_bootstrapping,
  fail_in_flight,
  fail_nothing_in_flight,
  drained,
  expire_state,
  expire_room,
  expire_drain,
  expire_stale,
};
constexpr event all_events[] = {event::advance_waiting, event::advance_transferring,
                                event::advance_success, event::advance_bootstrapping,
                                event::fail_in_flight,  event::fail_nothing_in_flight,
                                event::drained,         event::expire_state,
                                event::expire_room,     event::expire_drain,
                                event::expire_stale};
constexpr room_phase all_phases[] = {room_phase::bootstrapping, room_phase::waiting_for_input,
                                     room_phase::transferring,  room_phase::draining,
                                     room_phase::success,       room_phase::failed};

/// A lifecycle brought into `p` the way rooms get there.
void bring_to(harness& h, room_phase p) {
  h.apply(h.life.on(life_ev::start{}));
  switch (p) {
    case room_phase::bootstrapping:
      break;
    case room_phase::waiting_for_input:
      h.advance(room_status::waiting_for_input);
      break;
    case room_phase::transferring:
      h.advance(room_status::waiting_for_input);
      h.advance(room_status::transferring);
      break;
    case room_phase::draining:
      h.advance(room_status::waiting_for_input);
      REQUIRE(h.fail(true));
      break;
    case room_phase::success:
      h.advance(room_status::success);
      break;
    case room_phase::failed:
      REQUIRE(h.fail(false));
      h.apply(h.life.on(life_ev::drained{}));
      break;
  }
  REQUIRE(h.life.phase() == p);
  h.reports.clear();
}

/// What one event did.
struct outcome {
  room_phase next;
  std::optional<room_status> report;
  std::optional<expiry::kind> expires;
  uint32_t expiry_ms = 0;
};

outcome run(harness& h, event ev) {
  std::optional<expiry> x;
  auto expire = [&](deadline_kind k) {
    const auto it = h.live.find(k);
    if (it == h.live.end()) {
      // Not armed: whatever generation arrives is not the current one.
      x = h.life.on(life_ev::expired{k, 12345}).expired;
      return;
    }
    x = h.life.on(life_ev::expired{k, it->second}).expired;
    if (x) h.live.erase(it);  // it fired
  };
  switch (ev) {
    case event::advance_waiting:
      h.advance(room_status::waiting_for_input);
      break;
    case event::advance_transferring:
      h.advance(room_status::transferring);
      break;
    case event::advance_success:
      h.advance(room_status::success);
      break;
    case event::advance_bootstrapping:
      h.advance(room_status::bootstrapping);
      break;
    case event::fail_in_flight:
      h.fail(true);
      break;
    case event::fail_nothing_in_flight:
      h.fail(false);
      break;
    case event::drained:
      h.apply(h.life.on(life_ev::drained{"; note"}));
      break;
    case event::expire_state:
      expire(deadline_kind::state);
      break;
    case event::expire_room:
      expire(deadline_kind::room);
      break;
    case event::expire_drain:
      expire(deadline_kind::drain);
      break;
    case event::expire_stale:
      x = h.life.on(life_ev::expired{deadline_kind::state, 0}).expired;  // 0 is never armed
      break;
  }
  outcome o{h.life.phase(), std::nullopt, std::nullopt, 0};
  if (!h.reports.empty()) o.report = h.reports.back();
  if (x) {
    o.expires = x->what;
    o.expiry_ms = x->ms;
  }
  return o;
}

using P = room_phase;
using S = room_status;
using X = expiry::kind;
struct row {
  room_phase phase;
  event ev;
  outcome expected;
};
const std::optional<S> none;
const std::optional<X> no_expiry;

// clang-format off
const row table[] = {
  // Bootstrapping
  {P::bootstrapping, event::advance_waiting,        {P::waiting_for_input, S::waiting_for_input, no_expiry}},
  {P::bootstrapping, event::advance_transferring,   {P::transferring, S::transferring, no_expiry}},
  {P::bootstrapping, event::advance_success,        {P::success, S::success, no_expiry}},
  {P::bootstrapping, event::advance_bootstrapping,  {P::bootstrapping, none, no_expiry}},
  {P::bootstrapping, event::fail_in_flight,         {P::draining, none, no_expiry}},
  {P::bootstrapping, event::fail_nothing_in_flight, {P::draining, none, no_expiry}},
  {P::bootstrapping, event::drained,                {P::bootstrapping, none, no_expiry}},
  {P::bootstrapping, event::expire_state,           {P::bootstrapping, none, X::timed_out, 100}},
  {P::bootstrapping, event::expire_room,            {P::bootstrapping, none, X::timed_out, 1000}},
  {P::bootstrapping, event::expire_drain,           {P::bootstrapping, none, no_expiry}},
  {P::bootstrapping, event::expire_stale,           {P::bootstrapping, none, no_expiry}},
  // WaitingForInput
  {P::waiting_for_input, event::advance_waiting,        {P::waiting_for_input, none, no_expiry}},
  {P::waiting_for_input, event::advance_transferring,   {P::transferring, S::transferring, no_expiry}},
  {P::waiting_for_input, event::advance_success,        {P::success, S::success, no_expiry}},
  {P::waiting_for_input, event::advance_bootstrapping,  {P::waiting_for_input, none, no_expiry}},
  {P::waiting_for_input, event::fail_in_flight,         {P::draining, none, no_expiry}},
  {P::waiting_for_input, event::fail_nothing_in_flight, {P::draining, none, no_expiry}},
  {P::waiting_for_input, event::drained,                {P::waiting_for_input, none, no_expiry}},
  {P::waiting_for_input, event::expire_state,           {P::waiting_for_input, none, X::timed_out, 200}},
  {P::waiting_for_input, event::expire_room,            {P::waiting_for_input, none, X::timed_out, 1000}},
  {P::waiting_for_input, event::expire_drain,           {P::waiting_for_input, none, no_expiry}},
  {P::waiting_for_input, event::expire_stale,           {P::waiting_for_input, none, no_expiry}},
  // Transferring
  {P::transferring, event::advance_waiting,        {P::transferring, none, no_expiry}},
  {P::transferring, event::advance_transferring,   {P::transferring, none, no_expiry}},
  {P::transferring, event::advance_success,        {P::success, S::success, no_expiry}},
  {P::transferring, event::advance_bootstrapping,  {P::transferring, none, no_expiry}},
  {P::transferring, event::fail_in_flight,         {P::draining, none, no_expiry}},
  {P::transferring, event::fail_nothing_in_flight, {P::draining, none, no_expiry}},
  {P::transferring, event::drained,                {P::transferring, none, no_expiry}},
  {P::transferring, event::expire_state,           {P::transferring, none, X::timed_out, 300}},
  {P::transferring, event::expire_room,            {P::transferring, none, X::timed_out, 1000}},
  {P::transferring, event::expire_drain,           {P::transferring, none, no_expiry}},
  {P::transferring, event::expire_stale,           {P::transferring, none, no_expiry}},
  // Draining: nothing moves it forward or fails it again; only `drained` or its own deadline.
  {P::draining, event::advance_waiting,        {P::draining, none, no_expiry}},
  {P::draining, event::advance_transferring,   {P::draining, none, no_expiry}},
  {P::draining, event::advance_success,        {P::draining, none, no_expiry}},
  {P::draining, event::advance_bootstrapping,  {P::draining, none, no_expiry}},
  {P::draining, event::fail_in_flight,         {P::draining, none, no_expiry}},
  {P::draining, event::fail_nothing_in_flight, {P::draining, none, no_expiry}},
  {P::draining, event::drained,                {P::failed, S::failed, no_expiry}},
  {P::draining, event::expire_state,           {P::draining, none, no_expiry}},
  {P::draining, event::expire_room,            {P::draining, none, no_expiry}},
  {P::draining, event::expire_drain,           {P::draining, none, X::drain_over, 50}},
  {P::draining, event::expire_stale,           {P::draining, none, no_expiry}},
  // Terminal: final.
  {P::success, event::advance_waiting,        {P::success, none, no_expiry}},
  {P::success, event::advance_transferring,   {P::success, none, no_expiry}},
  {P::success, event::advance_success,        {P::success, none, no_expiry}},
  {P::success, event::advance_bootstrapping,  {P::success, none, no_expiry}},
  {P::success, event::fail_in_flight,         {P::success, none, no_expiry}},
  {P::success, event::fail_nothing_in_flight, {P::success, none, no_expiry}},
  {P::success, event::drained,                {P::success, none, no_expiry}},
  {P::success, event::expire_state,           {P::success, none, no_expiry}},
  {P::success, event::expire_room,            {P::success, none, no_expiry}},
  {P::success, event::expire_drain,           {P::success, none, no_expiry}},
  {P::success, event::expire_stale,           {P::success, none, no_expiry}},
  {P::failed, event::advance_waiting,        {P::failed, none, no_expiry}},
  {P::failed, event::advance_transferring,   {P::failed, none, no_expiry}},
  {P::failed, event::advance_success,        {P::failed, none, no_expiry}},
  {P::failed, event::advance_bootstrapping,  {P::failed, none, no_expiry}},
  {P::failed, event::fail_in_flight,         {P::failed, none, no_expiry}},
  {P::failed, event::fail_nothing_in_flight, {P::failed, none, no_expiry}},
  {P::failed, event::drained,                {P::failed, none, no_expiry}},
  {P::failed, event::expire_state,           {P::failed, none, no_expiry}},
  {P::failed, event::expire_room,            {P::failed, none, no_expiry}},
  {P::failed, event::expire_drain,           {P::failed, none, no_expiry}},
  {P::failed, event::expire_stale,           {P::failed, none, no_expiry}},
};
// clang-format on

}  // namespace

TEST_CASE("room lifecycle: the table has a row for every (phase, event) pair",
          "[unit][room_lifecycle]") {
  std::set<std::pair<room_phase, event>> seen;
  for (const auto& r : table) REQUIRE(seen.insert({r.phase, r.ev}).second);  // each once
  for (auto p : all_phases)
    for (auto e : all_events) {
      INFO(to_string(p) << " x event " << static_cast<int>(e));
      CHECK(seen.count({p, e}) == 1);
    }
}

TEST_CASE("room lifecycle: every (phase, event) pair does what its row says",
          "[unit][room_lifecycle]") {
  for (const auto& r : table) {
    INFO(to_string(r.phase) << " x event " << static_cast<int>(r.ev));
    harness h;
    bring_to(h, r.phase);
    const auto got = run(h, r.ev);
    CHECK(to_string(got.next) == std::string(to_string(r.expected.next)));
    CHECK(got.report == r.expected.report);
    CHECK(got.expires == r.expected.expires);
    if (r.expected.expires) CHECK(got.expiry_ms == r.expected.expiry_ms);
    // Whatever happened, the invariants hold: a terminal room has no deadline and has ended.
    if (h.life.terminal()) {
      CHECK(h.live.empty());
      CHECK(h.quit);
    }
  }
}

TEST_CASE("room lifecycle: the first failure's reason and code are the ones reported",
          "[unit][room_lifecycle]") {
  room_lifecycle life(limits, {"a", "b", "c"});
  life.on(life_ev::start{});
  REQUIRE(life.on(life_ev::fail{errc::peer_lost, "peer gone", true}).began_drain);
  CHECK(life.status() == room_status::bootstrapping);  // not reported Failed while draining
  CHECK(life.armed(deadline_kind::drain));
  CHECK_FALSE(life.armed(deadline_kind::state));
  CHECK_FALSE(life.armed(deadline_kind::room));
  const auto again = life.on(life_ev::fail{errc::timed_out, "later", true});
  CHECK_FALSE(again.began_drain);
  CHECK(again.empty());
  const auto out = life.on(life_ev::drained{"; drain note"});
  REQUIRE(out.report == room_status::failed);
  CHECK(out.reason == "peer gone; drain note");
  CHECK(out.code == errc::peer_lost);
  CHECK(out.quit);
  CHECK(life.status() == room_status::failed);
}

TEST_CASE("room lifecycle: a status's deadline names what it waits for, an old one is stale",
          "[unit][room_lifecycle]") {
  room_lifecycle life(limits, {"waiting for A", "waiting for B", "waiting for C"});
  const auto s = life.on(life_ev::start{});
  REQUIRE(s.arm.size() == 2);
  const uint64_t boot = s.arm[0].generation;
  CHECK(s.arm[0].kind == deadline_kind::state);
  CHECK(s.arm[0].ms == 100);
  CHECK(s.arm[1].kind == deadline_kind::room);
  CHECK(s.arm[1].ms == 1000);
  const auto w = life.on(life_ev::advance{room_status::waiting_for_input});
  REQUIRE(w.cancel == std::vector<deadline_kind>{deadline_kind::state});
  REQUIRE(w.arm.size() == 1);
  CHECK_FALSE(life.on(life_ev::expired{deadline_kind::state, boot})
                  .expired);  // Bootstrapping's, already over
  const auto x = life.on(life_ev::expired{deadline_kind::state, w.arm[0].generation}).expired;
  REQUIRE(x);
  CHECK(x->in == room_status::waiting_for_input);
  CHECK(x->waits == "waiting for B");
  CHECK(x->ms == 200);
  CHECK_FALSE(
      life.on(life_ev::expired{deadline_kind::state, w.arm[0].generation}).expired);  // fires once
}

}  // namespace test_room_lifecycle
