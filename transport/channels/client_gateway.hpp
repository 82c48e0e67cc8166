#pragma once
/// The local client endpoint: a unix stream socket served by one epoll thread, so no CAF worker
/// ever blocks on client I/O.
///
/// Threading: the gateway thread reads and decodes frames and hands each request to its `sink`
/// (the daemon's: an `anon_send` to the Scheduler); it knows nothing of actors. Actors answer with
/// `reply`/`push`, which are thread-safe: the calling thread encodes the frame and writes it to the
/// socket itself when nothing waits before it (no wake-up of the gateway thread); what the socket
/// does not take at once is written by the gateway thread when it drains.
///
/// Bad input: a frame whose body is malformed gets an error reply and the connection stays
/// usable; a broken length field (too large or too short) gets an error reply and the
/// connection is closed, since the stream cannot be resynchronised. A client that stops reading
/// is disconnected once its unsent output exceeds `max_output_bytes`; one that starts a frame
/// and does not finish it within `limits.client_frame_ms` (a slow-loris client, or a crashed
/// writer) gets an error and is disconnected; beyond `limits.max_clients` connections a new one
/// gets an error and is closed at once.

#include <spdlog/spdlog.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/access.hpp"
#include "core/protocol.hpp"

namespace ferry {

class status_board;

/// A decoded client request, with where to send the reply.
struct client_request {
  uint64_t conn = 0;
  uint32_t seq = 0;
  proto::message msg;
  uint16_t version = proto::protocol_version;  ///< the connection's protocol version
  /// register_memory: the descriptors that came with it, owned by whoever handles the request
  /// (closed once mapped, or when refused).
  std::vector<int> fds;
  /// The client gateway already checked its own fields (refuse_at_once passed it), so the
  /// Scheduler need not check them again.
  bool fields_checked = false;
};

/// A client connection closed.
struct client_gone {
  uint64_t conn = 0;
};

class client_gateway {
 public:
  static constexpr size_t max_output_bytes = 64u << 20;

  /// Bind and listen on `path` (an existing socket file is replaced), open to the users and
  /// groups of `access` beside ferryd's own user and root; every other connection is refused
  /// with `access_denied` (core/access.hpp).
  static result<std::shared_ptr<client_gateway>> listen(
      const std::string& path, uint32_t max_clients = 1024, uint32_t frame_ms = 10000,
      client_access access = {}, std::shared_ptr<spdlog::logger> log = nullptr);
  ~client_gateway();

  /// What a request's own fields say against the daemon's fixed config and layout: the error
  /// to answer at once, or nothing (the Scheduler decides). Called on the gateway's thread.
  using request_check = std::function<std::optional<proto::error>(const proto::message&, uint64_t)>;

  /// Where the gateway thread hands what it reads; each called on that thread, in order, and
  /// both required (`start` throws std::invalid_argument without them).
  struct sink {
    std::function<void(client_request)> request;
    std::function<void(client_gone)> gone;
  };

  /// Start serving; requests go to `to`, except polls of rooms in progress, answered from
  /// `board` (transport/channels/status_board.hpp) when one is given, and requests `check`
  /// refuses.
  void start(sink to, const status_board* board = nullptr, request_check check = {});
  /// Stop the thread and close every connection, once what actors queued before the call is
  /// written (for up to a second per stop: a client that does not read loses it); idempotent.
  void stop();

  /// Send a reply frame to connection `conn` (dropped if it has gone).
  void reply(uint64_t conn, uint32_t seq, const proto::message& m);
  /// Push an event frame (seq 0).
  void push(uint64_t conn, const proto::message& m) { reply(conn, 0, m); }

  size_t connections() const { return conn_count_.load(); }

 private:
  client_gateway() = default;
  void run();
  struct impl;
  std::unique_ptr<impl> impl_;
  std::thread thread_;
  std::atomic<size_t> conn_count_{0};
};

}  // namespace ferry
