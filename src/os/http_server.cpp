// os/http_server.hpp on civetweb's C API.

#include "os/http_server.hpp"

#include <civetweb.h>
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <cstring>
#include <mutex>

namespace ferry {

namespace {

/// civetweb reports start-up failures (a port in use) only through its log callback, which is
/// given no context then: the text goes here while one start runs.
std::mutex start_mutex;
std::string* start_error = nullptr;

int on_log(const mg_connection* conn, const char* message) {
  if (!conn && start_error) *start_error = message;
  return 1;  // handled: civetweb prints nothing itself
}

int serve(mg_connection* conn, void* data) {
  const auto* route = static_cast<const http_route*>(data);
  const auto* req = mg_get_request_info(conn);
  const bool head = std::strcmp(req->request_method, "HEAD") == 0;
  if (!head && std::strcmp(req->request_method, "GET") != 0) {
    mg_printf(conn,
              "HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, HEAD\r\nContent-Length: 0\r\n"
              "Connection: close\r\n\r\n");
    return 405;
  }
  http_reply r;
  try {
    r = route->second();
  } catch (const std::exception& e) {
    r = {500, "text/plain; charset=utf-8", fmt::format("{} failed: {}\n", route->first, e.what())};
  }
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store"
            "\r\nConnection: close\r\n\r\n",
            r.status, mg_get_response_code_text(conn, r.status), r.content_type.c_str(),
            r.body.size());
  if (!head) mg_write(conn, r.body.data(), r.body.size());
  return r.status;
}

}  // namespace

result<std::unique_ptr<http_server>> http_server::start(const std::string& address,
                                                        std::vector<http_route> routes) {
  static const unsigned features = mg_init_library(MG_FEATURES_IPV6);
  (void)features;
  std::unique_ptr<http_server> s(new http_server);
  s->routes_ = std::move(routes);
  // No document root: civetweb serves no files. Two threads: a scrape and a health probe at
  // once; keep-alive off, so a connection holds a thread for one request only.
  const char* options[] = {"listening_ports",
                           address.c_str(),
                           "num_threads",
                           "2",
                           "request_timeout_ms",
                           "5000",
                           "enable_keep_alive",
                           "no",
                           nullptr};
  mg_callbacks callbacks{};
  callbacks.log_message = on_log;
  std::string why;
  {
    std::lock_guard lock(start_mutex);
    start_error = &why;
    // civetweb's threads inherit this mask: they never take a signal meant for the daemon
    // (ferryd may start serving before it blocks its stop signals, actors/daemon.cpp).
    sigset_t all, was;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &was);
    s->ctx_ = mg_start(&callbacks, nullptr, options);
    pthread_sigmask(SIG_SETMASK, &was, nullptr);
    start_error = nullptr;
  }
  if (!s->ctx_)
    return error{errc::system_error, fmt::format("cannot serve HTTP on {}: {}", address,
                                                 why.empty() ? "civetweb could not start" : why)};
  for (auto& r : s->routes_) mg_set_request_handler(s->ctx_, r.first.c_str(), serve, &r);
  return s;
}

http_server::~http_server() {
  if (ctx_) mg_stop(ctx_);
}

}  // namespace ferry
