#pragma once
/// The exit code ctest reads as Skipped (SKIP_RETURN_CODE in tests/CMakeLists.txt). No test
/// failure exits with it: tests/test_main.cpp maps every failure to 1.

namespace ferry::test {

inline constexpr int skip_exit_code = 77;

}  // namespace ferry::test
