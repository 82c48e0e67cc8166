// The daemon's metrics object (actors/metrics.hpp) on its own, without daemons: each series
// counts one unit, the labels do not collide with Prometheus's own, a peer is one series by its
// node whatever its connections and leaves the scrape after it left, and the commit phase runs
// from the last write's completion.

#include <catch2/catch.hpp>
#include <chrono>

#include "actors/metrics.hpp"
#include "http.hpp"
#include "queries.hpp"

using namespace ferry;
using namespace ferry::test;
using namespace std::chrono_literals;

namespace {

/// How many series of `name` carry all of `labels`.
size_t count_series(const std::string& text, const std::string& name,
                    const std::map<std::string, std::string>& labels) {
  size_t n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + "{", 0) == 0 && series(line, name, labels)) ++n;
  return n;
}

metrics_snapshot two_rails() {
  metrics_snapshot s;
  s.rails.push_back({"0", 2, 8192, 40, 163840});
  s.rails.push_back({"express", 1, 64, 7, 448});
  return s;
}

}  // namespace

TEST_CASE("each metrics series counts one unit: writes and bytes are series of their own",
          "[e2e][metrics]") {
  daemon_metrics m("prefill-0", "7f3a", "prefill", "tcp");
  m.writes_posted(3, 3000);
  auto text = m.exposition(two_rails());
  CHECK(series(text, "ferry_writes_in_flight") == 3);
  CHECK(series(text, "ferry_writes_in_flight_bytes") == 3000);
  CHECK(series(text, "ferry_rail_in_flight", {{"rail", "0"}}) == 2);
  CHECK(series(text, "ferry_rail_in_flight_bytes", {{"rail", "0"}}) == 8192);
  CHECK(series(text, "ferry_rail_in_flight", {{"rail", "express"}}) == 1);
  CHECK(series(text, "ferry_rail_in_flight_bytes", {{"rail", "express"}}) == 64);
  CHECK(series(text, "ferry_rail_posted_total", {{"rail", "0"}}) == 40);
  CHECK(series(text, "ferry_rail_posted_bytes_total", {{"rail", "0"}}) == 163840);
  CHECK(series(text, "ferry_rail_posted_bytes_total", {{"rail", "express"}}) == 448);
  m.writes_completed(3, 0, 0, 3000);
  text = m.exposition(two_rails());
  CHECK(series(text, "ferry_writes_in_flight") == 0);
  CHECK(series(text, "ferry_writes_in_flight_bytes") == 0);
  // A failed room's batch: 2 writes completed, 3 never posted (cancelled); none stays in flight.
  m.writes_posted(5, 5000);
  m.writes_completed(2, 0, 3, 5000);
  text = m.exposition(two_rails());
  CHECK(series(text, "ferry_writes_in_flight") == 0);
  CHECK(series(text, "ferry_writes_in_flight_bytes") == 0);
  CHECK(series(text, "ferry_writes_total", {{"event", "skipped"}}) == 3);
  CHECK(series(text, "ferry_writes_total", {{"event", "completed"}}) == 5);
  served_series served;
  served.add(text);
  for (const auto& [family, labels] : served.families) {
    INFO(family);
    CHECK(labels.count("unit") == 0);
  }
}

TEST_CASE("ferry_info names the daemon by node and instance_id, leaving instance to Prometheus",
          "[e2e][metrics]") {
  daemon_metrics m("decode-3", "5c1d9e", "decode", "shm");
  const auto text = m.exposition({});
  CHECK(series(text, "ferry_info",
               {{"node", "decode-3"},
                {"instance_id", "5c1d9e"},
                {"role", "decode"},
                {"provider", "shm"}}) == 1);
  served_series served;
  served.add(text);
  for (const auto& [family, labels] : served.families) {
    INFO(family);
    CHECK(labels.count("instance") == 0);  // Prometheus's target label: it would be renamed
  }
}

TEST_CASE("a peer is one series by its node across reconnects, and leaves the scrape after it left",
          "[e2e][metrics]") {
  int64_t now = 1'000'000;
  daemon_metrics m("prefill-0", "7f3a", "prefill", "tcp", [&] { return now; });
  const std::map<std::string, std::string> lost{{"peer", "decode-0"}, {"event", "lost"}};
  const std::map<std::string, std::string> fenced{{"peer", "decode-0"}, {"event", "fenced"}};

  auto h = m.peer_ready("decode-0");
  auto text = m.exposition({});
  // At 0 while connected, so the first loss is an increase Prometheus sees.
  CHECK(series(text, "ferry_peer_events_total", lost) == 0);
  CHECK(series(text, "ferry_peer_events_total", fenced) == 0);
  now += 1500;
  CHECK(series(m.exposition({}), "ferry_peer_heartbeat_age_seconds", {{"peer", "decode-0"}}) ==
        1.5);

  // The decode restarts: a new instance of the same node, whose connection is ready before
  // the old one has ended. One series throughout.
  auto again = m.peer_ready("decode-0");
  text = m.exposition({});
  CHECK(count_series(text, "ferry_peer_heartbeat_age_seconds", {{"peer", "decode-0"}}) == 1);
  CHECK(series(text, "ferry_peer_heartbeat_age_seconds", {{"peer", "decode-0"}}) == 0);
  m.peer_fenced("decode-0");
  m.peer_lost("decode-0");
  h.reset();
  text = m.exposition({});
  CHECK(count_series(text, "ferry_peer_events_total", lost) == 1);
  CHECK(series(text, "ferry_peer_events_total", lost) == 1);
  CHECK(series(text, "ferry_peer_events_total", fenced) == 1);
  CHECK(count_series(text, "ferry_peer_heartbeat_age_seconds", {{"peer", "decode-0"}}) == 1);

  // A peer still connected keeps its series however long ago its last event was.
  now += 10 * daemon_metrics::departed_peer_retention_ms;
  CHECK(series(m.exposition({}), "ferry_peer_events_total", lost) == 1);

  // It leaves for good: its series stay long enough for any alert to see the loss, then go.
  m.peer_lost("decode-0");
  again.reset();
  text = m.exposition({});
  CHECK(series(text, "ferry_peer_events_total", lost) == 2);
  CHECK_FALSE(series(text, "ferry_peer_heartbeat_age_seconds").has_value());
  now += daemon_metrics::departed_peer_retention_ms - 1;
  CHECK(series(m.exposition({}), "ferry_peer_events_total", lost) == 2);
  now += 2;
  text = m.exposition({});
  CHECK_FALSE(series(text, "ferry_peer_events_total", {{"peer", "decode-0"}}).has_value());
  CHECK(text.find("decode-0") == std::string::npos);

  // Back after that: its series start again at 0.
  auto back = m.peer_ready("decode-0");
  CHECK(series(m.exposition({}), "ferry_peer_events_total", lost) == 0);
}

TEST_CASE("the commit phase runs from the last write's completion, or the announcement, to Success",
          "[e2e][metrics]") {
  const auto t0 = std::chrono::steady_clock::time_point{} + 1h;
  SECTION("prefill: announced once posted, then its writes complete") {
    commit_clock c;
    c.announced(t0 + 1ms);
    c.write_done(t0 + 4ms);
    c.write_done(t0 + 9ms);
    CHECK(c.seconds_to(t0 + 10ms).value_or(-1) == Approx(0.001));
  }
  SECTION("decode: the writes land before the totals are heard") {
    commit_clock c;
    c.write_done(t0 + 2ms);
    c.write_done(t0 + 3ms);
    c.announced(t0 + 5ms);
    CHECK(c.seconds_to(t0 + 7ms).value_or(-1) == Approx(0.002));
  }
  SECTION("a room that never reached its announcement has no commit") {
    commit_clock c;
    c.write_done(t0 + 2ms);
    CHECK_FALSE(c.seconds_to(t0 + 7ms).has_value());
  }
}
