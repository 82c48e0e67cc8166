#pragma once
/// Ferry C++ client: speaks the local client protocol (docs/protocol.md) to one ferryd over its
/// unix socket, and maps the daemon's pools into this process.
///
/// Threading: one client per thread; calls are synchronous (a request, then its reply, matched by
/// seq: a reply whose seq is not the outstanding request's is a protocol error). Events
/// pushed for subscribed rooms that arrive while waiting for a reply are kept in order and
/// returned by `next_event`.
///
/// Installed as Ferry::client (docs/install.md), with the core headers it includes; it depends on
/// nothing but the C++ standard library and fmt.
///
/// Errors: every call returns an `outcome`; on failure `code` and `message` carry the daemon's
/// error or a local one (a lost connection, a reply that did not come in time), `lost()` says
/// whether the connection is gone, and no exception is thrown.

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/protocol.hpp"
#include "core/shm_region.hpp"

namespace ferry::client {

class client {
 public:
  /// Connect to the ferryd at `socket_path`, say hello, and keep its pool description. With
  /// `cancel_on_disconnect` (the default) the rooms this connection creates are cancelled when
  /// it closes, so a crashed engine leaks nothing. The client offers protocol versions
  /// [min_protocol_version, max_version] and speaks what the daemon picks (`version()`).
  static result<std::unique_ptr<client>> connect(
      const std::string& socket_path, const std::string& name = "ferry-client",
      std::chrono::milliseconds timeout = std::chrono::seconds(10),
      bool cancel_on_disconnect = true, uint16_t max_version = proto::protocol_version);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  /// The daemon's hello reply: node, role, pool names and layouts.
  const proto::hello_reply& daemon() const { return hello_; }
  /// The daemon's effective config is `daemon().config_yaml`; the in-tree tools parse it with
  /// ferry::client::daemon_config (ferry/daemon_config.hpp, not installed: it needs yaml-cpp).

  result<none> prepare(const proto::prepare& p);
  result<none> send(const proto::send& s);
  result<proto::poll_reply> poll(uint64_t room);
  /// v4: lend the daemon this process's memory for a `memory: client` pool: `fds` (memfds,
  /// sealed against shrinking) go with the frame (SCM_RIGHTS); `req.fd_count` is set from them.
  /// The registration lasts as long as this connection. The caller keeps its descriptors.
  result<none> register_memory(proto::register_memory req, const std::vector<int>& fds);
  /// Use `base` as the mapping of pool `k` (memory this process lent with register_memory,
  /// laid out as the daemon's layout says), so `item` and the helpers reach it.
  void attach_pool(pool_kind k, uint8_t* base) { attached_[static_cast<int>(k)] = base; }
  /// v4: every rank of the engine instance whose daemon listens at `address` (host:port), with
  /// its position, or why it cannot be used.
  result<proto::discover_reply> discover(const std::string& address);
  /// v4: the status of every room in `rooms`, in one round trip, in the order asked.
  result<std::vector<proto::poll_reply>> poll_many(const std::vector<uint64_t>& rooms);
  /// The protocol version of this connection (what the daemon picked at hello).
  uint16_t version() const { return version_; }
  result<none> cancel(uint64_t room);
  /// Ask for status events of `room`; the current status arrives as the first event.
  result<none> subscribe(uint64_t room);
  result<std::string> info(proto::info_topic topic);
  /// v5: start the daemon's drain (what a SIGTERM starts): no new rooms; it exits once the
  /// accepted ones ended (docs/operations.md, "Drain").
  result<none> drain();
  /// v5: set the level of the daemon's logger `logger` (ferryd, scheduler, room, peer, client,
  /// transport), or of all of them when it is empty, to `level` (trace ... error, off).
  result<none> set_log_level(const std::string& logger, const std::string& level);

  /// The next pushed event (buffered or read now), or errc::timed_out.
  result<proto::event> next_event(std::chrono::milliseconds timeout);
  /// Drop the buffered events of `room` (e.g. of an earlier incarnation of a reused id).
  void discard_events(uint64_t room);
  /// Wait for a terminal event of `room` (subscribe first); other rooms' events are kept.
  result<proto::event> wait_terminal(uint64_t room, std::chrono::milliseconds timeout);

  /// Map the daemon's pools into this process (idempotent). Pools stay mapped until destruction.
  result<none> map_pools();
  /// Base address of a mapped pool (nullptr when absent or not mapped).
  uint8_t* pool(pool_kind k) const;
  /// Address of item `index` of buffer `buffer` in pool `k`; nullptr when the pool is absent or
  /// not mapped, or the buffer or index is out of range.
  uint8_t* item(pool_kind k, size_t buffer, uint64_t index) const;

  /// Send raw bytes (for tests of malformed input) and read the next reply frame.
  result<proto::message> raw_exchange(const std::vector<uint8_t>& bytes,
                                      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  /// Default wait for a reply.
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }
  /// True once the connection to ferryd is gone or unusable: it closed, a read or write failed,
  /// a frame could not be decoded or matched no request, or ferryd sent an error about the
  /// connection itself (and closed it). An error while this is false is ferryd's answer.
  bool lost() const { return lost_; }

  /// The connection's socket, for a caller that waits on several clients with poll(2) (e.g.
  /// ferry-soak). Events may already be buffered: take them with `next_event` and a zero timeout
  /// before polling; when the socket is readable, `next_event` reads what arrived.
  int native_handle() const { return fd_; }

 private:
  client() = default;
  result<proto::message> request(const proto::message& m);
  /// The next frame; its seq goes to `seq` when given.
  result<proto::message> read_frame(std::chrono::steady_clock::time_point deadline,
                                    uint32_t* seq = nullptr);
  /// The next frame, which must be an event (no request is outstanding).
  result<proto::event> read_event(std::chrono::steady_clock::time_point deadline);
  /// Write `bytes`, then read frames (keeping events) up to the first other frame; with
  /// `expect_seq`, a frame with another seq is a protocol error naming it.
  result<proto::message> exchange(const std::vector<uint8_t>& bytes,
                                  std::chrono::milliseconds timeout,
                                  std::optional<uint32_t> expect_seq);
  result<none> expect_ok(const proto::message& m);

  /// The error `e`, and the connection marked lost.
  ferry::error lose(ferry::error e) {
    lost_ = true;
    return e;
  }

  int fd_ = -1;
  bool lost_ = false;
  uint32_t next_seq_ = 1;
  uint16_t version_ = proto::protocol_version;
  std::chrono::milliseconds timeout_{std::chrono::seconds(30)};
  proto::frame_reader reader_;
  std::deque<proto::event> events_;
  proto::hello_reply hello_;
  shm_region pools_[pool_kind_count];
  uint8_t* attached_[pool_kind_count] = {};
};

}  // namespace ferry::client
