#pragma once
/// A daemon's HTTP endpoint for operators (listen.metrics): /metrics (Prometheus text format),
/// /healthz (alive: the Scheduler answers) and /readyz (serving: pools registered, listening,
/// not stopping). docs/operations.md says what each series means and which alerts to set.

#include <caf/all.hpp>
#include <memory>

#include "actors/context.hpp"
#include "actors/http_server.hpp"

namespace ferry {

/// Serve the routes on ctx.config.metrics_listen. The server must be destroyed before the
/// actor system: its routes ask `scheduler` from civetweb's threads.
result<std::unique_ptr<http_server>> serve_operator_endpoint(caf::actor_system& sys,
                                                             caf::actor scheduler, context_ptr ctx);

}  // namespace ferry
