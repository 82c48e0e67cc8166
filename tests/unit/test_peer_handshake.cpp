// core/peer_handshake.hpp: every (side, phase, event) triple, table-driven. A triple either has a
// row (what it does: the next phase, the effects in order, the code) or is listed as ignored (no
// effect, the phase unchanged); a test enumerates the triples so one with neither fails. The
// table runs with a cluster secret (every phase is reachable); the tests after it cover what
// differs without one. The heartbeat's timing rule is tests/unit/test_heartbeat.cpp.

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "core/peer_handshake.hpp"

using namespace ferry;
using namespace ferry::handshake;

namespace {

enum class ev {
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
constexpr ev all_events[] = {ev::start,
                             ev::hello_ok,
                             ev::hello_bad,
                             ev::registered_made,
                             ev::registered_plain,
                             ev::registered_bad,
                             ev::dialed_connected,
                             ev::dialed_reset,
                             ev::dialed_failed,
                             ev::redial,
                             ev::inserted_ok,
                             ev::inserted_bad,
                             ev::auth_ok,
                             ev::auth_bad,
                             ev::refused,
                             ev::lost,
                             ev::deadline,
                             ev::fenced};

const char* name(ev e) {
  static const std::map<ev, const char*> names{{ev::start, "start"},
                                               {ev::hello_ok, "hello_ok"},
                                               {ev::hello_bad, "hello_bad"},
                                               {ev::registered_made, "registered_made"},
                                               {ev::registered_plain, "registered_plain"},
                                               {ev::registered_bad, "registered_bad"},
                                               {ev::dialed_connected, "dialed_connected"},
                                               {ev::dialed_reset, "dialed_reset"},
                                               {ev::dialed_failed, "dialed_failed"},
                                               {ev::redial, "redial"},
                                               {ev::inserted_ok, "inserted_ok"},
                                               {ev::inserted_bad, "inserted_bad"},
                                               {ev::auth_ok, "auth_ok"},
                                               {ev::auth_bad, "auth_bad"},
                                               {ev::refused, "refused"},
                                               {ev::lost, "lost"},
                                               {ev::deadline, "deadline"},
                                               {ev::fenced, "fenced"}};
  return names.at(e);
}

effects run(machine& m, ev e) {
  const error bad{errc::peer_incompatible, "bad"};
  switch (e) {
    case ev::start:
      return m.start();
    case ev::hello_ok:
      return m.hello({});
    case ev::hello_bad:
      return m.hello(bad);
    case ev::registered_made:
      return m.registered({}, true);
    case ev::registered_plain:
      return m.registered({}, false);
    case ev::registered_bad:
      return m.registered(bad, false);
    case ev::dialed_connected:
      return m.dialed(dial_outcome::connected, "");
    case ev::dialed_reset:
      return m.dialed(dial_outcome::reset, "reset");
    case ev::dialed_failed:
      return m.dialed(dial_outcome::failed, "refused");
    case ev::redial:
      return m.redial();
    case ev::inserted_ok:
      return m.inserted({});
    case ev::inserted_bad:
      return m.inserted(error{errc::fabric_error, "av full"});
    case ev::auth_ok:
      return m.authenticated(true);
    case ev::auth_bad:
      return m.authenticated(false);
    case ev::refused:
      return m.refused("no");
    case ev::lost:
      return m.lost("gone");
    case ev::deadline:
      return m.deadline(500);
    case ev::fenced:
      return m.fenced();
  }
  return {};
}

/// The effects' names, in order, separated by spaces.
std::string names(const effects& fx) {
  std::string s;
  for (const auto& e : fx) {
    if (!s.empty()) s += ' ';
    s += std::visit(
        [](const auto& x) -> const char* {
          using E = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<E, register_memory>) return "register_memory";
          if constexpr (std::is_same_v<E, insert_address>) return "insert_address";
          if constexpr (std::is_same_v<E, dial>) return "dial";
          if constexpr (std::is_same_v<E, redial_after>) return "redial_after";
          if constexpr (std::is_same_v<E, send_hello>) return "send_hello";
          if constexpr (std::is_same_v<E, send_proof>) return "send_proof";
          if constexpr (std::is_same_v<E, send_refusal>) return "send_refusal";
          if constexpr (std::is_same_v<E, report_resources>) return "report_resources";
          if constexpr (std::is_same_v<E, become_ready>) return "become_ready";
          if constexpr (std::is_same_v<E, closing_with>) return "closing_with";
          if constexpr (std::is_same_v<E, release>) return "release";
          if constexpr (std::is_same_v<E, fence>) return "fence";
          if constexpr (std::is_same_v<E, remove_address>) return "remove_address";
          if constexpr (std::is_same_v<E, report_down>) return "report_down";
          if constexpr (std::is_same_v<E, quit>) return "quit";
        },
        e);
  }
  return s;
}

/// A machine (with a cluster secret) brought into phase `p` the way connections get there.
machine bring_to(side s, phase p) {
  machine m(s, "10.0.0.2:7401", true);
  auto go = [&](std::initializer_list<ev> path) {
    for (auto e : path) run(m, e);
  };
  if (s == side::connecting) {
    const std::initializer_list<ev> to_ready = {
        ev::start, ev::registered_made, ev::dialed_connected, ev::hello_ok, ev::inserted_ok};
    switch (p) {
      case phase::created:
        break;
      case phase::registering:
        go({ev::start});
        break;
      case phase::dialing:
        go({ev::start, ev::registered_made});
        break;
      case phase::awaiting_hello:
        go({ev::start, ev::registered_made, ev::dialed_connected});
        break;
      case phase::inserting:
        go({ev::start, ev::registered_made, ev::dialed_connected, ev::hello_ok});
        break;
      case phase::ready:
        go(to_ready);
        break;
      case phase::closing:  // its registration still outstanding, nothing made yet
        go({ev::start, ev::lost});
        break;
      case phase::fencing:
        go(to_ready);
        go({ev::lost});
        break;
      case phase::ended:
        go({ev::lost});
        break;
      default:
        FAIL("not a phase of the connecting side: " << to_string(p));
    }
  } else {
    const std::initializer_list<ev> to_ready = {ev::hello_ok, ev::inserted_ok, ev::registered_made,
                                                ev::auth_ok};
    switch (p) {
      case phase::checking:
        break;
      case phase::inserting:
        go({ev::hello_ok});
        break;
      case phase::registering:
        go({ev::hello_ok, ev::inserted_ok});
        break;
      case phase::awaiting_auth:
        go({ev::hello_ok, ev::inserted_ok, ev::registered_made});
        break;
      case phase::ready:
        go(to_ready);
        break;
      case phase::closing:  // its insertion still outstanding
        go({ev::hello_ok, ev::lost});
        break;
      case phase::fencing:
        go(to_ready);
        go({ev::lost});
        break;
      case phase::ended:
        go({ev::hello_bad});
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
  ev e;
  phase to;
  const char* fx;
  errc code;  ///< the machine's code after the event
};

// clang-format off
const row table[] = {
  // Connecting side.
  {S::connecting, P::created, ev::start,    P::registering, "register_memory", ok},
  {S::connecting, P::created, ev::refused,  P::ended, "closing_with report_down quit", incompatible},
  {S::connecting, P::created, ev::lost,     P::ended, "closing_with report_down quit", unreachable},
  {S::connecting, P::created, ev::deadline, P::ended, "closing_with report_down quit", unreachable},

  {S::connecting, P::registering, ev::registered_made,  P::dialing, "report_resources dial", ok},
  {S::connecting, P::registering, ev::registered_plain, P::dialing, "report_resources dial", ok},
  {S::connecting, P::registering, ev::registered_bad,   P::ended, "report_resources closing_with report_down quit", incompatible},
  {S::connecting, P::registering, ev::refused,  P::closing, "closing_with", incompatible},
  {S::connecting, P::registering, ev::lost,     P::closing, "closing_with", unreachable},
  {S::connecting, P::registering, ev::deadline, P::closing, "closing_with", unreachable},

  {S::connecting, P::dialing, ev::dialed_connected, P::awaiting_hello, "send_hello", ok},
  {S::connecting, P::dialing, ev::dialed_reset,     P::dialing, "redial_after", ok},
  {S::connecting, P::dialing, ev::dialed_failed,    P::fencing, "closing_with fence", unreachable},
  {S::connecting, P::dialing, ev::refused,  P::fencing, "closing_with fence", incompatible},
  {S::connecting, P::dialing, ev::lost,     P::fencing, "closing_with fence", unreachable},
  {S::connecting, P::dialing, ev::deadline, P::fencing, "closing_with fence", unreachable},

  {S::connecting, P::awaiting_hello, ev::hello_ok,  P::inserting, "insert_address", ok},
  {S::connecting, P::awaiting_hello, ev::hello_bad, P::fencing, "send_refusal closing_with fence", incompatible},
  {S::connecting, P::awaiting_hello, ev::refused,  P::fencing, "closing_with fence", incompatible},
  {S::connecting, P::awaiting_hello, ev::lost,     P::fencing, "closing_with fence", unreachable},
  {S::connecting, P::awaiting_hello, ev::deadline, P::fencing, "closing_with fence", unreachable},

  {S::connecting, P::inserting, ev::inserted_ok,  P::ready, "send_proof become_ready", ok},
  {S::connecting, P::inserting, ev::inserted_bad, P::fencing, "send_refusal closing_with fence", incompatible},
  // The insertion is still outstanding: what it adds belongs to the fence.
  {S::connecting, P::inserting, ev::refused,  P::closing, "closing_with", incompatible},
  {S::connecting, P::inserting, ev::lost,     P::closing, "closing_with", unreachable},
  {S::connecting, P::inserting, ev::deadline, P::closing, "closing_with", unreachable},

  {S::connecting, P::ready, ev::refused, P::fencing, "closing_with fence", incompatible},
  {S::connecting, P::ready, ev::lost,    P::fencing, "closing_with fence", lost_},

  // Closed while registering (from the lost of bring_to): the answer decides the fence.
  {S::connecting, P::closing, ev::registered_made,  P::fencing, "fence", unreachable},
  {S::connecting, P::closing, ev::registered_plain, P::ended, "report_down quit", unreachable},
  {S::connecting, P::closing, ev::registered_bad,   P::ended, "report_down quit", unreachable},

  {S::connecting, P::fencing, ev::fenced, P::ended, "report_down quit", lost_},

  // Accepting side.
  {S::accepting, P::checking, ev::hello_ok,  P::inserting, "insert_address", ok},
  {S::accepting, P::checking, ev::hello_bad, P::ended, "send_refusal release quit", incompatible},
  {S::accepting, P::checking, ev::refused,  P::ended, "closing_with report_down quit", incompatible},
  {S::accepting, P::checking, ev::lost,     P::ended, "closing_with report_down quit", unreachable},
  {S::accepting, P::checking, ev::deadline, P::ended, "closing_with report_down quit", unreachable},

  {S::accepting, P::inserting, ev::inserted_ok,  P::registering, "report_resources register_memory", ok},
  {S::accepting, P::inserting, ev::inserted_bad, P::ended, "send_refusal release quit", incompatible},
  {S::accepting, P::inserting, ev::refused,  P::closing, "closing_with", incompatible},
  {S::accepting, P::inserting, ev::lost,     P::closing, "closing_with", unreachable},
  {S::accepting, P::inserting, ev::deadline, P::closing, "closing_with", unreachable},

  {S::accepting, P::registering, ev::registered_made,  P::awaiting_auth, "report_resources send_hello", ok},
  {S::accepting, P::registering, ev::registered_plain, P::awaiting_auth, "report_resources send_hello", ok},
  {S::accepting, P::registering, ev::registered_bad,   P::ended, "report_resources send_refusal release quit", incompatible},
  {S::accepting, P::registering, ev::refused,  P::closing, "closing_with", incompatible},
  {S::accepting, P::registering, ev::lost,     P::closing, "closing_with", unreachable},
  {S::accepting, P::registering, ev::deadline, P::closing, "closing_with", unreachable},

  {S::accepting, P::awaiting_auth, ev::auth_ok,  P::ready, "become_ready", ok},
  {S::accepting, P::awaiting_auth, ev::auth_bad, P::fencing, "send_refusal closing_with fence", incompatible},
  {S::accepting, P::awaiting_auth, ev::refused,  P::fencing, "closing_with fence", incompatible},
  {S::accepting, P::awaiting_auth, ev::lost,     P::fencing, "closing_with fence", unreachable},
  {S::accepting, P::awaiting_auth, ev::deadline, P::fencing, "closing_with fence", unreachable},

  {S::accepting, P::ready, ev::refused, P::fencing, "closing_with fence", incompatible},
  {S::accepting, P::ready, ev::lost,    P::fencing, "closing_with fence", lost_},

  // Closed while inserting: an address that made it in is removed (no room knew the peer).
  {S::accepting, P::closing, ev::inserted_ok,  P::ended, "remove_address report_down quit", unreachable},
  {S::accepting, P::closing, ev::inserted_bad, P::ended, "report_down quit", unreachable},

  {S::accepting, P::fencing, ev::fenced, P::ended, "report_down quit", lost_},
};

/// What each (side, phase) ignores: no effect, no change.
const std::map<std::pair<side, phase>, std::set<ev>> ignored{
  {{S::connecting, P::created}, {ev::hello_ok, ev::hello_bad, ev::registered_made, ev::registered_plain,
      ev::registered_bad, ev::dialed_connected, ev::dialed_reset, ev::dialed_failed, ev::redial,
      ev::inserted_ok, ev::inserted_bad,
      ev::auth_ok, ev::auth_bad, ev::fenced}},
  {{S::connecting, P::registering}, {ev::start, ev::hello_ok, ev::hello_bad, ev::dialed_connected,
      ev::dialed_reset, ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::fenced}},
  {{S::connecting, P::dialing}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::fenced}},
  {{S::connecting, P::awaiting_hello}, {ev::start, ev::registered_made, ev::registered_plain,
      ev::registered_bad, ev::dialed_connected, ev::dialed_reset, ev::dialed_failed, ev::redial,
      ev::inserted_ok, ev::inserted_bad,
      ev::auth_ok, ev::auth_bad, ev::fenced}},
  {{S::connecting, P::inserting}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::auth_ok, ev::auth_bad, ev::fenced}},
  // Ready: the handshake deadline no longer applies.
  {{S::connecting, P::ready}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::deadline, ev::fenced}},
  // Closed: only the outstanding answer counts; no second reason.
  {{S::connecting, P::closing}, {ev::start, ev::hello_ok, ev::hello_bad, ev::dialed_connected,
      ev::dialed_reset, ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::refused,
      ev::lost, ev::deadline, ev::fenced}},
  {{S::connecting, P::fencing}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::refused, ev::lost,
      ev::deadline}},
  {{S::connecting, P::ended}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::refused, ev::lost,
      ev::deadline, ev::fenced}},
  {{S::accepting, P::checking}, {ev::start, ev::registered_made, ev::registered_plain,
      ev::registered_bad, ev::dialed_connected, ev::dialed_reset, ev::dialed_failed, ev::redial,
      ev::inserted_ok, ev::inserted_bad,
      ev::auth_ok, ev::auth_bad, ev::fenced}},
  {{S::accepting, P::inserting}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::auth_ok, ev::auth_bad, ev::fenced}},
  {{S::accepting, P::registering}, {ev::start, ev::hello_ok, ev::hello_bad, ev::dialed_connected,
      ev::dialed_reset, ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::fenced}},
  {{S::accepting, P::awaiting_auth}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::fenced}},
  {{S::accepting, P::ready}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::deadline, ev::fenced}},
  {{S::accepting, P::closing}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::auth_ok, ev::auth_bad, ev::refused, ev::lost, ev::deadline, ev::fenced}},
  {{S::accepting, P::fencing}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::refused, ev::lost,
      ev::deadline}},
  {{S::accepting, P::ended}, {ev::start, ev::hello_ok, ev::hello_bad, ev::registered_made,
      ev::registered_plain, ev::registered_bad, ev::dialed_connected, ev::dialed_reset,
      ev::dialed_failed, ev::redial, ev::inserted_ok, ev::inserted_bad, ev::auth_ok, ev::auth_bad, ev::refused, ev::lost,
      ev::deadline, ev::fenced}},
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
  std::set<std::tuple<side, phase, ev>> rows;
  for (const auto& r : table) REQUIRE(rows.insert({r.s, r.from, r.e}).second);  // each once
  for_each_triple([&](side s, phase p, ev e) {
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
  auto fx = m.dialed(dial_outcome::failed, "Connection refused");
  CHECK(m.reason() == "cannot connect to 10.0.0.2:7401: Connection refused");
  REQUIRE(std::holds_alternative<closing_with>(fx.front()));
  CHECK(std::get<closing_with>(fx.front()).reason == m.reason());
  CHECK(std::get<closing_with>(fx.front()).code == errc::peer_unreachable);
  CHECK(m.lost("later").empty());
  CHECK(m.reason() == "cannot connect to 10.0.0.2:7401: Connection refused");

  auto h = bring_to(side::connecting, phase::awaiting_hello);
  fx = h.hello(error{errc::peer_incompatible, "incompatible layouts: kv.page_tokens"});
  REQUIRE(std::holds_alternative<send_refusal>(fx.front()));
  CHECK(std::get<send_refusal>(fx.front()).reason == "incompatible layouts: kv.page_tokens");
  CHECK(h.reason() == "handshake failed: incompatible layouts: kv.page_tokens");
  auto r = bring_to(side::connecting, phase::registering);
  r.registered(error{errc::system_error, "memory registration for the peer failed: ENOMEM"}, false);
  CHECK(r.reason() ==
        "peer refused the handshake: memory registration for the peer failed: "
        "ENOMEM");
  auto d = bring_to(side::accepting, phase::awaiting_auth);
  d.deadline(1500);
  CHECK(d.reason() == "handshake did not complete within 1500 ms");
  auto a = bring_to(side::accepting, phase::awaiting_auth);
  fx = a.authenticated(false);
  CHECK(std::get<send_refusal>(fx.front()).reason ==
        "peer failed the cluster-secret challenge (different secrets?)");
  auto i = bring_to(side::accepting, phase::inserting);
  fx = i.inserted(error{errc::fabric_error, "fi_av_insert: -22"});
  CHECK(std::get<release>(fx.at(1)).reason ==
        "cannot add the peer's fabric address: fi_av_insert: -22");
}

TEST_CASE("peer handshake: a reset dial is retried with doubling delays, then gives up",
          "[unit][peer_handshake]") {
  auto m = bring_to(side::connecting, phase::dialing);
  for (int d = 1; d < max_dials; ++d) {
    INFO("dial " << d);
    CHECK(m.dials() == d);
    auto fx = m.dialed(dial_outcome::reset, "reset by peer");
    REQUIRE(fx.size() == 1);
    const auto& r = std::get<redial_after>(fx[0]);
    CHECK(r.ms == first_redial_ms << (d - 1));
    CHECK(r.dials == d);
    CHECK(r.error == "reset by peer");
    CHECK(m.dialed(dial_outcome::connected, "").empty());  // none outstanding until the redial
    CHECK(names(m.redial()) == "dial");
    CHECK(m.redial().empty());  // once
  }
  CHECK(m.dials() == max_dials);
  m.dialed(dial_outcome::reset, "reset by peer");
  CHECK(m.at() == phase::fencing);
  CHECK(m.reason() == "cannot connect to 10.0.0.2:7401: reset by peer");
}

TEST_CASE("peer handshake: without a cluster secret, no proof is sent or awaited",
          "[unit][peer_handshake]") {
  machine c(side::connecting, "p:1", false);
  c.start();
  c.registered({}, false);
  c.dialed(dial_outcome::connected, "");
  c.hello({});
  CHECK(names(c.inserted({})) == "become_ready");
  CHECK(c.ready());

  machine a(side::accepting, "p:1", false);
  a.hello({});
  a.inserted({});
  CHECK(names(a.registered({}, true)) == "report_resources send_hello become_ready");
  CHECK(a.ready());
}

TEST_CASE("peer handshake: the end reports what the rooms need to know", "[unit][peer_handshake]") {
  SECTION("a ready peer declared dead: fenced, cut, unresponsive, peer_lost") {
    auto m = bring_to(side::connecting, phase::ready);
    auto fx = m.lost("peer unresponsive", true);
    CHECK(names(fx) == "closing_with fence");
    fx = m.fenced();
    const auto& d = std::get<report_down>(fx.at(0));
    CHECK(d.cut);
    CHECK(d.was_ready);
    CHECK(d.unresponsive);
    CHECK(m.code() == errc::peer_lost);
  }
  SECTION("a sender-only peer: nothing to fence, the rooms are told at once") {
    machine m(side::connecting, "p:1", false);
    m.start();
    m.registered({}, false);
    m.dialed(dial_outcome::connected, "");
    m.hello({});
    m.inserted({});
    auto fx = m.lost("peer went down");
    CHECK(names(fx) == "closing_with report_down quit");
    const auto& d = std::get<report_down>(fx.at(1));
    CHECK_FALSE(d.cut);  // the Scheduler removes the peer after telling the rooms
    CHECK(d.was_ready);
  }
  SECTION("an address inserted after the close is part of the fence when memory was made") {
    auto m = bring_to(side::connecting, phase::inserting);
    m.lost("stop");
    CHECK(m.engine_calls() == 1);
    CHECK(names(m.inserted({})) == "fence");  // no separate removal: the fence cuts it
    CHECK(names(m.fenced()) == "report_down quit");
  }
}
