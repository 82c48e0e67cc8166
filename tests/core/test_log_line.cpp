// The JSON log line (core/log_line.hpp): fields from the message's own leading words only,
// escapes, invalid UTF-8 replaced, UTC time to the microsecond.
#include <catch2/catch.hpp>

#include "core/log_line.hpp"

using namespace ferry;

namespace {
const auto t0 = std::chrono::system_clock::time_point(std::chrono::microseconds(1764674400123456));
}

TEST_CASE("json log line: fields from the leading words, UTC time", "[unit][logs]") {
  CHECK(json_log_line(t0, "info", "scheduler",
                      "room=7 peer=10.0.0.2:7401 side=decode Failed code=peer_lost: gone") ==
        R"({"ts":"2025-12-02T11:20:00.123456Z","level":"info","logger":"scheduler","room":7,)"
        R"("room_id":"7","peer":"10.0.0.2:7401","side":"decode","code":"peer_lost","msg":"room=7 )"
        R"(peer=10.0.0.2:7401 side=decode Failed code=peer_lost: gone"})");
  // Words after the first ": " are another party's text: they add no field.
  CHECK(json_log_line(t0, "warn", "client", "client conn=3 sent a bad frame: room=9 code=x") ==
        R"({"ts":"2025-12-02T11:20:00.123456Z","level":"warn","logger":"client","conn":3,)"
        R"("conn_id":"3","msg":"client conn=3 sent a bad frame: room=9 code=x"})");
  // The first occurrence wins; a room that is not a number stays a string.
  CHECK(json_log_line(t0, "info", "room", "room=abc room=5 done") ==
        R"({"ts":"2025-12-02T11:20:00.123456Z","level":"info","logger":"room","room":"abc",)"
        R"("msg":"room=abc room=5 done"})");
}

TEST_CASE("json log line: a u64 id is also a string, exact beyond 2^53", "[unit][logs]") {
  CHECK(
      json_log_line(t0, "info", "scheduler", "room=18446744073709551615 conn=9007199254740993 x") ==
      R"({"ts":"2025-12-02T11:20:00.123456Z","level":"info","logger":"scheduler",)"
      R"("room":18446744073709551615,"room_id":"18446744073709551615",)"
      R"("conn":9007199254740993,"conn_id":"9007199254740993",)"
      R"("msg":"room=18446744073709551615 conn=9007199254740993 x"})");
}

TEST_CASE("json log line: every string is valid JSON, whatever its bytes", "[unit][logs]") {
  std::string out;
  append_json_string(out, "a\"b\\c\nd\te\x01 \xC3\xA9 \xFF \xE2\x82");
  CHECK(out == "\"a\\\"b\\\\c\\nd\\te\\u0001 \xC3\xA9 \xEF\xBF\xBD \xEF\xBF\xBD\xEF\xBF\xBD\"");
  out.clear();
  append_json_string(out, "\xED\xA0\x80");  // a UTF-16 surrogate encoded as UTF-8: not valid
  CHECK(out == "\"\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\"");
}

TEST_CASE("text log escape: control characters cannot start a line or drive a terminal",
          "[unit][logs]") {
  CHECK_FALSE(needs_text_log_escape("room=7 peer=10.0.0.2:7401 \\n \xC3\xA9 \xE2\x80\xA8"));
  CHECK(text_log_escape("plain \\ text \xC3\xA9") == "plain \\ text \xC3\xA9");
  const std::string hostile =
      "x\nerror [ferryd] forged\r\t\x1b[2J\x01\x7f\xC2\x85"
      "end\xC2";
  CHECK(needs_text_log_escape(hostile));
  CHECK(text_log_escape(hostile) ==
        "x\\nerror [ferryd] forged\\r\\t\\x1b[2J\\x01\\x7f\\u0085end\xC2");
  CHECK(text_log_escape(std::string("a\0b", 3)) == "a\\x00b");
}
