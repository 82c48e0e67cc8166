// The runner first: it includes Catch2 with its implementation (CATCH_CONFIG_RUNNER).
// clang-format off
#include "test_main.hpp"
#include "netns.hpp"
// clang-format on

namespace {

/// Notes whether the running test case has a failed assertion, so the cluster tests can print
/// the daemons' logs for a failed CHECK too (a REQUIRE is seen through the unwinding).
struct failure_listener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const&) override {
    ferry::test::netns::test_failed() = false;
  }
  bool assertionEnded(Catch::AssertionStats const& s) override {
    if (!s.assertionResult.isOk()) ferry::test::netns::test_failed() = true;
    return true;
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(failure_listener)
