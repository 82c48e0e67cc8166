// core/peer_handshake.hpp: every (side, phase, event) triple, table-driven. A triple either has a
// row (what it does: the next phase, the effects in order, the code) or is listed as ignored (no
// effect, the phase unchanged); a test enumerates the triples so one with neither fails. The
// table runs with a cluster secret (every phase is reachable); the tests after it cover what
// differs without one. The heartbeat's timing rule is tests/core/test_heartbeat.cpp.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "core/peer_handshake.hpp"

// Named, so that the unity build may put this file beside the other machines' tables.
namespace test_peer_handshake {
using namespace ferry;
using namespace ferry::handshake;

namespace {

enum class step {
  start,
  hello_ok,
  hello_bad,
  registered_made,   // registrations made for this peer alone
  registered_plain,  // described, nothing made (this daemon only sends)
  registered_bad,
  dialed_connected,
  dialed_reset,
  dialed_failed,
  redial,
  inserted_ok,
  inserted_bad,
  auth_ok,
  auth_bad,
  refused,
  lost,
  deadline,
  fenced,
};
constexpr step all_events[] = {step::start,
                               step::hello_ok,
                               step::hello_bad,
                               step::registered_made,
                               step::registered_plain,
                               step::registered_bad,
                               step::dialed_connected,
                               step::dialed_reset,
                               step::dialed_failed,
                               step::redial,
                               step::inserted_ok,
                               step::inserted_bad,
                               step::auth_ok,
                               step::auth_bad,
                               step::refused,
                               step::lost,
                               step::deadline,
                               step::fenced};

const char* name(step e) {
  static const std::map<step, const char*> names{{step::start, "start"},
                                                 {step::hello_ok, "hello_ok"},
                                                 {step::hello_bad, "hello_bad"},
                                                 {step::registered_made, "registered_made"},
                                                 {step::registered_plain, "registered_plain"},
                                                 {step::registered_bad, "registered_bad"},
                                                 {step::dialed_connected, "dialed_connected"},
                                                 {step::dialed_reset, "dialed_reset"},
                                                 {step::dialed_failed, "dialed_failed"},
                                                 {step::redial, "redial"},
                                                 {step::inserted_ok, "inserted_ok"},
                                                 {step::inserted_bad, "inserted_bad"},
                                                 {step::auth_ok, "auth_ok"},
                                                 {step::auth_bad, "auth_bad"},
                                                 {step::refused, "refused"},
                                                 {step::lost, "lost"},
                                                 {step::deadline, "deadline"},
                                                 {step::fenced, "fenced"}};
  return names.at(e);
}

effects run(machine& m, step e) {
  const error bad{errc::peer_incompatible, "bad"};
  switch (e) {
    case step::start:
      return m.on(ev::start{});
    case step::hello_ok:
      return m.on(ev::hello{{}});
    case step::hello_bad:
      return m.on(ev::hello{bad});
    case step::registered_made:
      return m.on(ev::registered{{}, true});
    case step::registered_plain:
      return m.on(ev::registered{{}, false});
    case step::registered_bad:
      return m.on(ev::registered{bad, false});
    case step::dialed_connected:
      return m.on(ev::dialed{dial_outcome::connected, ""});
    case step::dialed_reset:
      return m.on(ev::dialed{dial_outcome::reset, "reset"});
    case step::dialed_failed:
      return m.on(ev::dialed{dial_outcome::failed, "refused"});
    case step::redial:
      return m.on(ev::redial{});
    case step::inserted_ok:
      return m.on(ev::inserted{{}});
    case step::inserted_bad:
      return m.on(ev::inserted{error{errc::fabric_error, "av full"}});
    case step::auth_ok:
      return m.on(ev::authenticated{true});
    case step::auth_bad:
      return m.on(ev::authenticated{false});
    case step::refused:
      return m.on(ev::refused{"no"});
    case step::lost:
      return m.on(ev::lost{"gone"});
    case step::deadline:
      return m.on(ev::deadline{500});
    case step::fenced:
      return m.on(ev::fenced{});
  }
  return {};
}

/// The effects' names, in order, separated by spaces.
std::string names(const effects& fx) {
  std::string s;
  for (const auto& e : fx) s += (s.empty() ? "" : " ") + std::string(name_of(e));
  return s;
}

/// A machine (with a cluster secret) brought into phase `p` the way connections get there.
machine bring_to(side s, phase p) {
  machine m(s, "10.0.0.2:7401", true);
  auto go = [&](std::initializer_list<step> path) {
    for (auto e : path) run(m, e);
  };
  if (s == side::connecting) {
    const std::initializer_list<step> to_ready = {step::start, step::registered_made,
                                                  step::dialed_connected, step::hello_ok,
                                                  step::inserted_ok};
    switch (p) {
      case phase::created:
        break;
      case phase::registering:
        go({step::start});
        break;
      case phase::dialing:
        go({step::start, step::registered_made});
        break;
      case phase::awaiting_hello:
        go({step::start, step::registered_made, step::dialed_connected});
        break;
      case phase::inserting:
        go({step::start, step::registered_made, step::dialed_connected, step::hello_ok});
        break;
      case phase::ready:
        go(to_ready);
        break;
      case phase::closing:  // its registration still outstanding, nothing made yet
        go({step::start, step::lost});
        break;
      case phase::fencing:
        go(to_ready);
        go({step::lost});
        break;
      case phase::ended:
        go({step::lost});
        break;
      default:
        FAIL("not a phase of the connecting side: " << to_string(p));
    }
  } else {
    const std::initializer_list<step> to_ready = {step::hello_ok, step::inserted_ok,
                                                  step::registered_made, step::auth_ok};
    switch (p) {
      case phase::checking:
        break;
      case phase::inserting:
        go({step::hello_ok});
        break;
      case phase::registering:
        go({step::hello_ok, step::inserted_ok});
        break;
      case phase::awaiting_auth:
        go({step::hello_ok, step::inserted_ok, step::registered_made});
        break;
      case phase::ready:
        go(to_ready);
        break;
      case phase::closing:  // its insertion still outstanding
        go({step::hello_ok, step::lost});
        break;
      case phase::fencing:
        go(to_ready);
        go({step::lost});
        break;
      case phase::ended:
        go({step::hello_bad});
        break;
      default:
        FAIL("not a phase of the accepting side: " << to_string(p));
    }
  }
  REQUIRE(std::string(to_string(m.at())) == to_string(p));
  return m;
}

constexpr phase connecting_phases[] = {phase::created,        phase::registering, phase::dialing,
                                       phase::awaiting_hello, phase::inserting,   phase::ready,
                                       phase::closing,        phase::fencing,     phase::ended};
constexpr phase accepting_phases[] = {phase::checking,      phase::inserting, phase::registering,
                                      phase::awaiting_auth, phase::ready,     phase::closing,
                                      phase::fencing,       phase::ended};

using S = side;
using P = phase;
constexpr auto ok = errc::ok;
constexpr auto unreachable = errc::peer_unreachable;
constexpr auto incompatible = errc::peer_incompatible;
constexpr auto lost_ = errc::peer_lost;

struct row {
  side s;
  phase from;
  step e;
  phase to;
  const char* fx;
  errc code;  ///< the machine's code after the event
};

// clang-format off
const row table[] = {
  // Connecting side.
  {S::connecting, P::created, step::start,    P::registering, "register_memory", ok},
  {S::connecting, P::created, step::refused,  P::ended, "closing_with report_down quit", incompatible},
  {S::connecting, P::created, step::lost,     P::ended, "closing_with report_down quit", unreachable},
  {S::connecting, P::created, step::deadline, P::ended, "closing_with report_down quit", unreachable},

  {S::connecting, P::registering, step::registered_made,  P::dialing, "report_resources dial", ok},
  {S::connecting, P::registering, step::registered_plain, P::dialing, "report_resources dial", ok},
  {S::connecting, P::registering, step::registered_bad,   P::ended, "report_resources closing_with report_down quit", incompatible},
  {S::connecting, P::registering, step::refused,  P::closing, "closing_with", incompatible},
  {S::connecting, P::registering, step::lost,     P::closing, "closing_with", unreachable},
  {S::connecting, P::registering, step::deadline, P::closing, "closing_with", unreachable},

  {S::connecting, P::dialing, step::dialed_connected, P::awaiting_hello, "send_hello", ok},
  {S::connecting, P::dialing, step::dialed_reset,     P::dialing, "redial_after", ok},
  {S::connecting, P::dialing, step::dialed_failed,    P::fencing, "closing_with fence", unreachable},
  {S::connecting, P::dialing, step::refused,  P::fencing, "closing_with fence", incompatible},
  {S::connecting, P::dialing, step::lost,     P::fencing, "closing_with fence", unreachable},
  {S::connecting, P::dialing, step::deadline, P::fencing, "closing_with fence", unreachable},

  {S::connecting, P::awaiting_hello, step::hello_ok,  P::inserting, "insert_address", ok},
  {S::connecting, P::awaiting_hello, step::hello_bad, P::fencing, "send_refusal closing_with fence", incompatible},
  {S::connecting, P::awaiting_hello, step::refused,  P::fencing, "closing_with fence", incompatible},
  {S::connecting, P::awaiting_hello, step::lost,     P::fencing, "closing_with fence", unreachable},
  {S::connecting, P::awaiting_hello, step::deadline, P::fencing, "closing_with fence", unreachable},

  {S::connecting, P::inserting, step::inserted_ok,  P::ready, "send_proof become_ready", ok},
  {S::connecting, P::inserting, step::inserted_bad, P::fencing, "send_refusal closing_with fence", incompatible},
  // The insertion is still outstanding: what it adds belongs to the fence.
  {S::connecting, P::inserting, step::refused,  P::closing, "closing_with", incompatible},
  {S::connecting, P::inserting, step::lost,     P::closing, "closing_with", unreachable},
  {S::connecting, P::inserting, step::deadline, P::closing, "closing_with", unreachable},

  {S::connecting, P::ready, step::refused, P::fencing, "closing_with fence", incompatible},
  {S::connecting, P::ready, step::lost,    P::fencing, "closing_with fence", lost_},

  // Closed while registering (from the lost of bring_to): the answer decides the fence.
  {S::connecting, P::closing, step::registered_made,  P::fencing, "fence", unreachable},
  {S::connecting, P::closing, step::registered_plain, P::ended, "report_down quit", unreachable},
  {S::connecting, P::closing, step::registered_bad,   P::ended, "report_down quit", unreachable},

  {S::connecting, P::fencing, step::fenced, P::ended, "report_down quit", lost_},

  // Accepting side.
  {S::accepting, P::checking, step::hello_ok,  P::inserting, "insert_address", ok},
  {S::accepting, P::checking, step::hello_bad, P::ended, "send_refusal release quit", incompatible},
  {S::accepting, P::checking, step::refused,  P::ended, "closing_with report_down quit", incompatible},
  {S::accepting, P::checking, step::lost,     P::ended, "closing_with report_down quit", unreachable},
  {S::accepting, P::checking, step::deadline, P::ended, "closing_with report_down quit", unreachable},

  {S::accepting, P::inserting, step::inserted_ok,  P::registering, "report_resources register_memory", ok},
  {S::accepting, P::inserting, step::inserted_bad, P::ended, "send_refusal release quit", incompatible},
  {S::accepting, P::inserting, step::refused,  P::closing, "closing_with", incompatible},
  {S::accepting, P::inserting, step::lost,     P::closing, "closing_with", unreachable},
  {S::accepting, P::inserting, step::deadline, P::closing, "closing_with", unreachable},

  {S::accepting, P::registering, step::registered_made,  P::awaiting_auth, "report_resources send_hello", ok},
  {S::accepting, P::registering, step::registered_plain, P::awaiting_auth, "report_resources send_hello", ok},
  {S::accepting, P::registering, step::registered_bad,   P::ended, "report_resources send_refusal release quit", incompatible},
  {S::accepting, P::registering, step::refused,  P::closing, "closing_with", incompatible},
  {S::accepting, P::registering, step::lost,     P::closing, "closing_with", unreachable},
  {S::accepting, P::registering, step::deadline, P::closing, "closing_with", unreachable},

  {S::accepting, P::awaiting_auth, step::auth_ok,  P::ready, "become_ready", ok},
  {S::accepting, P::awaiting_auth, step::auth_bad, P::fencing, "send_refusal closing_with fence", incompatible},
  {S::accepting, P::awaiting_auth, step::refused,  P::fencing, "closing_with fence", incompatible},
  {S::accepting, P::awaiting_auth, step::lost,     P::fencing, "closing_with fence", unreachable},
  {S::accepting, P::awaiting_auth, step::deadline, P::fencing, "closing_with fence", unreachable},

  {S::accepting, P::ready, step::refused, P::fencing, "closing_with fence", incompatible},
  {S::accepting, P::ready, step::lost,    P::fencing, "closing_with fence", lost_},

  // Closed while inserting: an address that made it in is removed (no room knew the peer).
  {S::accepting, P::closing, step::inserted_ok,  P::ended, "remove_address report_down quit", unreachable},
  {S::accepting, P::closing, step::inserted_bad, P::ended, "report_down quit", unreachable},

  {S::accepting, P::fencing, step::fenced, P::ended, "report_down quit", lost_},
};

/// What each (side, phase) ignores: no effect, no change.
const std::map<std::pair<side, phase>, std::set<step>> ignored{
  {{S::connecting, P::created}, {step::hello_ok, step::hello_bad, step::registered_made, step::registered_plain,
      step::registered_bad, step::dialed_connected, step::dialed_reset, step::dialed_failed, step::redial,
      step::inserted_ok, step::inserted_bad,
      step::auth_ok, step::auth_bad, step::fenced}},
  {{S::connecting, P::registering}, {step::start, step::hello_ok, step::hello_bad, step::dialed_connected,
      step::dialed_reset, step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::fenced}},
  {{S::connecting, P::dialing}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::fenced}},
  {{S::connecting, P::awaiting_hello}, {step::start, step::registered_made, step::registered_plain,
      step::registered_bad, step::dialed_connected, step::dialed_reset, step::dialed_failed, step::redial,
      step::inserted_ok, step::inserted_bad,
      step::auth_ok, step::auth_bad, step::fenced}},
  {{S::connecting, P::inserting}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::auth_ok, step::auth_bad, step::fenced}},
  // Ready: the handshake deadline no longer applies.
  {{S::connecting, P::ready}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::deadline, step::fenced}},
  // Closed: only the outstanding answer counts; no second reason.
  {{S::connecting, P::closing}, {step::start, step::hello_ok, step::hello_bad, step::dialed_connected,
      step::dialed_reset, step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::refused,
      step::lost, step::deadline, step::fenced}},
  {{S::connecting, P::fencing}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::refused, step::lost,
      step::deadline}},
  {{S::connecting, P::ended}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::refused, step::lost,
      step::deadline, step::fenced}},
  {{S::accepting, P::checking}, {step::start, step::registered_made, step::registered_plain,
      step::registered_bad, step::dialed_connected, step::dialed_reset, step::dialed_failed, step::redial,
      step::inserted_ok, step::inserted_bad,
      step::auth_ok, step::auth_bad, step::fenced}},
  {{S::accepting, P::inserting}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::auth_ok, step::auth_bad, step::fenced}},
  {{S::accepting, P::registering}, {step::start, step::hello_ok, step::hello_bad, step::dialed_connected,
      step::dialed_reset, step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::fenced}},
  {{S::accepting, P::awaiting_auth}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::fenced}},
  {{S::accepting, P::ready}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::deadline, step::fenced}},
  {{S::accepting, P::closing}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::auth_ok, step::auth_bad, step::refused, step::lost, step::deadline, step::fenced}},
  {{S::accepting, P::fencing}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::refused, step::lost,
      step::deadline}},
  {{S::accepting, P::ended}, {step::start, step::hello_ok, step::hello_bad, step::registered_made,
      step::registered_plain, step::registered_bad, step::dialed_connected, step::dialed_reset,
      step::dialed_failed, step::redial, step::inserted_ok, step::inserted_bad, step::auth_ok, step::auth_bad, step::refused, step::lost,
      step::deadline, step::fenced}},
};
// clang-format on

const char* side_name(side s) { return s == side::connecting ? "connecting" : "accepting"; }

template <class F>
void for_each_triple(F&& f) {
  for (auto p : connecting_phases)
    for (auto e : all_events) f(side::connecting, p, e);
  for (auto p : accepting_phases)
    for (auto e : all_events) f(side::accepting, p, e);
}

}  // namespace

TEST_CASE("peer handshake: every (side, phase, event) has a row or is listed as ignored",
          "[unit][peer_handshake]") {
  std::set<std::tuple<side, phase, step>> rows;
  for (const auto& r : table) REQUIRE(rows.insert({r.s, r.from, r.e}).second);  // each once
  for_each_triple([&](side s, phase p, step e) {
    INFO(side_name(s) << " x " << to_string(p) << " x " << name(e));
    const auto it = ignored.find({s, p});
    const bool listed = it != ignored.end() && it->second.count(e) == 1;
    CHECK(int{rows.count({s, p, e}) == 1} + int{listed} == 1);  // one or the other
  });
}

TEST_CASE("peer handshake: every row does what it says", "[unit][peer_handshake]") {
  for (const auto& r : table) {
    INFO(side_name(r.s) << " x " << to_string(r.from) << " x " << name(r.e));
    auto m = bring_to(r.s, r.from);
    const auto fx = run(m, r.e);
    CHECK(names(fx) == r.fx);
    CHECK(std::string(to_string(m.at())) == to_string(r.to));
    CHECK(m.code() == r.code);
  }
}

TEST_CASE("peer handshake: an ignored event changes nothing", "[unit][peer_handshake]") {
  for (const auto& [key, events] : ignored)
    for (auto e : events) {
      INFO(side_name(key.first) << " x " << to_string(key.second) << " x " << name(e));
      auto m = bring_to(key.first, key.second);
      const auto calls = m.engine_calls();
      const auto fx = run(m, e);
      CHECK(names(fx).empty());
      CHECK(std::string(to_string(m.at())) == to_string(key.second));
      CHECK(m.engine_calls() == calls);
    }
}

TEST_CASE("peer handshake: reasons say what failed, the first one stays",
          "[unit][peer_handshake]") {
  auto m = bring_to(side::connecting, phase::dialing);
  auto fx = m.on(ev::dialed{dial_outcome::failed, "Connection refused"});
  CHECK(m.reason() == "cannot connect to 10.0.0.2:7401: Connection refused");
  REQUIRE(std::holds_alternative<closing_with>(fx.front()));
  CHECK(std::get<closing_with>(fx.front()).reason == m.reason());
  CHECK(std::get<closing_with>(fx.front()).code == errc::peer_unreachable);
  CHECK(m.on(ev::lost{"later"}).empty());
  CHECK(m.reason() == "cannot connect to 10.0.0.2:7401: Connection refused");

  auto h = bring_to(side::connecting, phase::awaiting_hello);
  fx = h.on(ev::hello{error{errc::peer_incompatible, "incompatible layouts: kv.page_tokens"}});
  REQUIRE(std::holds_alternative<send_refusal>(fx.front()));
  CHECK(std::get<send_refusal>(fx.front()).reason == "incompatible layouts: kv.page_tokens");
  CHECK(h.reason() == "handshake failed: incompatible layouts: kv.page_tokens");
  auto r = bring_to(side::connecting, phase::registering);
  r.on(ev::registered{error{errc::system_error, "memory registration for the peer failed: ENOMEM"},
                      false});
  CHECK(r.reason() ==
        "peer refused the handshake: memory registration for the peer failed: "
        "ENOMEM");
  auto d = bring_to(side::accepting, phase::awaiting_auth);
  d.on(ev::deadline{1500});
  CHECK(d.reason() == "handshake did not complete within 1500 ms");
  auto a = bring_to(side::accepting, phase::awaiting_auth);
  fx = a.on(ev::authenticated{false});
  CHECK(std::get<send_refusal>(fx.front()).reason ==
        "peer failed the cluster-secret challenge (different secrets?)");
  auto i = bring_to(side::accepting, phase::inserting);
  fx = i.on(ev::inserted{error{errc::fabric_error, "fi_av_insert: -22"}});
  CHECK(std::get<release>(fx.at(1)).reason ==
        "cannot add the peer's fabric address: fi_av_insert: -22");
}

TEST_CASE("peer handshake: a reset dial is retried with doubling delays, then gives up",
          "[unit][peer_handshake]") {
  auto m = bring_to(side::connecting, phase::dialing);
  for (int d = 1; d < max_dials; ++d) {
    INFO("dial " << d);
    CHECK(m.dials() == d);
    auto fx = m.on(ev::dialed{dial_outcome::reset, "reset by peer"});
    REQUIRE(fx.size() == 1);
    const auto& r = std::get<redial_after>(fx[0]);
    CHECK(r.ms == first_redial_ms << (d - 1));
    CHECK(r.dials == d);
    CHECK(r.error == "reset by peer");
    CHECK(m.on(ev::dialed{dial_outcome::connected, ""})
              .empty());  // none outstanding until the redial
    CHECK(names(m.on(ev::redial{})) == "dial");
    CHECK(m.on(ev::redial{}).empty());  // once
  }
  CHECK(m.dials() == max_dials);
  m.on(ev::dialed{dial_outcome::reset, "reset by peer"});
  CHECK(m.at() == phase::fencing);
  CHECK(m.reason() == "cannot connect to 10.0.0.2:7401: reset by peer");
}

TEST_CASE("peer handshake: without a cluster secret, no proof is sent or awaited",
          "[unit][peer_handshake]") {
  machine c(side::connecting, "p:1", false);
  c.on(ev::start{});
  c.on(ev::registered{{}, false});
  c.on(ev::dialed{dial_outcome::connected, ""});
  c.on(ev::hello{{}});
  CHECK(names(c.on(ev::inserted{{}})) == "become_ready");
  CHECK(c.ready());

  machine a(side::accepting, "p:1", false);
  a.on(ev::hello{{}});
  a.on(ev::inserted{{}});
  CHECK(names(a.on(ev::registered{{}, true})) == "report_resources send_hello become_ready");
  CHECK(a.ready());
}

TEST_CASE("peer handshake: the end reports what the rooms need to know", "[unit][peer_handshake]") {
  SECTION("a ready peer declared dead: fenced, cut, unresponsive, peer_lost") {
    auto m = bring_to(side::connecting, phase::ready);
    auto fx = m.on(ev::lost{"peer unresponsive", true});
    CHECK(names(fx) == "closing_with fence");
    fx = m.on(ev::fenced{});
    const auto& d = std::get<report_down>(fx.at(0));
    CHECK(d.cut);
    CHECK(d.was_ready);
    CHECK(d.unresponsive);
    CHECK(m.code() == errc::peer_lost);
  }
  SECTION("a sender-only peer: nothing to fence, the rooms are told at once") {
    machine m(side::connecting, "p:1", false);
    m.on(ev::start{});
    m.on(ev::registered{{}, false});
    m.on(ev::dialed{dial_outcome::connected, ""});
    m.on(ev::hello{{}});
    m.on(ev::inserted{{}});
    auto fx = m.on(ev::lost{"peer went down"});
    CHECK(names(fx) == "closing_with report_down quit");
    const auto& d = std::get<report_down>(fx.at(1));
    CHECK_FALSE(d.cut);  // the Scheduler removes the peer after telling the rooms
    CHECK(d.was_ready);
  }
  SECTION("an address inserted after the close is part of the fence when memory was made") {
    auto m = bring_to(side::connecting, phase::inserting);
    m.on(ev::lost{"stop"});
    CHECK(m.engine_calls() == 1);
    CHECK(names(m.on(ev::inserted{{}})) == "fence");  // no separate removal: the fence cuts it
    CHECK(names(m.on(ev::fenced{})) == "report_down quit");
  }
}

TEST_CASE("peer handshake: a hello, a proof or a room message out of turn ends the connection",
          "[unit][peer_handshake]") {
  auto expect = [](side sd, phase p) {
    INFO((sd == side::connecting ? "connecting " : "accepting ") << to_string(p));
    const machine m = bring_to(sd, p);
    const auto hello = m.unexpected(inbound::hello);
    const auto proof = m.unexpected(inbound::proof);
    const auto room = m.unexpected(inbound::room_message);
    // A hello answers ours once, on the connecting side; the accepting side's first hello is
    // the one the connection was made for, so any other is a second one.
    if (sd == side::connecting && p == phase::awaiting_hello)
      CHECK_FALSE(hello);
    else
      CHECK(hello == "peer sent a second hello");
    if (p == phase::awaiting_auth)
      CHECK_FALSE(proof);
    else
      CHECK(proof == "peer sent a proof it was not asked for");
    if (p == phase::ready)
      CHECK_FALSE(room);
    else
      CHECK(room == "peer sent a room message before it authenticated");
  };
  for (auto p : connecting_phases) expect(side::connecting, p);
  for (auto p : accepting_phases) expect(side::accepting, p);
}

}  // namespace test_peer_handshake
