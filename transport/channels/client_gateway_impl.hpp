#pragma once
/// The client gateway's state (transport/channels/client_gateway.hpp), shared by its two halves:
/// client_gateway.cpp serves the connected clients (frames in and out, descriptors, the
/// connections' output, which answering threads write to directly); client_gateway_accept.cpp owns
/// the listen socket and admits new clients (credentials, the connection limit, running out of
/// descriptors). Private to them.

#include <spdlog/spdlog.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/protocol.hpp"
#include "transport/channels/client_gateway.hpp"

namespace ferry {

namespace gateway_keys {
/// epoll keys: the listen socket, the wake-up eventfd, then one per connection.
inline constexpr uint64_t listen_key = 0;
inline constexpr uint64_t wake_key = 1;
inline constexpr uint64_t first_conn_id = 2;
}  // namespace gateway_keys

struct client_gateway::impl {
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  std::string path;
  client_gateway::sink to;
  const status_board* board = nullptr;  // answers polls of rooms in progress, when set
  client_gateway::request_check check;  // refuses requests whose own fields are wrong, when set
  uint32_t max_clients = 1024;
  client_access access;  // who may connect beside ferryd's user and root
  uid_t self_uid = geteuid();
  std::optional<std::chrono::steady_clock::time_point> last_denied_warning;
  uint64_t denied_unlogged = 0;  // refusals since the last warning
  std::chrono::milliseconds frame_limit{10000};
  std::atomic<bool> stopping{false};
  std::shared_ptr<spdlog::logger> log;

  /// A connection's output, shared with the threads that answer it: a reply or event is
  /// encoded and written by the thread that makes it, at once when nothing waits before it; what
  /// the socket does not take waits here for the gateway thread (EPOLLOUT). Guarded by `m`.
  struct wire {
    std::mutex m;
    int fd = -1;
    uint16_t version = proto::protocol_version;  // the connection's, once its hello settled it
    std::vector<uint8_t> out;
    size_t out_pos = 0;
    bool want_write = false;  // EPOLLOUT is in the connection's interest
    bool closed = false;      // the gateway closed the descriptor: write nothing
    bool dropped = false;     // shut down for not reading: the gateway closes it
  };

  struct connection {
    int fd = -1;
    std::shared_ptr<wire> w = std::make_shared<wire>();
    proto::frame_reader reader;
    bool said_hello = false;                     // hello must come first, and only once
    uint16_t version = proto::protocol_version;  // settled by the hello
    /// Bytes received so far, and descriptors received (SCM_RIGHTS) with the stream position
    /// just after the read that brought them. A read stops right after the message carrying
    /// descriptors (it may begin with the tail of an earlier one), so they belong to the frame
    /// holding that read's last byte: a register_memory frame sent with one sendmsg.
    uint64_t stream_in = 0;
    struct fd_batch {
      uint64_t end = 0;
      std::vector<int> fds;
      bool truncated = false;  // more came than fit (the kernel closed the rest)
    };
    std::deque<fd_batch> fd_batches;
    /// Since when a started frame is incomplete (nullopt: no partial frame buffered).
    std::optional<std::chrono::steady_clock::time_point> partial_since;
  };
  std::unordered_map<uint64_t, connection> conns;  // gateway thread only
  uint64_t next_id = gateway_keys::first_conn_id;
  /// Every open connection's output, by id, for the answering threads.
  std::mutex wires_mutex;
  std::unordered_map<uint64_t, std::shared_ptr<wire>> wires;  // guarded by wires_mutex

  /// Held open so that, out of file descriptors, a pending connection can still be accepted
  /// and told why it is refused (then closed) instead of waiting in the backlog unanswered.
  int reserve_fd = -1;
  /// While no descriptor is free even with the reserve: the listen socket is out of epoll (it
  /// stays readable, and polling it would spin) until this time.
  std::optional<std::chrono::steady_clock::time_point> listen_paused_until;
  std::chrono::steady_clock::time_point last_fd_warning{};
  uint64_t fd_refusals = 0;  // since the last warning

  ~impl();

  /// Start serving an accepted connection.
  void add_conn(int fd, std::atomic<size_t>& count);
  void close_conn(uint64_t id, std::atomic<size_t>& count);

  /// Under w.m: write as much as the socket takes, and ask for EPOLLOUT while some is left
  /// (`id` is the connection's epoll key). False when the connection failed.
  bool write_locked(uint64_t id, wire& w);
  /// Under w.m: append a frame and write it if nothing waits before it; a client that leaves
  /// more than max_output_bytes unread is shut down (the gateway thread then closes it).
  void send_locked(uint64_t id, wire& w, const proto::message& m, uint32_t seq);

  /// Write as much as the socket takes; false when the connection must be closed.
  bool flush(uint64_t id, connection& c);
  bool has_output(const connection& c);

  /// At a stop: what actors answered before it (the outcome of the last room of a drain, say)
  /// still reaches its client. Bounded: a client that does not read within `limit` loses the
  /// rest with its connection.
  void deliver_before_close(std::chrono::milliseconds limit);

  /// The session rules of docs/protocol.md: hello first, once, in a version both sides speak
  /// (which the connection then keeps). Returns the refusal for a request that breaks them (the
  /// request is not served); `close` is set when the connection cannot go on.
  static std::optional<proto::error> session_error(connection& c, const proto::message& m,
                                                   bool& close);

  /// The descriptors of the frame that occupied stream bytes [start, end): those whose read
  /// ended inside it, when it is a register_memory asking for exactly that many. Any other
  /// descriptor received up to `end` is closed (with a log line): it belongs to no request.
  /// A refusal (then every descriptor of the frame is closed and the request is not served).
  std::optional<proto::error> take_fds(connection& c, uint64_t start, uint64_t end,
                                       const proto::decoded& d, std::vector<int>& out);

  /// recv, also taking the descriptors a client passes with SCM_RIGHTS.
  static ssize_t receive(connection& c, std::vector<uint8_t>& buf);

  /// Tell a just-accepted connection why it is refused, and close it.
  static void refuse(int fd, const std::string& why, errc code = errc::invalid_request);

  /// Accept what the backlog holds (bounded per wake-up, so requests are served in between).
  void accept_clients(std::atomic<size_t>& count);

  /// Whether the process that connected `fd` may use this daemon (the credentials the kernel
  /// took at its connect()); one that may not is told why and closed before any byte of it is
  /// read. Logged at most every 10 s, with the count since, so a local flood cannot flood the log.
  bool admit(int fd);

  /// accept4 failed for want of a descriptor: give up the reserve to accept one connection and
  /// refuse it with the reason, or, with no reserve left, stop polling the listen socket for a
  /// while. Either way other clients are served on, and the warning is logged at most every 10 s.
  void out_of_descriptors(int err);

  /// Put the listen socket back into epoll once its pause is over; the wait (ms) until then, or
  /// -1 when it is not paused.
  int resume_listening(std::chrono::steady_clock::time_point now);

  void queue_local(uint64_t id, connection& c, const proto::message& m, uint32_t seq);

  /// A frame in the connection's version (a hello_reply also says which one that is).
  static std::vector<uint8_t> encode_for(uint16_t version, const proto::message& m, uint32_t seq);
};

}  // namespace ferry
