/// The entry point of every test executable, compiled once (tests/CMakeLists.txt) and linked
/// into each: Catch2's implementation is the largest translation unit of the tree.
///
/// Catch2 v2 exits with the number of failed assertions (at most 255), so any skip code would
/// also be the exit of a test with that many failures, and ctest would report the failure as
/// Skipped. Here a failure always exits 1, and only `skip_exit_code` (skip.hpp) means
/// skipped.

#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

int main(int argc, char** argv) { return Catch::Session().run(argc, argv) == 0 ? 0 : 1; }
