// Exit codes, of the tests and of the tools.
// - tests/test_main.cpp: a failing test exits 1 whatever its count of failed assertions, so
//   ctest never reads a failure as the skip code (tests/skip.hpp). The failing cases are hidden
//   ([.]): they run only when named, here, in a child process.
// - core/exit_codes.hpp: the codes every Ferry tool exits with, each distinct, clear of what
//   shells and ctest give a meaning, mapped from client errors, and tabled in docs/cli.md.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "core/exit_codes.hpp"
#include "skip.hpp"

extern char** environ;

namespace {

void fail_times(int n) {
  for (int i = 0; i < n; ++i) CHECK(i < 0);
}

/// Runs this executable on test case `name`, its output discarded; its exit status.
int run_self(const std::string& name) {
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), const_cast<char*>(name.c_str()), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  return WEXITSTATUS(status);
}

}  // namespace

TEST_CASE("self check fails as often as the skip code", "[.][self_check]") {
  fail_times(ferry::test::skip_exit_code);
}
TEST_CASE("self check fails four times", "[.][self_check]") { fail_times(4); }
TEST_CASE("self check passes", "[.][self_check]") { CHECK(true); }

TEST_CASE("a failing test exits 1, never the code ctest reads as skipped", "[unit][exit_codes]") {
  CHECK(run_self("self check passes") == 0);
  CHECK(run_self("self check fails four times") == 1);
  CHECK(run_self("self check fails as often as the skip code") == 1);
}

TEST_CASE("the tools' exit codes are distinct and clear of the shell's and ctest's",
          "[unit][exit_codes]") {
  std::set<int> codes;
  std::set<std::string> names;
  for (const auto& e : ferry::exit_code::all) {
    INFO(e.name);
    CHECK(codes.insert(e.code).second);
    CHECK(names.insert(e.name).second);
    CHECK(e.code != ferry::test::skip_exit_code);
    CHECK(e.code < 64);  // 64..78 are sysexits, 126..127 the shell's, 128+ signals
  }
  CHECK(ferry::exit_code::ok == 0);
  CHECK(ferry::exit_code::failed == 1);
  CHECK(ferry::exit_code::usage == 2);
  CHECK(ferry::exit_code::unreachable == 3);
  CHECK(ferry::exit_code::timed_out == 4);
  CHECK(ferry::exit_code::could_not_start == 5);
  CHECK(ferry::exit_code::forced_stop == 6);
}

TEST_CASE("a client error maps to an exit code by whether the connection was lost",
          "[unit][exit_codes]") {
  using namespace ferry;
  CHECK(exit_code::for_error(errc::ok, false) == exit_code::ok);
  CHECK(exit_code::for_error(errc::unknown_room, false) == exit_code::failed);
  CHECK(exit_code::for_error(errc::peer_unreachable, false) == exit_code::failed);  // ferryd's
  CHECK(exit_code::for_error(errc::timed_out, false) == exit_code::timed_out);
  CHECK(exit_code::for_error(errc::peer_lost, true) == exit_code::unreachable);
  CHECK(exit_code::for_error(errc::timed_out, true) == exit_code::unreachable);
}

TEST_CASE("docs/cli.md tables every exit code", "[unit][exit_codes]") {
  const char* dir = std::getenv("FERRY_SOURCE_DIR");
  std::ifstream f(std::string(dir ? dir : FERRY_DEFAULT_SOURCE_DIR) + "/docs/cli.md");
  REQUIRE(f);
  std::stringstream text;
  text << f.rdbuf();
  for (const auto& e : ferry::exit_code::all) {
    INFO(e.name);
    CHECK_THAT(text.str(),
               Catch::Contains("| " + std::to_string(e.code) + " | `" + e.name + "` |"));
  }
}
