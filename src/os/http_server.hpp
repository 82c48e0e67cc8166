#pragma once
/// A small HTTP endpoint for operators' tools (Prometheus scrapes, health checks), on civetweb
/// (Debian's libcivetweb): a few fixed GET routes, served by civetweb's own threads, never by
/// an actor worker. Anything else gets civetweb's 404; a request that does not finish within
/// 5 s is dropped, so a slow or hostile client holds a thread for no longer than that.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/errors.hpp"

struct mg_context;

namespace ferry {

struct http_reply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

/// An exact path ("/metrics") and what answers it. Called on a civetweb thread.
using http_route = std::pair<std::string, std::function<http_reply()>>;

class http_server {
 public:
  /// Listen on `address` ("host:port"; IPv6 as "[::1]:port") and serve `routes`. Fails naming
  /// the address and why (in use, not an address of this host, ...).
  static result<std::unique_ptr<http_server>> start(const std::string& address,
                                                    std::vector<http_route> routes);
  /// Stops: returns once no route runs any more.
  ~http_server();
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

 private:
  http_server() = default;
  std::vector<http_route> routes_;
  mg_context* ctx_ = nullptr;
};

}  // namespace ferry
