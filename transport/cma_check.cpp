// Whether the shm provider can use cross-memory attach: the environment, Yama's ptrace scope,
// CAP_SYS_PTRACE, and a process_vm_readv of our own memory.
#include "transport/cma_check.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry::transport {
namespace {

int read_ptrace_scope() {
  int scope = -1;
  if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (std::fscanf(f, "%d", &scope) != 1) scope = -1;
    std::fclose(f);
  }
  return scope;
}

bool has_cap_sys_ptrace() {
  uint64_t caps = 0;
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (std::sscanf(line, "CapEff: %lx", &caps) == 1) break;
    std::fclose(f);
  }
  return (caps & (uint64_t{1} << 19)) != 0;  // CAP_SYS_PTRACE
}

/// "" when process_vm_readv copies 8 bytes of our own memory, else what went wrong.
std::string self_read() {
  const uint64_t source = 0x4665727279434d41ull;  // "FerryCMA"
  uint64_t copy = 0;
  iovec local{&copy, sizeof copy};
  iovec remote{const_cast<uint64_t*>(&source), sizeof source};
  const ssize_t n = process_vm_readv(getpid(), &local, 1, &remote, 1, 0);
  if (n < 0) return std::string("process_vm_readv on itself failed: ") + std::strerror(errno);
  if (n != sizeof copy || copy != source)
    return "process_vm_readv on itself copied " + std::to_string(n) + " bytes, not the 8 asked";
  return {};
}

}  // namespace

cma_check check_cma() {
  cma_check c;
  if (const char* v = std::getenv("FI_SHM_DISABLE_CMA")) {
    const std::string s = v;
    if (s == "1" || s == "yes" || s == "true" || s == "on")
      c.disabled_by = "FI_SHM_DISABLE_CMA=" + s;
  }
  c.ptrace_scope = read_ptrace_scope();
  c.cap_sys_ptrace = has_cap_sys_ptrace();
  c.self_read_error = self_read();
  return c;
}

std::string cma_check::why_not() const {
  if (!disabled_by.empty()) return disabled_by + " is set";
  if (!self_read_error.empty()) return self_read_error;
  if (ptrace_scope >= 3) return "kernel.yama.ptrace_scope is 3 (no process may attach to another)";
  // Scope 1 and 2 still let a process with CAP_SYS_PTRACE attach to its peers.
  if (ptrace_scope >= 1 && !cap_sys_ptrace)
    return "kernel.yama.ptrace_scope is " + std::to_string(ptrace_scope) +
           " and ferryd lacks CAP_SYS_PTRACE, so it cannot attach to its peers";
  return {};
}

std::string cma_check::describe() const {
  const std::string scope = ptrace_scope < 0
                                ? std::string("no Yama ptrace scope")
                                : "kernel.yama.ptrace_scope " + std::to_string(ptrace_scope);
  const std::string cap = cap_sys_ptrace ? "with CAP_SYS_PTRACE" : "without CAP_SYS_PTRACE";
  if (const auto why = why_not(); !why.empty())
    return "cross-memory attach for the shm provider: unavailable (" + why + "; " + scope + ", " +
           cap + "): fabric provider shm would be refused, tcp and RDMA providers are unaffected";
  return "cross-memory attach for the shm provider: available (" + scope + ", " + cap +
         ", process_vm_readv on itself works)";
}

}  // namespace ferry::transport
