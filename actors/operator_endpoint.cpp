// actors/operator_endpoint.hpp: three routes over the Scheduler and the daemon context.

#include "actors/operator_endpoint.hpp"

#include <fmt/format.h>

#include <chrono>

#include "actors/messages.hpp"

namespace ferry {

namespace {

/// How long a scrape or a health probe waits for the Scheduler. Its mailbox is never blocked
/// for long (no actor worker waits on I/O), so a daemon that cannot answer in this is wedged.
constexpr auto scheduler_answer = std::chrono::seconds(2);

/// The Scheduler's snapshot, or why there is none.
result<metrics_snapshot> ask(caf::actor_system& sys, const caf::actor& scheduler) {
  caf::scoped_actor self{sys};
  result<metrics_snapshot> out = error{errc::timed_out, "the scheduler did not answer within 2 s"};
  self->request(scheduler, scheduler_answer, metrics_atom::value)
      .receive([&](metrics_snapshot& s) { out = std::move(s); },
               [&](caf::error& e) {
                 if (e != caf::sec::request_timeout)
                   out = error{errc::internal, "the scheduler is gone: " + sys.render(e)};
               });
  return out;
}

}  // namespace

result<std::unique_ptr<http_server>> serve_operator_endpoint(caf::actor_system& sys,
                                                             caf::actor scheduler,
                                                             context_ptr ctx) {
  std::vector<http_route> routes;
  routes.emplace_back("/metrics", [&sys, scheduler, ctx]() -> http_reply {
    auto snap = ask(sys, scheduler);
    if (!snap) return {503, "text/plain; charset=utf-8", snap.message + "\n"};
    return {200, "text/plain; version=0.0.4; charset=utf-8", ctx->metrics->exposition(snap.value)};
  });
  routes.emplace_back("/healthz", [&sys, scheduler]() -> http_reply {
    auto snap = ask(sys, scheduler);
    if (!snap) return {503, "text/plain; charset=utf-8", "not alive: " + snap.message + "\n"};
    return {200, "text/plain; charset=utf-8", "ok\n"};
  });
  routes.emplace_back("/readyz", [ctx]() -> http_reply {
    if (!ctx->serving) return {503, "text/plain; charset=utf-8", "not ready: stopping\n"};
    if (auto usable = ctx->pools_usable(); !usable)
      return {503, "text/plain; charset=utf-8", "not ready: " + usable.message + "\n"};
    return {200, "text/plain; charset=utf-8", "ready\n"};
  });
  return http_server::start(ctx->config.metrics_listen, std::move(routes));
}

}  // namespace ferry
