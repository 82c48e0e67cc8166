#pragma once
// A daemon's operator endpoint (listen.metrics) as a scraper sees it: raw HTTP/1.0 over a real
// socket, and the Prometheus text format read back by series.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <optional>
#include <sstream>
#include <string>

namespace ferry::test {

struct http_response {
  int status = 0;  ///< 0: no status line came back
  std::string body;
};

/// Send `raw` to 127.0.0.1:`port` and read the answer until the server closes (bounded: 10 s).
inline http_response http_raw(uint16_t port, const std::string& raw) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  for (size_t sent = 0; sent < raw.size();) {
    const auto n = send(fd, raw.data() + sent, raw.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server may close on garbage before it read it all
    sent += static_cast<size_t>(n);
  }
  std::string in;
  char buf[65536];
  for (int rounds = 0; rounds < 10000; ++rounds) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    const auto n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  http_response r;
  if (in.rfind("HTTP/1.", 0) == 0 && in.size() > 12) r.status = std::stoi(in.substr(9, 3));
  if (auto end = in.find("\r\n\r\n"); end != std::string::npos) r.body = in.substr(end + 4);
  return r;
}

inline http_response http_get(uint16_t port, const std::string& path) {
  return http_raw(port, "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
}

/// Sum of every series of `name` whose labels include all of `labels` (Prometheus text format),
/// or nothing when no series matches.
inline std::optional<double> series(const std::string& text, const std::string& name,
                                    const std::map<std::string, std::string>& labels = {}) {
  std::istringstream in(text);
  std::string line;
  std::optional<double> sum;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const auto brace = line.find('{');
    const auto space = line.rfind(' ');
    const auto end_name = std::min(brace, space);
    if (line.substr(0, end_name) != name) continue;
    std::map<std::string, std::string> got;
    if (brace < space) {
      const auto close = line.find('}', brace);
      std::string body = line.substr(brace + 1, close - brace - 1);
      for (size_t pos = 0; pos < body.size();) {
        const auto eq = body.find('=', pos);
        const auto q2 = body.find('"', eq + 2);
        got[body.substr(pos, eq - pos)] = body.substr(eq + 2, q2 - eq - 2);
        pos = q2 + 2;  // past the quote and the comma
      }
    }
    bool match = true;
    for (const auto& [k, v] : labels) match = match && got.count(k) && got[k] == v;
    if (match) sum = sum.value_or(0) + std::stod(line.substr(space + 1));
  }
  return sum;
}

}  // namespace ferry::test
