#pragma once
/// Whether the shm provider can use cross-memory attach (CMA: process_vm_readv/writev between
/// ferryd processes) here. ferryd logs the outcome at start (engine::open), and refuses the shm
/// provider without it (docs/reliability.md: piecewise copies would defeat the fence). In a
/// container CMA usually needs `--cap-add SYS_PTRACE` (docs/install.md).

#include <string>

namespace ferry::transport {

struct cma_check {
  std::string disabled_by;      ///< "FI_SHM_DISABLE_CMA=1" when the environment turns it off
  int ptrace_scope = -1;        ///< kernel.yama.ptrace_scope; -1 without Yama (no restriction)
  bool cap_sys_ptrace = false;  ///< CAP_SYS_PTRACE in the effective set
  /// process_vm_readv of this process's own memory: "" when it worked, else why not (a seccomp
  /// filter answers EPERM, a kernel without CONFIG_CROSS_MEMORY_ATTACH ENOSYS).
  std::string self_read_error;

  /// Why shm cannot use CMA, or "" when it can.
  std::string why_not() const;
  /// The log line: "cross-memory attach ... available (...)" or "... unavailable: why".
  std::string describe() const;
};

/// Look at this process and this machine now (cheap: two /proc reads and one syscall).
cma_check check_cma();

}  // namespace ferry::transport
