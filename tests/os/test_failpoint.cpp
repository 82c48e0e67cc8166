// Failpoints (os/failpoint.hpp): which FERRY_FAILPOINTS texts make which failpoints fire, how
// often, what active_failpoints() reports for the start-up log, and which texts are refused. The
// variable is read once per process, at the first check (a function-local static in failpoint.cpp),
// so each case runs this executable again as a child with a FERRY_FAILPOINTS of its choosing, on
// the hidden probe case below, and asserts on the answers the child wrote down.
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "os/failpoint.hpp"

extern char** environ;

namespace {

/// How many times the probe checks each failpoint: enough to tell once, a few times and every
/// time apart.
constexpr int checks = 5;

/// Every check answered true, and none did.
const std::string always(checks, '1');
const std::string never(checks, '0');

/// What a child process answered: active_failpoints(), and for each name probed its answers to
/// `checks` checks in order ('1' fired, '0' did not).
struct answers {
  std::string active;
  std::string invalid;  ///< failpoints_invalid()
  std::map<std::string, std::string> fired;
};

/// Runs this executable on the probe case with FERRY_FAILPOINTS set to `value` (unset when
/// there is none) and asks it about `names`; the child must pass.
answers probe(const std::optional<std::string>& value, const std::vector<std::string>& names) {
  char tmpl[] = "/tmp/ferry-failpoint-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const std::filesystem::path dir = tmpl;
  const std::string report = (dir / "answers").string();
  const std::string log = (dir / "child.log").string();

  // The child's environment: this one without any failpoint setting, then the chosen one. Each
  // name ends with a newline, so an empty name is a line of its own.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    if (kv.starts_with("FERRY_FAILPOINTS=") || kv.starts_with("FERRY_TEST_FAILPOINT_")) continue;
    env.emplace_back(kv);
  }
  if (value) env.push_back("FERRY_FAILPOINTS=" + *value);
  std::string joined;
  for (const auto& n : names) joined += n + '\n';
  env.push_back("FERRY_TEST_FAILPOINT_NAMES=" + joined);
  env.push_back("FERRY_TEST_FAILPOINT_REPORT=" + report);
  std::vector<char*> envp;
  for (auto& kv : env) envp.push_back(kv.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, log.c_str(), O_WRONLY | O_CREAT, 0600);
  posix_spawn_file_actions_adddup2(&fa, STDOUT_FILENO, STDERR_FILENO);
  std::string exe = "/proc/self/exe";
  std::string name = "failpoint probe of this process";
  char* argv[] = {exe.data(), name.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, exe.c_str(), &fa, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&fa);
  REQUIRE(rc == 0);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);

  std::stringstream child_output;
  child_output << std::ifstream(log).rdbuf();
  answers a;
  std::ifstream in(report);
  const bool have_active = static_cast<bool>(std::getline(in, a.active)) &&
                           static_cast<bool>(std::getline(in, a.invalid));
  for (const auto& n : names) {
    std::string line;
    if (std::getline(in, line)) a.fired[n] = line;
  }
  in.close();
  std::filesystem::remove_all(dir);

  INFO("FERRY_FAILPOINTS=" << value.value_or("(unset)") << "; the child said:\n"
                           << child_output.str());
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  REQUIRE(have_active);
  REQUIRE(a.fired.size() == names.size());
  return a;
}

}  // namespace

// Run only when named, by probe() in a child process: checks each failpoint of
// FERRY_TEST_FAILPOINT_NAMES `checks` times and writes the answers to
// FERRY_TEST_FAILPOINT_REPORT, after the text of active_failpoints().
TEST_CASE("failpoint probe of this process", "[.][failpoint_probe]") {
  const char* names = std::getenv("FERRY_TEST_FAILPOINT_NAMES");
  const char* report = std::getenv("FERRY_TEST_FAILPOINT_REPORT");
  REQUIRE(names != nullptr);
  REQUIRE(report != nullptr);
  std::ofstream out(report);
  out << ferry::os::active_failpoints() << '\n';
  out << ferry::os::failpoints_invalid() << '\n';
  std::istringstream in(names);
  for (std::string name; std::getline(in, name);) {
    std::string fired;
    for (int i = 0; i < checks; ++i) fired += ferry::os::failpoint(name) ? '1' : '0';
    out << fired << '\n';
  }
  out.close();
  REQUIRE(out.good());
}

TEST_CASE("a failpoint named without a count fires at every check", "[unit][failpoint]") {
  const auto a = probe("receiver_throw_on_accepted", {"receiver_throw_on_accepted"});
  CHECK(a.fired.at("receiver_throw_on_accepted") == always);
}

TEST_CASE("a failpoint with a count fires at that many first checks, then never",
          "[unit][failpoint]") {
  CHECK(probe("alpha=1", {"alpha"}).fired.at("alpha") == "10000");
  CHECK(probe("alpha=3", {"alpha"}).fired.at("alpha") == "11100");
  CHECK(probe("alpha=0", {"alpha"}).fired.at("alpha") == never);
}

TEST_CASE("a failpoint that is not set never fires", "[unit][failpoint]") {
  SECTION("FERRY_FAILPOINTS unset") {
    const auto a = probe(std::nullopt, {"alpha", ""});
    CHECK(a.fired.at("alpha") == never);
    CHECK(a.fired.at("") == never);
  }
  SECTION("FERRY_FAILPOINTS empty") {
    const auto a = probe("", {"alpha", ""});
    CHECK(a.fired.at("alpha") == never);
    CHECK(a.fired.at("") == never);
  }
  SECTION("another name set: names match whole, case and all") {
    const auto a = probe("alpha", {"alpha", "alph", "alphabet", "Alpha", "beta"});
    CHECK(a.fired.at("alpha") == always);
    CHECK(a.fired.at("alph") == never);
    CHECK(a.fired.at("alphabet") == never);
    CHECK(a.fired.at("Alpha") == never);
    CHECK(a.fired.at("beta") == never);
  }
}

TEST_CASE("several failpoints are separated by commas, each with its own count",
          "[unit][failpoint]") {
  SECTION("names with and without counts") {
    const auto a = probe("alpha,beta=2,gamma=1", {"alpha", "beta", "gamma"});
    CHECK(a.fired.at("alpha") == always);
    CHECK(a.fired.at("beta") == "11000");
    CHECK(a.fired.at("gamma") == "10000");
  }
  SECTION("empty items are skipped") {
    const auto a = probe(",alpha,,beta=1,", {"alpha", "beta", ""});
    CHECK(a.fired.at("alpha") == always);
    CHECK(a.fired.at("beta") == "10000");
    CHECK(a.fired.at("") == never);
  }
  SECTION("only a comma separates: a blank or another mark in a name refuses the setting") {
    const auto a = probe("alpha, beta,gamma;delta", {"alpha", "beta", " beta", "gamma;delta"});
    CHECK(a.fired.at("alpha") == never);
    CHECK(a.fired.at(" beta") == never);
    CHECK(a.invalid ==
          "FERRY_FAILPOINTS='alpha, beta,gamma;delta': item ' beta': a failpoint "
          "name is lower-case letters, digits and '_'");
  }
  SECTION("a name given twice takes its last count") {
    const auto a = probe("alpha=1,alpha,beta,beta=2", {"alpha", "beta"});
    CHECK(a.fired.at("alpha") == always);
    CHECK(a.fired.at("beta") == "11000");
  }
}

TEST_CASE("active_failpoints gives FERRY_FAILPOINTS as it was set", "[unit][failpoint]") {
  CHECK(probe(std::nullopt, {}).active == "");
  CHECK(probe("", {}).active == "");
  // Not normalised: order, empty items and counts that never fire stay as given.
  CHECK(probe("beta=2,alpha", {}).active == "beta=2,alpha");
  CHECK(probe(",,", {}).active == ",,");
  CHECK(probe("alpha=0", {}).active == "alpha=0");
  CHECK(probe("alpha=abc", {}).active == "alpha=abc");
}

TEST_CASE("a malformed setting sets no failpoint and names the item that is wrong",
          "[unit][failpoint]") {
  for (const std::string bad : {"none=abc", "empty=", "trail=2x", "blank= 2", "neg=-1", "twice=1=2",
                                "huge=99999999999999999999", "=2", "Alpha", "a b", "ok,x=abc"}) {
    INFO("FERRY_FAILPOINTS=" << bad);
    const auto a = probe(bad, {"none", "ok", "x"});
    CHECK(a.fired.at("none") == never);
    CHECK(a.fired.at("ok") == never);  // not even the well-formed items of a refused setting
    CHECK_THAT(a.invalid, Catch::StartsWith("FERRY_FAILPOINTS='" + bad + "': item '"));
  }
  CHECK(probe("trail=2x", {}).invalid ==
        "FERRY_FAILPOINTS='trail=2x': item 'trail=2x': the count after '=' must be a whole "
        "number of firings (0..999999999)");
  CHECK(probe("Alpha", {}).invalid ==
        "FERRY_FAILPOINTS='Alpha': item 'Alpha': a failpoint name is lower-case letters, digits "
        "and '_'");
  CHECK(probe("alpha=2,beta", {}).invalid.empty());
  CHECK(probe(std::nullopt, {}).invalid.empty());
}
