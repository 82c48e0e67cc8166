// What the shm provider needs from the machine: no stale files under our pid (cross-memory
// attach: cma_check.cpp).
#include "transport/shm_files.hpp"

#include <unistd.h>

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

}  // namespace ferry::transport
