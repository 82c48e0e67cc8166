// ferryd's logs and the operator's requests on the client socket, against real daemons: the
// JSON format (one object per line, UTC, the room's fields), per-logger levels from the config
// and changed while ferryd runs (`ferryctl log-level`), and `ferryctl drain`, which drains as
// SIGTERM does.

#include <fmt/format.h>

#include <regex>
#include <set>

#include "ferryctl.hpp"
#include "harness.hpp"
#include "info.hpp"

using namespace ferry;
using namespace ferry::test;
using namespace std::chrono_literals;

namespace {

room_spec small_room(uint64_t id, uint32_t k, std::vector<uint32_t> chunks = {4}) {
  room_spec r;
  r.room = id;
  uint32_t pages = 0;
  for (auto c : chunks) pages += c;
  r.src_pages = range(16 * k, pages);
  r.dst_pages = range(1000 + 16 * k, pages);
  r.chunks = std::move(chunks);
  r.src_slot = r.dst_slot = k;
  r.src_row = r.dst_row = k;
  return r;
}

/// Every line of a JSON log, parsed; a line that is not one JSON object fails the test.
std::vector<json> json_lines(const std::string& log) {
  std::vector<json> out;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    INFO("log line: " << line);
    auto j = json::parse(line, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    REQUIRE(j.is_object());
    out.push_back(std::move(j));
  }
  return out;
}

/// The one JSON document a `--json` ferryctl command printed, with its exit code checked.
json ctl_doc(const ctl_result& r, int code) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.code == code);
  auto doc = json::parse(r.out, nullptr, false);
  REQUIRE_FALSE(doc.is_discarded());
  return doc;
}

}  // namespace

TEST_CASE(
    "log.format json: every line is one object with UTC time, level and logger, and a room's "
    "outcome carries its room, peer, side and code as fields, and log.levels sets each logger",
    "[e2e][logs]") {
  shape s;
  // scheduler: debug, for the line of the room that succeeds (at info only failures are).
  s.log_yaml = "{format: json, levels: {peer: warn, room: debug, scheduler: debug}}";
  pair c(s);
  auto ok = small_room(900, 0);
  run_and_verify(c, ok);
  auto cancelled = small_room(901, 1);
  stage(c, cancelled);
  prepare(c, cancelled);
  REQUIRE(c.d->cancel(cancelled.room));
  CHECK(wait_done(*c.d, cancelled.room).status == room_status::failed);
  REQUIRE(c.decode.stop() == 0);

  const std::regex utc(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)");
  bool success_line = false, cancelled_line = false, room_debug = false;
  for (const auto& j : json_lines(c.decode.log_text())) {
    INFO(j.dump());
    REQUIRE(j.contains("ts"));
    CHECK(std::regex_match(j["ts"].get<std::string>(), utc));
    CHECK(j.contains("msg"));
    const auto logger = j.value("logger", ""), level = j.value("level", "");
    CHECK(std::set<std::string>{"ferryd", "scheduler", "room", "peer", "client", "transport"}.count(
              logger) == 1);
    // peer: warn in the config: its info lines ("peer=... connected") are not written.
    if (logger == "peer") CHECK((level == "warn" || level == "error"));
    if (logger == "room" && level == "debug") room_debug = true;
    if (logger != "scheduler" || j.value("side", "") != "decode") continue;
    if (j.value("room", uint64_t{0}) == ok.room) {
      success_line = true;
      CHECK(j["peer"] == c.prefill.control());
      CHECK_FALSE(j.contains("code"));
      CHECK_THAT(j["msg"].get<std::string>(), Catch::Contains("Success"));
    }
    if (j.value("room", uint64_t{0}) == cancelled.room) {
      cancelled_line = true;
      CHECK(j["code"] == "cancelled");
      CHECK_THAT(j["msg"].get<std::string>(), Catch::EndsWith("cancelled by client"));
    }
  }
  CHECK(success_line);
  CHECK(cancelled_line);
  CHECK(room_debug);  // room: debug in the config, above log.level info
}

TEST_CASE(
    "ferryctl log-level shows every logger's level, changes one or all while ferryd runs, and "
    "names an unknown logger or level",
    "[e2e][logs][ferryctl]") {
  pair c;
  const auto& D = c.decode.socket();
  // The text format (the default) is in UTC too, and says so.
  CHECK(std::regex_search(
      c.decode.log_text(),
      std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z info \[ferryd\] starting)")));
  auto shown = ctl_doc(ferryctl(c.dir, D, {"log-level", "--json"}), 0);
  CHECK(shown["format"] == "text");
  CHECK(shown["levels"] == json({{"ferryd", "info"},
                                 {"scheduler", "info"},
                                 {"room", "info"},
                                 {"peer", "info"},
                                 {"client", "info"},
                                 {"transport", "info"}}));

  // At info, a room's debug lines are not written; at debug, they are.
  const auto quiet = small_room(910, 0);
  run_and_verify(c, quiet);
  CHECK_THAT(c.decode.log_text(), !Catch::Contains(fmt::format("room={} peer=", quiet.room) +
                                                   c.prefill.control() + " prepare:"));
  auto set = ctl_doc(ferryctl(c.dir, D, {"log-level", "debug", "--logger", "room", "--json"}), 0);
  CHECK(set["levels"]["room"] == "debug");
  CHECK(set["levels"]["peer"] == "info");
  const auto loud = small_room(911, 1);
  run_and_verify(c, loud);
  CHECK(
      log_shows(c.decode, fmt::format("room={} peer={} prepare:", loud.room, c.prefill.control())));
  CHECK(log_shows(c.decode, "client conn="));  // who changed it is logged
  CHECK_THAT(c.decode.log_text(), Catch::Contains("set the log level of room to debug"));

  // Without --logger: every logger. As text: one line per logger.
  auto all = ferryctl(c.dir, D, {"log-level", "warn"});
  CHECK(all.code == 0);
  CHECK_THAT(all.out, Catch::Contains("transport  warn\n"));
  CHECK_THAT(all.out, Catch::Contains("ferryd     warn\n"));

  auto bad_level = ferryctl(c.dir, D, {"log-level", "loud", "--json"});
  CHECK(ctl_doc(bad_level, 1)["error"]["message"] ==
        "unknown log level 'loud': expected one of trace, debug, info, warn, error, off");
  auto bad_logger = ferryctl(c.dir, D, {"log-level", "debug", "--logger", "fabric"});
  CHECK(bad_logger.code == 1);
  CHECK_THAT(bad_logger.err,
             Catch::Contains("unknown logger 'fabric': ferryd's loggers are ferryd, scheduler, "
                             "room, peer, client, transport"));
  // Nothing changed by the refused requests; the daemon serves on.
  CHECK(ctl_doc(ferryctl(c.dir, D, {"log-level", "--json"}), 0)["levels"]["room"] == "warn");
  run_and_verify(c, small_room(912, 2));
}

TEST_CASE(
    "ferryctl drain drains as SIGTERM does: the accepted room finishes, new ones get 407, "
    "asking again never stops at once, and --wait returns once ferryd exited 0",
    "[e2e][logs][ferryctl][drain]") {
  pair c;
  const auto& P = c.prefill.socket();
  auto r = small_room(920, 0, {4, 4});
  stage(c, r);
  prepare(c, r);
  send_chunk(*c.p, r, 0);
  wait_status(*c.d, r.room, room_status::transferring);
  REQUIRE(c.p->subscribe(r.room));

  auto first = ctl_doc(ferryctl(c.dir, P, {"drain", "--json"}), 0);
  CHECK(first == json({{"draining", true}}));
  REQUIRE(log_shows(c.prefill, "draining: 1 prefill and 0 decode rooms accepted"));
  CHECK(log_shows(c.prefill, "a client asked for a drain"));
  // Again while it drains: the same answer, and the drain goes on (a second SIGTERM would
  // have stopped it at once and failed the room).
  CHECK(ferryctl(c.dir, P, {"drain"}).out == "draining\n");
  auto refused = c.p->send({921, {1}, false, no_index, no_index});
  CHECK(refused.code == errc::draining);
  auto status = json::parse(c.p->info(proto::info_topic::status).value);
  CHECK(status["draining"] == true);

  send_rest(*c.p, r, 1);
  auto de = wait_done(*c.d, r.room);
  INFO(de.reason);
  CHECK(de.status == room_status::success);
  CHECK(client::verify_room(*c.d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
  CHECK(c.prefill.wait_exit() == 0);
  CHECK_THAT(c.prefill.log_text(), !Catch::Contains("stopping at once"));

  // --wait: returns once the daemon is gone.
  auto waited = ctl_doc(ferryctl(c.dir, c.decode.socket(), {"drain", "--wait", "--json"}), 0);
  CHECK(waited == json({{"draining", true}, {"stopped", true}}));
  CHECK(c.decode.wait_exit() == 0);
  // A daemon that is not there: exit 3.
  CHECK(ferryctl(c.dir, c.decode.socket(), {"drain"}).code == 3);
}

TEST_CASE(
    "the text log escapes control characters a client supplied: a peer address with a newline "
    "forges no line",
    "[e2e][logs]") {
  pair c;
  // A newline and a forged record, a carriage return, a terminal escape and DEL.
  const std::string hostile = "x\nerror [ferryd] forged\r\x1b[2J\x7f:7401";
  auto r = c.d->prepare({913, {hostile}, {1, 2}, no_index, no_index});
  CHECK_FALSE(r);  // not host:port: refused, and the refusal is logged
  // The escaped form, on the line of the refusal.
  REQUIRE(log_shows(c.decode, "x\\nerror [ferryd] forged\\r\\x1b[2J\\x7f:7401"));
  std::istringstream in(c.decode.log_text());
  for (std::string line; std::getline(in, line);) {
    INFO(line);
    CHECK_THAT(line, !Catch::StartsWith("error [ferryd] forged"));
    CHECK(line.find_first_of("\r\x1b\x7f") == std::string::npos);
  }
  // The daemon serves on.
  run_and_verify(c, small_room(914, 0));
}
