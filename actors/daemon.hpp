#pragma once
/// Start-up and shutdown of a ferryd: pools, fabric engine, actor system, control and client
/// endpoints, in that order; teardown in reverse.

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "transport/engine.hpp"

namespace ferry {

/// How a daemon runs; the defaults are ferryd's. Tests run daemons in their own process with
/// the other two (tests/e2e/test_in_process.cpp).
struct daemon_options {
  /// When >= 0, "ready\n" is written to it (and it is closed) once peers and clients are
  /// served, so supervisors and tests can wait on it.
  int ready_fd = -1;
  /// Called once peers and clients are served (after `ready_fd` is written).
  std::function<void()> on_ready;
  /// Makes the fabric engine from the config's settings; empty: `transport::engine::open`. A
  /// test passes one that wraps that engine in transport::fault_engine to inject faults.
  std::function<result<std::unique_ptr<transport::engine>>(const transport::engine_config&)>
      make_engine;
  /// Returns when the daemon is to stop; empty: wait for SIGINT or SIGTERM (SIGHUP is logged
  /// and ignored).
  std::function<void()> wait_for_stop;
};

/// Run a daemon until it is told to stop (by default SIGINT or SIGTERM). Returns a process exit
/// code (core/exit_codes.hpp): 0 after a clean stop (the drain finished); forced_stop when a
/// second stop signal or timeouts.stop_ms ended the drain with rooms still active;
/// could_not_start when start-up failed (a
/// second instance, pools, fabric, registrations, sockets), logged with what failed; usage for a
/// malformed FERRY_FAILPOINTS.
int run_daemon(const ferry_config& cfg, const daemon_options& options = {});

}  // namespace ferry
