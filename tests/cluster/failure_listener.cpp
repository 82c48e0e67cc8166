// The cluster tests' Catch2 listener (the runner is tests/test_main.cpp).
// Catch2 v2 declares its listener base only where external interfaces are asked for.
#define CATCH_CONFIG_EXTERNAL_INTERFACES
#include <catch2/catch.hpp>

#include "netns.hpp"

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
