#pragma once
/// One peer channel connection (core/peer_wire.hpp) between two daemons, once the peer gate
/// (transport/channels/peer_gate.hpp) has run the preamble on its socket.
///
/// Inbound: the gate's thread reads the socket, checks and decodes whole frames and hands each
/// message to the link's owner (`bind`): one hop, from the thread that read the frame to the
/// owner's mailbox. Outbound: `send` seals the frame and writes it from the caller's thread at
/// once when nothing is queued before it; what the socket does not take waits in the link and
/// the gate's thread writes it when the socket drains. A peer that leaves more than
/// `max_unsent` bytes unread has the link closed, so a stuck peer cannot grow this daemon's
/// memory. Ordering is TCP's; loss shows as the connection's end (the owner's `on_closed`) or,
/// for a peer that stops answering, as missing heartbeats (the Connection's).
///
/// Thread-safe: `send`, `bind`, `close` from any thread; the gate alone reads, and closes the
/// descriptor once the link is over.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/peer_wire.hpp"

namespace ferry {

class peer_link {
 public:
  /// Where inbound messages go; runs on the gate thread (keep it short: post and return).
  using deliver_fn = std::function<void(peer_wire::message&&)>;
  /// The link ended other than by this side's `close`: the peer closed it, it failed, or the
  /// peer sent a frame that does not check (the reason says which).
  using closed_fn = std::function<void(const std::string& why)>;

  inline static constexpr size_t default_max_unsent = 128u << 20;

  peer_link(int fd, int epoll_fd, std::string peer_node, std::string source,
            peer_wire::link_keys keys, size_t max_unsent = default_max_unsent);
  ~peer_link();
  peer_link(const peer_link&) = delete;
  peer_link& operator=(const peer_link&) = delete;

  /// Make `on_message` and `on_closed` the link's owner. What arrived before is delivered now,
  /// in order. With `one_message`, the link stops reading after it delivered one message, until
  /// the next `bind` (so a first message can be judged before the next is read).
  void bind(deliver_fn on_message, closed_fn on_closed, bool one_message = false);
  /// Send `m`; false once the link is over.
  bool send(const peer_wire::message& m);
  /// End the link from this side: no more is sent or delivered, the owner's `on_closed` is not
  /// called; what is queued is still written, then the stream's end, and the gate reads (and
  /// drops) until the peer closes too or `linger` passes, so no reset discards the last frames
  /// (a refusal, say). Idempotent.
  void close(const std::string& why);
  bool closed() const;
  /// How long a link closed here waits for the peer's end before its socket is closed anyway.
  inline static constexpr auto linger = std::chrono::seconds(2);
  /// Closed here longer ago than `linger`, its socket still open (the gate then finishes it).
  bool lingered(std::chrono::steady_clock::time_point now) const;
  const std::string& peer_node() const { return peer_node_; }
  /// The remote address, for logs.
  const std::string& source() const { return source_; }

  /// Messages delivered so far (a link that has said nothing has not said hello).
  uint64_t frames_in() const { return frames_in_.load(); }

  // The gate's thread only.
  /// An epoll event on the socket; false once the link is over (the gate then calls finish()).
  bool on_event(uint32_t events);
  /// Forget the socket: close it. The link stays valid for those who hold it (sends fail).
  void finish();

 private:
  struct graveyard;
  void parse_locked(graveyard& dead);
  void flush_locked(graveyard& dead);
  void update_events_locked();
  /// Once closed here: the end of our stream, after what was queued.
  void shut_write_locked();
  /// Once closed here: read and drop what the peer still sends; true at its end (or a failure).
  bool drain_locked();
  /// The link ended by the peer or by a failure: the owner is told once, after the unlock.
  void end_locked(const std::string& why, graveyard& dead);

  mutable std::mutex mutex_;
  int fd_;
  const int epoll_fd_;
  const std::string peer_node_, source_;
  const size_t max_unsent_;
  peer_wire::frame_writer writer_;
  peer_wire::frame_reader reader_;
  deliver_fn on_message_;
  closed_fn on_closed_;
  bool one_message_ = false, paused_ = true, closed_ = false, write_armed_ = false;
  bool closed_here_ = false;  ///< by close() or finish(): the owner is not told
  bool shut_ = false;         ///< closed here, and the end of our stream sent
  std::chrono::steady_clock::time_point closed_at_{};
  std::string reason_;
  std::vector<uint8_t> out_;
  size_t out_pos_ = 0;
  std::atomic<uint64_t> frames_in_{0};
};

using peer_link_ptr = std::shared_ptr<peer_link>;

}  // namespace ferry
