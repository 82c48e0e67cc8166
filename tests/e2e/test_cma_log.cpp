// ferryd says at start whether the shm provider could use cross-memory attach here, with the
// outcome of the same check (transport/cma_check.hpp) run in this test process, whose
// environment, credentials and seccomp filter the daemon inherits.

#include "harness.hpp"
#include "transport/cma_check.hpp"

using namespace ferry;
using namespace ferry::test;

TEST_CASE("ferryd logs whether cross-memory attach is available, as the check finds it here",
          "[e2e][cma]") {
  temp_dir dir;
  shape s;
  s.pages = 64;
  s.slots = 2;
  daemon_proc d(dir, "cma-log", "decode", s);
  const auto expected = transport::check_cma().describe();
  INFO(d.log_text());
  CHECK(d.log_text().find(expected) != std::string::npos);
  CHECK(d.stop() == 0);
}
