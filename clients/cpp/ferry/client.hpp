#pragma once
/// Ferry C++ client: speaks the local client protocol (docs/protocol.md) to one ferryd over its
/// unix socket, and maps the daemon's pools into this process.
///
/// Threading: one client per thread; calls are synchronous (a request, then its reply). The
/// connection's rules are core's `proto::client_session`, the machine the Python client mirrors
/// (tests/conformance/client_session.yaml): replies are matched by seq, a reply whose seq matches
/// no outstanding request ends the connection as a protocol error, a reply that does not decode
/// or is of another type fails its request only, and the late reply of a request that timed out
/// is dropped. Events pushed for subscribed rooms that arrive while waiting for a reply are kept
/// in order and returned by `next_event`. The hello offers versions 3..max; a daemon that cannot
/// read it (one that speaks only version 3) is asked again in version 3 on a new connection, so
/// `connect` may take twice its timeout.
///
/// Installed as Ferry::client (docs/install.md), with the core headers it includes; it depends on
/// nothing but the C++ standard library and fmt.
///
/// Errors: every call returns an `outcome`; on failure `code` and `message` carry the daemon's
/// error or a local one (a lost connection, a reply that did not come in time), `lost()` says
/// whether the connection is gone, and no exception is thrown.
///
/// Reconnecting (opt-in: `connect_options::reconnect`): when the connection is lost, the call
/// that saw it fails with 302 `peer_lost`, and every subscribed room not yet terminal gets a
/// Failed event (code 302, the reason naming the socket) kept for `next_event`/`wait_terminal`.
/// A later call connects again by itself (lazily, no thread): hello, the memory lent with
/// `register_memory` registered again (from duplicates of the descriptors kept by the client),
/// and the daemon pools that were mapped mapped anew. A call made while ferryd is away fails at
/// once with 300 `peer_unreachable` (or waits up to `reconnect_policy::call_wait` for it).

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/client_session.hpp"
#include "core/protocol.hpp"
#include "core/shm_region.hpp"
#include "ferry/event_queue.hpp"

namespace ferry::client {

/// How a client connects again after losing its ferryd (a drain and restart, a crash and a
/// restart by systemd): the policy of the Python client's `ferry.Reconnect`, made synchronous.
/// Attempts are made by the client's calls, never in the background: the first by the first
/// call after the loss, then no earlier than `initial_delay` after a failed one, each wait
/// `multiplier` times the one before, at most `max_delay`. Every field is bounded (`connect`
/// refuses a policy outside the bounds, naming the field).
struct reconnect_policy {
  std::chrono::milliseconds initial_delay{100};  ///< 0 ... max_delay
  std::chrono::milliseconds max_delay{5000};     ///< at most 10 minutes
  double multiplier = 2.0;                       ///< 1 ... 100
  /// Failed attempts after which the client gives up for good (0: no limit); its calls then
  /// fail with the last attempt's error ("gave up reconnecting to ferryd at ...").
  uint32_t max_attempts = 0;
  /// How long a call made while disconnected may wait for ferryd to come back (attempting as
  /// the backoff allows) before it fails with 300; 0 (the default): it never waits, so an
  /// engine's scheduler step is not held up. At most 10 minutes.
  std::chrono::milliseconds call_wait{0};
  /// The bound of one attempt's hello and each register_memory it makes again (1 ms ... 10 min).
  std::chrono::milliseconds attempt_timeout{10000};
};

/// What `client::connect` takes beyond the socket (the defaults are the 5-argument overload's).
struct connect_options {
  std::string name = "ferry-client";
  /// The bound of the hello (and of every reconnect's hello unless the policy says otherwise).
  std::chrono::milliseconds timeout{std::chrono::seconds(10)};
  bool cancel_on_disconnect = true;
  uint16_t max_version = proto::protocol_version;
  /// Reconnect by itself when the connection is lost (absent: a lost connection stays lost).
  std::optional<reconnect_policy> reconnect;
};

/// What happened to a reconnecting client's connection (`client::on_connection`); the fields
/// mirror the Python client's Draining, Disconnected and Reconnected notices.
struct connection_notice {
  enum class kind {
    /// ferryd answered 407 `ferryd is draining: ...`: it is stopping; route new rooms elsewhere.
    draining,
    /// The connection was lost (`error` says how), after the Failed events of `failed_rooms`
    /// were kept. `reconnecting` is false when the client gave up (`max_attempts`): `error` is
    /// then the last attempt's. `drained`: ferryd had said it was draining.
    disconnected,
    /// Connected again and serving requests.
    reconnected,
  };
  kind what = kind::disconnected;
  std::string message;  ///< draining: ferryd's text
  ferry::error error;   ///< disconnected: why
  std::vector<uint64_t> failed_rooms;
  bool reconnecting = true;
  bool drained = false;
  /// reconnected: the connection's number (1 is the first), the attempts it took since the
  /// loss, and how long the client was without ferryd.
  uint32_t generation = 1;
  uint32_t attempts = 0;
  std::chrono::milliseconds downtime{0};
  std::string instance, previous_instance;  ///< the daemon's instance now and before
  /// The `memory: client` pools registered again with the memory they had.
  std::vector<pool_kind> registered;
  /// Those ferryd refused this time (e.g. a changed layout), with its error: the engine must
  /// handle them (the client keeps the registration and offers it again on the next reconnect).
  std::vector<std::pair<pool_kind, ferry::error>> not_registered;
  /// The daemon pools that were mapped and are mapped anew: pointers from `pool`/`item` taken
  /// before the loss are no longer valid (the old mapping is gone); take them again.
  std::vector<pool_kind> remapped;
  /// Daemon pools that were mapped but could not be mapped again, with the error.
  std::vector<std::pair<pool_kind, ferry::error>> not_remapped;
};

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
  /// The same with options; with `options.reconnect` the client reconnects by itself (see the
  /// top of this file). The first connection is not retried: a socket that cannot be
  /// connected fails with 300 as without reconnect. A policy outside its bounds: 400 naming it.
  static result<std::unique_ptr<client>> connect(const std::string& socket_path,
                                                 const connect_options& options);
  ~client();
  client(const client&) = delete;
  client& operator=(const client&) = delete;

  /// The daemon's hello reply: node, role, pool names and layouts.
  const proto::hello_reply& daemon() const { return hello_; }
  /// The daemon's effective config is `daemon().config_yaml`; the in-tree tools parse it with
  /// ferry::client::daemon_config (src/tools/workload/daemon_config.hpp, not installed: it needs
  /// yaml-cpp).

  result<none> prepare(const proto::prepare& p);
  /// One chunk of a room, or (v6) one layer range of a chunk (`first_layer`, `layer_count`:
  /// docs/protocol.md, "Layer-wise sends"); a layer range on an older connection is refused
  /// (unsupported_version) rather than sent as a whole chunk.
  result<none> send(const proto::send& s);
  /// Several requests in one write, their replies read as they come (one round trip for all):
  /// what an engine does for the requests of one scheduler step. Each gets its own result, as
  /// if made alone; a lost connection fails the rest. Takes prepare, send, subscribe and
  /// cancel (the requests answered with ok); anything else fails the call before it is sent.
  std::vector<result<none>> pipeline(const std::vector<proto::message>& requests);
  /// The global layer ids the daemon's rank holds (its KV and state buffers), ascending: what a
  /// layer range names.
  std::vector<uint32_t> layers() const;
  result<proto::poll_reply> poll(uint64_t room);
  /// v4: lend the daemon this process's memory for a `memory: client` pool: `fds` (memfds,
  /// sealed against shrinking) go with the frame (SCM_RIGHTS); `req.fd_count` is set from them.
  /// The registration lasts as long as this connection. The caller keeps its descriptors; a
  /// reconnecting client keeps duplicates of them (closed with it, or when the pool is
  /// registered anew) to register the same memory again after a reconnect.
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
  /// Ask for status events of `room`; the current status arrives as the first event. A
  /// reconnecting client reports a subscribed room Failed (302) when the connection is lost.
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

  /// Map the daemon's pools into this process (idempotent). Pools stay mapped until destruction
  /// (a reconnecting client maps them anew after a reconnect, `connection_notice::remapped`).
  result<none> map_pools();
  /// Base address of a mapped pool (nullptr when absent or not mapped; for a daemon pool, also
  /// while a reconnecting client is disconnected: its memory is no longer the daemon's).
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
  /// the stream could not be cut into frames, a frame had flags set or matched no request, or
  /// ferryd sent an error about the connection itself (and closed it). An error while this is
  /// false is ferryd's answer, or a reply this client could not take (it fails that call only).
  bool lost() const { return lost_; }

  /// Connect again now if the connection is lost (a reconnecting client only; else 400), without
  /// waiting for the backoff, and keep attempting as the backoff allows for up to `wait`.
  /// Succeeds at once when connected. The lazy reconnect of any other call does the same with
  /// `reconnect_policy::call_wait`, and only once the backoff allows the next attempt.
  result<none> reconnect(std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  /// Call `cb` on every connection notice (draining, disconnected, reconnected), synchronously
  /// from within the call that saw it; replaces the previous one (an empty function: none). `cb`
  /// must not call this client (such a call fails with 400).
  void on_connection(std::function<void(const connection_notice&)> cb) {
    on_connection_ = std::move(cb);
  }
  /// The number of the current connection: 1 for the first, one more for each reconnect. A
  /// room created under an earlier generation is gone.
  uint32_t generation() const { return generation_; }
  /// True once ferryd answered 407 `ferryd is draining` on the current connection.
  bool draining() const { return draining_; }
  /// True once a reconnecting client gave up (`max_attempts`), or a client without reconnect
  /// lost its connection: nothing will connect it again.
  bool ended() const { return lost_ && (!policy_ || gave_up_); }

  /// The connection's socket, for a caller that waits on several clients with poll(2) (e.g.
  /// ferry-soak). Events may already be buffered: take them with `next_event` and a zero timeout
  /// before polling; when the socket is readable, `next_event` reads what arrived. A reconnecting
  /// client's socket changes with each connection (-1 while disconnected).
  int native_handle() const { return fd_; }

 private:
  client() = default;
  /// A register_memory this client made, kept (with reconnect) to make it again.
  struct registration {
    proto::register_memory req;
    std::vector<int> fds;  ///< duplicates, owned
  };
  /// Open the socket and say hello (the first connection and every reconnect attempt).
  result<none> handshake(std::chrono::milliseconds timeout);
  /// Send a register_memory with `fds` and wait for ok.
  result<none> send_register(const proto::register_memory& req, const std::vector<int>& fds);
  /// Before every call: refused inside on_connection; a lost reconnecting connection is made
  /// again (ensure_connected with the policy's call_wait).
  result<none> enter();
  /// Fine when connected; else (with reconnect) attempt as the backoff allows
  /// for up to `wait`, or the error the call fails with.
  result<none> ensure_connected(std::chrono::milliseconds wait, bool now);
  /// One attempt: connect, hello, register again, remap; the notice on success.
  result<connection_notice> attempt_once(uint32_t attempt);
  /// register_memory of `reg` again (a pool ferryd is still releasing is asked again, bounded).
  result<none> register_again(const registration& reg);
  /// Drop the Failed event kept for `room` by a lost connection: the id is used again.
  void forget_lost(uint64_t room);
  /// What a call made while disconnected fails with (300, naming the socket and the attempts).
  ferry::error unavailable() const;
  /// The connection was just lost with `e` (reconnecting client): close it, fail the
  /// subscribed rooms, tell on_connection.
  void note_lost(const ferry::error& e);
  void notify(const connection_notice& n);
  /// Track subscriptions: a terminal event ends one.
  void note_event(const proto::event& ev);
  /// A 407 that says this client's own ferryd is draining (the session tells it apart).
  void note_draining(const ferry::error& e);
  result<proto::message> request(const proto::message& m);
  /// Write a whole buffer of frames (a broken pipe reads ferryd's reason, if it sent one).
  result<none> send_bytes(const std::vector<uint8_t>& bytes);
  /// The next frame from ferryd, undecoded.
  result<proto::raw_frame> read_frame(std::chrono::steady_clock::time_point deadline);
  /// Read frames through the session until one answers a request (reply, refused or failed):
  /// events on the way are queued, replies of abandoned requests dropped, and a frame that
  /// ends the connection loses it. On a timeout the requests still waiting are abandoned.
  result<proto::session_outcome> await_outcome(std::chrono::steady_clock::time_point deadline);
  /// The reply a request's outcome carries, or its error (a refusal noted, for a drain).
  result<proto::message> reply_of(proto::session_outcome o);
  /// The next frame, which must be an event (no request is outstanding).
  result<proto::event> read_event(std::chrono::steady_clock::time_point deadline);
  result<none> expect_ok(const proto::message& m);

  /// The error `e`, and the connection marked lost (the first loss of a connection is the one
  /// reported: a reconnecting client closes it and fails its subscribed rooms).
  ferry::error lose(ferry::error e) {
    const bool first = !lost_;
    lost_ = true;
    if (first && policy_ && !attempting_) note_lost(e);
    return e;
  }

  int fd_ = -1;
  bool lost_ = false;
  /// The connection's requests and replies (core/client_session.hpp), one per connection.
  proto::client_session session_;
  uint16_t version_ = proto::protocol_version;
  std::chrono::milliseconds timeout_{std::chrono::seconds(30)};
  proto::frame_reader reader_;
  event_queue events_;  ///< read and not handed out yet (ferry/event_queue.hpp)
  proto::hello_reply hello_;
  shm_region pools_[pool_kind_count];
  uint8_t* attached_[pool_kind_count] = {};

  // Reconnecting (all unused without a policy).
  std::string socket_path_;
  std::string name_;
  bool cancel_on_disconnect_ = true;
  uint16_t max_version_ = proto::protocol_version;
  std::optional<reconnect_policy> policy_;
  std::function<void(const connection_notice&)> on_connection_;
  bool in_callback_ = false;
  bool attempting_ = false;  ///< inside a reconnect attempt: a loss there only fails it
  bool gave_up_ = false;
  bool draining_ = false;
  uint32_t generation_ = 1;
  /// Subscribed on this connection, not yet terminal (a set: an engine may hold thousands).
  std::unordered_set<uint64_t> subscribed_;
  std::vector<registration> registrations_;
  bool was_mapped_[pool_kind_count] = {};    ///< daemon pools mapped before the loss
  std::unordered_set<uint64_t> lost_rooms_;  ///< rooms reported Failed for a loss, until reused
  ferry::error loss_;                        ///< why the connection was lost
  std::string lost_instance_;                ///< the daemon's instance before the loss
  std::chrono::steady_clock::time_point down_since_{}, next_attempt_{};
  uint32_t attempts_ = 0;  ///< failed attempts since the loss
  ferry::error attempt_error_;
};

}  // namespace ferry::client
