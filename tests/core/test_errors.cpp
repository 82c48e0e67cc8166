// core/errors.hpp: the one error vocabulary. Every code has a stable, distinct lower-case name
// (clients and logs match it), and result<T> carries either its value or a code with words.

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "core/errors.hpp"

using namespace ferry;

TEST_CASE("errors: every code has its own stable name", "[unit][errors]") {
  std::set<std::string> names;
  for (auto e : all_errc) {
    const std::string n = to_string(e);
    INFO(static_cast<int>(e) << " is " << n);
    CHECK_FALSE(n.empty());
    CHECK(n.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos);
    CHECK(names.insert(n).second);  // distinct
  }
  CHECK(std::string(to_string(errc::ok)) == "ok");
  CHECK(std::string(to_string(errc::invalid_request)) == "invalid_request");
  CHECK(std::string(to_string(errc::system_error)) == "system_error");
}

TEST_CASE("errors: a result holds its value, or a code and the words that name the problem",
          "[unit][errors]") {
  result<int> ok = 7;
  REQUIRE(ok);
  CHECK(ok.value == 7);
  CHECK(ok.code == errc::ok);
  result<int> bad = error{errc::unknown_room, "unknown room 9"};
  REQUIRE_FALSE(bad);
  CHECK(bad.code == errc::unknown_room);
  CHECK(bad.message == "unknown room 9");
  const auto e = std::move(bad).error();
  CHECK(e.code == errc::unknown_room);
  CHECK(e.message == "unknown room 9");
  result<> nothing;
  CHECK(nothing);
  result<> failed = error{errc::timed_out, "t"};
  CHECK_FALSE(failed);
  CHECK(failed.error().code == errc::timed_out);
}
