// tests/test_main.hpp: a failing test exits 1 whatever its count of failed assertions, so ctest
// never reads a failure as the skip code (tests/skip.hpp). The failing cases are hidden ([.]):
// they run only when named, here, in a child process.

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <string>

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
