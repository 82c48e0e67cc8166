// actors/operator_endpoint.hpp: three routes over the start-up phase, the Scheduler and the
// daemon context.

#include "actors/operator_endpoint.hpp"

#include <fmt/format.h>

#include <chrono>

#include "actors/messages.hpp"

namespace ferry {

namespace {

/// How long a scrape or a health probe waits for the Scheduler. Its mailbox is never blocked
/// for long (no actor worker waits on I/O), so a daemon that cannot answer in this is wedged.
constexpr auto scheduler_answer = std::chrono::seconds(2);

constexpr const char* text = "text/plain; charset=utf-8";

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

void operator_status::phase(std::string now) {
  std::lock_guard lock(mutex_);
  view_.phase = std::move(now);
}

void operator_status::attach(caf::actor_system& sys, caf::actor scheduler) {
  std::lock_guard lock(mutex_);
  view_.sys = &sys;
  view_.scheduler = std::move(scheduler);
}

void operator_status::started() {
  std::lock_guard lock(mutex_);
  view_.phase.clear();
}

operator_status::view operator_status::now() const {
  std::lock_guard lock(mutex_);
  return view_;
}

result<std::unique_ptr<http_server>> serve_operator_endpoint(
    std::shared_ptr<operator_status> status, context_ptr ctx) {
  std::vector<http_route> routes;
  routes.emplace_back("/metrics", [status, ctx]() -> http_reply {
    const auto v = status->now();
    if (!v.sys) return {503, text, "starting: " + v.phase + "\n"};
    auto snap = ask(*v.sys, v.scheduler);
    if (!snap) return {503, text, snap.message + "\n"};
    return {200, "text/plain; version=0.0.4; charset=utf-8", ctx->metrics->exposition(snap.value)};
  });
  routes.emplace_back("/healthz", [status]() -> http_reply {
    const auto v = status->now();
    if (!v.phase.empty()) return {200, text, "starting\n"};
    auto snap = ask(*v.sys, v.scheduler);
    if (!snap) return {503, text, "not alive: " + snap.message + "\n"};
    return {200, text, "ok\n"};
  });
  routes.emplace_back("/readyz", [status, ctx]() -> http_reply {
    const auto v = status->now();
    if (!v.phase.empty()) return {503, text, "starting: " + v.phase + "\n"};
    if (auto ready = ctx->ready(); !ready) return {503, text, "not ready: " + ready.message + "\n"};
    return {200, text, "ready\n"};
  });
  return http_server::start(ctx->config.metrics_listen, std::move(routes));
}

}  // namespace ferry
