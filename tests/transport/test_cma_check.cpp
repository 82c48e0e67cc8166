// The cross-memory attach check (transport/cma_check.hpp) on this machine: what it reads agrees
// with /proc, the environment switch is named, and the log line says available or unavailable
// with the reason. (tests/e2e/test_cma_log.cpp: ferryd logs this line at start.)
#include <sys/uio.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <fstream>
#include <string>

#include "transport/cma_check.hpp"

using namespace ferry::transport;

TEST_CASE("the CMA check reads this machine's ptrace scope and a real process_vm_readv",
          "[fabric][cma]") {
  ::unsetenv("FI_SHM_DISABLE_CMA");
  const auto c = check_cma();
  int scope = -1;
  if (std::ifstream f("/proc/sys/kernel/yama/ptrace_scope"); f) f >> scope;
  CHECK(c.ptrace_scope == scope);
  CHECK(c.disabled_by.empty());
  // Our own process, read independently of the check.
  uint64_t source = 42, copy = 0;
  iovec l{&copy, sizeof copy}, r{&source, sizeof source};
  const bool self_ok = process_vm_readv(getpid(), &l, 1, &r, 1, 0) == sizeof copy && copy == 42;
  CHECK(c.self_read_error.empty() == self_ok);
  const bool expect_usable = self_ok && (scope <= 0 || (scope < 3 && c.cap_sys_ptrace));
  INFO(c.describe());
  CHECK(c.why_not().empty() == expect_usable);
  CHECK_THAT(
      c.describe(),
      Catch::StartsWith(expect_usable ? "cross-memory attach for the shm provider: available ("
                                      : "cross-memory attach for the shm provider: unavailable ("));
}

TEST_CASE("the CMA check names FI_SHM_DISABLE_CMA when it turns CMA off", "[fabric][cma]") {
  ::setenv("FI_SHM_DISABLE_CMA", "1", 1);
  const auto c = check_cma();
  ::unsetenv("FI_SHM_DISABLE_CMA");
  CHECK(c.disabled_by == "FI_SHM_DISABLE_CMA=1");
  CHECK(c.why_not() == "FI_SHM_DISABLE_CMA=1 is set");
  CHECK_THAT(c.describe(),
             Catch::StartsWith("cross-memory attach for the shm provider: unavailable "
                               "(FI_SHM_DISABLE_CMA=1 is set; ") &&
                 Catch::EndsWith("fabric provider shm would be refused, tcp and RDMA providers "
                                 "are unaffected"));
}
