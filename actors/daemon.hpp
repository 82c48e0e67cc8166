#pragma once
/// Start-up and shutdown of a ferryd: pools, fabric engine, actor system, control and client
/// endpoints, in that order; teardown in reverse.

#include <atomic>
#include <string>

#include "core/config.hpp"

namespace ferry {

/// Run a daemon until SIGINT or SIGTERM. When `ready_fd` >= 0, "ready\n" is written to it (and
/// it is closed) once peers and clients are served, so supervisors and tests can wait on it.
/// Returns a process exit code; start-up errors are logged with what failed.
int run_daemon(const ferry_config& cfg, int ready_fd = -1);

}  // namespace ferry
