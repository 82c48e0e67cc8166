// ferryd's log volume at info (docs/operations.md, "Logs"): a room that succeeds writes no line
// at info on either side, a periodic summary (log.summary_ms) says what the rooms did, and a
// flood of room failures is rate-limited (log.burst) with the count of the lines left out.

#include <fmt/format.h>

#include <regex>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

// Unity builds put this file beside test_logs.cpp: its helpers have names of their own.
namespace {

room_spec volume_room(uint64_t id, uint32_t k) {
  room_spec r;
  r.room = id;
  r.src_pages = range(16 * k, 4);
  r.dst_pages = range(1000 + 16 * k, 4);
  r.src_slot = r.dst_slot = k;
  r.src_row = r.dst_row = k;
  return r;
}

std::vector<std::string> volume_lines(const std::string& log) {
  std::vector<std::string> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

/// The rooms of `side` the summary lines of `log` count as succeeded and as failed, in all.
std::pair<uint64_t, uint64_t> summary_counts(const std::string& log, const std::string& side) {
  const std::regex counts(side + R"( (\d+) succeeded, (\d+) failed)");
  uint64_t ok = 0, failed = 0;
  for (const auto& line : volume_lines(log)) {
    if (line.find(" info [scheduler] rooms in the last ") == std::string::npos) continue;
    std::smatch m;
    if (!std::regex_search(line, m, counts)) continue;
    ok += std::stoull(m[1]);
    failed += std::stoull(m[2]);
  }
  return {ok, failed};
}

/// Wait (bounded: 10 s) until the summaries of `d` count `ok` rooms of `side` as succeeded.
bool summaries_reach(const daemon_proc& d, const std::string& side, uint64_t ok) {
  for (int i = 0; i < 400; ++i) {
    if (summary_counts(d.log_text(), side).first >= ok)
      return summary_counts(d.log_text(), side).first == ok;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

}  // namespace

TEST_CASE(
    "at info a room that succeeds writes no line on either side, and the periodic summary "
    "counts it",
    "[e2e][logs]") {
  shape s;
  s.log_yaml = "{level: info, summary_ms: 200}";
  pair c(s);
  const size_t p_before = c.prefill.log_text().size(), d_before = c.decode.log_text().size();
  constexpr uint32_t rooms = 8;
  for (uint32_t k = 0; k < rooms; ++k) run_and_verify(c, volume_room(700 + k, k));

  // The summary comes within an interval or so; each counts the rooms of its interval.
  CHECK(summaries_reach(c.decode, "decode", rooms));
  CHECK(summaries_reach(c.prefill, "prefill", rooms));
  CHECK(summary_counts(c.decode.log_text(), "decode").second == 0);
  CHECK_THAT(c.decode.log_text(), Catch::Contains(fmt::format("bytes received")));

  // Since the first room, on either side: no line names a room (a peer's connection, once,
  // may be logged: peer events stay at info).
  size_t per_room = 0;
  for (const auto* d : {&c.prefill, &c.decode})
    for (const auto& line :
         volume_lines(d->log_text().substr(d == &c.prefill ? p_before : d_before)))
      if (line.find("room=") != std::string::npos) {
        UNSCOPED_INFO(line);
        ++per_room;
      }
  CHECK(per_room == 0);
}

TEST_CASE(
    "a flood of room failures is rate-limited at info: log.burst lines of a kind, then one "
    "line with the count of those left out",
    "[e2e][logs]") {
  shape s;
  // One interval for the whole test: the count at the stop covers every failure.
  s.log_yaml = "{summary_ms: 3600000, burst: 3}";
  s.slots = 32;  // a state slot and an aux row per room
  pair c(s);
  constexpr uint32_t rooms = 30;
  for (uint32_t k = 0; k < rooms; ++k) {
    auto ok = c.d->prepare({800 + k, {c.prefill.control()}, {2 * k, 2 * k + 1}, k, k});
    INFO(ok.message);
    REQUIRE(ok);
  }
  for (uint32_t k = 0; k < rooms; ++k) REQUIRE(c.d->cancel(800 + k));
  for (uint32_t k = 0; k < rooms; ++k)
    CHECK(wait_done(*c.d, 800 + k).status == room_status::failed);
  REQUIRE(c.decode.stop() == 0);

  const auto log = c.decode.log_text();
  size_t failed_lines = 0, room_lines = 0;
  for (const auto& line : volume_lines(log)) {
    if (line.find("side=decode Failed code=cancelled") != std::string::npos) ++failed_lines;
    if (line.find(" room=8") != std::string::npos) ++room_lines;
  }
  CHECK(failed_lines == 3);
  INFO(log);
  CHECK_THAT(log, Catch::Contains("suppressed 27 similar lines (rooms ended Failed)"));
  // Every kind of per-room line is limited: far fewer lines than rooms.
  CHECK(room_lines < rooms);
  // The summary at the stop counts them all, by code.
  CHECK_THAT(log, Catch::Contains("decode 0 succeeded, 30 failed (cancelled 30)"));
}
