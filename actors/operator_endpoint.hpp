#pragma once
/// A daemon's HTTP endpoint for operators (listen.metrics): /metrics (Prometheus text format),
/// /healthz (alive: the Scheduler answers) and /readyz (serving: pools registered, listening,
/// not stopping). Served from the first moment of a start, before the pools exist: while ferryd
/// starts, /healthz answers 200 `starting` and /readyz 503 `starting: <phase>`.
/// docs/operations.md says what each series means and which alerts to set.

#include <caf/all.hpp>
#include <memory>
#include <mutex>
#include <string>

#include "actors/context.hpp"
#include "os/http_server.hpp"

namespace ferry {

/// Where a start is, for the endpoint's routes: set by the starting thread, read on civetweb's.
class operator_status {
 public:
  /// The phase the start is in ("creating pool kv"): /readyz answers `starting: <phase>`.
  void phase(std::string now);
  /// The actor system is up: the routes ask `scheduler`. The endpoint must be destroyed before
  /// `sys` is.
  void attach(caf::actor_system& sys, caf::actor scheduler);
  /// Start-up is over: /readyz answers from the daemon's own readiness (daemon_context::ready).
  void started();

  struct view {
    std::string phase;  ///< empty once started
    caf::actor_system* sys = nullptr;
    caf::actor scheduler;
  };
  view now() const;

 private:
  mutable std::mutex mutex_;
  view view_{"initialising", nullptr, {}};
};

/// Serve the routes on ctx->config.metrics_listen from now on.
result<std::unique_ptr<http_server>> serve_operator_endpoint(
    std::shared_ptr<operator_status> status, context_ptr ctx);

}  // namespace ferry
