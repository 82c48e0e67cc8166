// What the shm provider needs from the machine: no stale files under our pid, and cross-memory
// attach.
#include "transport/shm_files.hpp"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include "transport/log.hpp"

namespace ferry::transport {

/// The shm provider names its files /dev/shm/<pid>:<domain>:<endpoint> and reuses one that
/// exists. A file left by a crashed process whose pid we now have would be mapped as ours (seen:
/// SIGBUS), so remove every file with our own pid's prefix before opening: no live process can
/// own it.
void remove_stale_shm_files() {
  const std::string prefix = std::to_string(getpid()) + ":";
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const auto name = f.path().filename().string();
    if (name.rfind(prefix, 0) == 0) {
      std::filesystem::remove(f.path(), ec);
      transport_log()->warn(
          "removed stale shm provider file {} (left by an earlier process "
          "with this pid)",
          f.path().string());
    }
  }
}

/// Why shm would copy writes piecewise (its SAR protocol) instead of with cross-memory attach
/// (process_vm_writev), or "" when CMA is available. Piecewise copies reopen the window the
/// fence closes: a write could land partly before and partly after it.
std::string shm_without_cma() {
  if (const char* v = std::getenv("FI_SHM_DISABLE_CMA")) {
    const std::string s = v;
    if (s == "1" || s == "yes" || s == "true" || s == "on")
      return "FI_SHM_DISABLE_CMA=" + s + " is set";
  }
  int scope = 0;
  if (FILE* f = std::fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (std::fscanf(f, "%d", &scope) != 1) scope = 0;
    std::fclose(f);
  }
  if (scope >= 3) return "kernel.yama.ptrace_scope is 3 (no process may attach to another)";
  if (scope >= 1) {
    // Scope 1 and 2 still let a process with CAP_SYS_PTRACE attach to its peers.
    uint64_t caps = 0;
    if (FILE* f = std::fopen("/proc/self/status", "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, f))
        if (std::sscanf(line, "CapEff: %lx", &caps) == 1) break;
      std::fclose(f);
    }
    if ((caps & (uint64_t{1} << 19)) == 0)  // CAP_SYS_PTRACE
      return "kernel.yama.ptrace_scope is " + std::to_string(scope) +
             " and ferryd lacks CAP_SYS_PTRACE, so it cannot attach to its peers";
  }
  return {};
}

}  // namespace ferry::transport
