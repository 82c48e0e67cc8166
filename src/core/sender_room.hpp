#pragma once
/// A prefill room (one Sender actor, actors/sender.cpp) as a pure state machine: its inputs are
/// events (a decode rank's prepare, a client chunk, a batch posted or done, the packing state,
/// a decode rank's outcome, a cancel, a peer down, a deadline), its outputs are effects (answer
/// the chunk, acknowledge the prepare, post this chunk to every rank, announce the totals, tell
/// the ranks the room failed or how its drain ended, and the lifecycle's status reports and
/// deadlines). The actor keeps the data plane: it plans each chunk with the pure planner
/// (core/plan.hpp, core/pack.hpp), packs head-sliced KV and small runs through staging, and
/// submits write batches, reporting back what it posted (`posted`, `chunk_posted`, `pumped`).
///
/// The rules, on top of the lifecycle's (core/room_lifecycle.hpp):
/// - The room is ready once every decode rank this prefill rank feeds (max(1, Pd/Ps)) has
///   prepared, with the same page count, prefix and TP size; chunks that arrive before are
///   accepted (answered ok) and queued, at most `max_queued_chunks`.
/// - A source page is sent once; a chunk that names one again is refused, naming it.
/// - Every chunk takes the next positions of the decode's page list (one cursor: every rank
///   prepared the same count); a chunk that overruns it, or a last chunk that leaves pages
///   unfilled, is refused and nothing of it is posted.
/// - A chunk may come in layer ranges (core/layer_ranges.hpp): its first send takes its
///   positions, each send posts its layers, and the chunk is complete once every layer of this
///   rank was sent; only then may the next chunk start. The send that completes the last chunk
///   ends the room: the aux row goes with it.
/// - After the send that ends the room, once every send is posted and nothing waits for
///   staging, each rank is told its total of writes (the announcement); the room succeeds when
///   every rank commits.
/// - A failure tells every rank at once and drains: Failed is reported only when every batch
///   posted has completed locally (or the drain deadline passed), so the client never reuses a
///   source page a write still reads; then each rank learns how many of its writes completed.
///
/// The table of every (phase, event) pair is tests/core/test_sender_room.cpp.

#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <variant>
#include <vector>

#include "core/inspect.hpp"
#include "core/layer_ranges.hpp"
#include "core/plan.hpp"
#include "core/protocol.hpp"
#include "core/room_lifecycle.hpp"

namespace ferry::sender {

inline constexpr size_t max_queued_chunks = 4096;

/// What the lifecycle waits for in each status, for the timeout reasons.
inline constexpr std::array<const char*, 3> waits = {
    "waiting for the decode's prepare", "waiting for the client's first chunk",
    "waiting for the last chunk and the decode's commit"};

// The events, fed one at a time to `room::on` (core/inspect.hpp: each a name and its fields).
namespace ev {
using room_ev::start;
/// A decode rank's prepare, as the actor saw it.
struct prepare {
  static constexpr std::string_view name = "prepare";
  uint64_t link = 0;  ///< the rank, as the actor names it (its connection)
  std::string address;
  bool in_group = false;  ///< the rank receives from this prefill rank (its link plan says so)
  uint32_t tp_size = 1, tp_rank = 0, pp_rank = 0;
  uint32_t expected_links = 1;  ///< decode ranks per prefill rank for its TP size
  uint32_t pages = 0;
  uint32_t state_pages = 0;  ///< pages of a paged state pool it named (0 with a Mamba slot)
  uint32_t prefix_tokens = 0;
  uint64_t token = 0;
  result<> indices;  ///< its named indices checked against its declared layout
};
/// The client's send (a chunk, or a layer range of one).
struct chunk {
  static constexpr std::string_view name = "chunk";
  proto::send send;
};
/// The actor posted batch `batch` to link index `link` (writes and bytes of it).
struct posted {
  static constexpr std::string_view name = "posted";
  size_t link = 0;
  uint64_t batch = 0, writes = 0, bytes = 0;
};
/// A `post_chunk` is carried out; `pack_pending`: KV still waits to be packed through staging.
struct chunk_posted {
  static constexpr std::string_view name = "chunk_posted";
  bool pack_pending = false;
};
/// A `pump` is carried out (or staging freed up); `pack_pending` as above.
struct pumped {
  static constexpr std::string_view name = "pumped";
  bool pack_pending = false;
};
/// Batch `batch` completed locally: `completed` writes landed, `failed` did not; `r` says why.
struct batch_done {
  static constexpr std::string_view name = "batch_done";
  uint64_t batch = 0, completed = 0, failed = 0;
  result<> r;
};
/// A rank's outcome (peer_outcome). `in_group`: the rank is one this prefill rank feeds.
struct outcome {
  static constexpr std::string_view name = "outcome";
  uint64_t link = 0;
  std::string address;
  bool in_group = false;
  uint64_t token = 0;
  bool ok = false;
  errc code = errc::ok;
  std::string reason;
};
using room_ev::cancel;
struct peer_down {
  static constexpr std::string_view name = "peer_down";
  errc code = errc::ok;
  std::string why;
};
using room_ev::expired;

inline void inspect(auto& f, prepare& x) {
  f("link", x.link)("address", x.address)("in_group", x.in_group)("tp_size", x.tp_size)(
      "tp_rank", x.tp_rank)("pp_rank", x.pp_rank)("expected_links", x.expected_links)(
      "pages", x.pages)("state_pages", x.state_pages)("prefix_tokens", x.prefix_tokens)(
      "token", x.token)("indices", x.indices);
}
inline void inspect(auto& f, chunk& x) { f("send", x.send); }
inline void inspect(auto& f, posted& x) {
  f("link", x.link)("batch", x.batch)("writes", x.writes)("bytes", x.bytes);
}
inline void inspect(auto& f, chunk_posted& x) { f("pack_pending", x.pack_pending); }
inline void inspect(auto& f, pumped& x) { f("pack_pending", x.pack_pending); }
inline void inspect(auto& f, batch_done& x) {
  f("batch", x.batch)("completed", x.completed)("failed", x.failed)("r", x.r);
}
inline void inspect(auto& f, outcome& x) {
  f("link", x.link)("address", x.address)("in_group", x.in_group)("token", x.token)("ok", x.ok)(
      "code", x.code)("reason", x.reason);
}
inline void inspect(auto& f, peer_down& x) { f("code", x.code)("why", x.why); }
}  // namespace ev

using event =
    std::variant<ev::start, ev::prepare, ev::chunk, ev::posted, ev::chunk_posted, ev::pumped,
                 ev::batch_done, ev::outcome, ev::cancel, ev::peer_down, ev::expired>;

/// One decode rank of the room, in the order they prepared (the actor's links share the index).
struct link_record {
  uint64_t link = 0;
  std::string address;
  uint32_t tp_size = 1;
  uint32_t pages = 0;
  uint32_t state_pages = 0;
  uint32_t prefix_tokens = 0;
  uint64_t token = 0;
  uint64_t writes = 0, bytes = 0;  ///< posted
  uint64_t completed = 0;          ///< completed locally (they land at the decode)
  uint64_t failed = 0;             ///< failed or never posted
  bool committed = false;
};

// The effects, carried out in the order given.
/// Answer the chunk being handled.
struct reply {
  static constexpr std::string_view name = "reply";
  result<> outcome;
};
/// Answer a rank's prepare.
struct ack {
  static constexpr std::string_view name = "ack";
  uint64_t link = 0;
  uint64_t token = 0;
  result<> outcome;
};
/// Plan `chunk` (its pages from position `first`, the layers of its range) for every rank and
/// post it, then report `posted` for each batch and `chunk_posted` once done. The last chunk's
/// sends carry the state segments of their layers; `ends_room` (the send completes the last
/// chunk) carries the aux row.
struct post_chunk {
  static constexpr std::string_view name = "post_chunk";
  proto::send chunk;
  uint32_t first = 0;
  bool ends_room = false;
};
/// Pack and post what waits for staging, then report `pumped`.
struct pump {
  static constexpr std::string_view name = "pump";
};
/// Tell every rank its total (link_record writes and bytes).
struct announce {
  static constexpr std::string_view name = "announce";
};
/// The room failed: tell every rank (peer_outcome), drop what waits for staging.
struct tell_failed {
  static constexpr std::string_view name = "tell_failed";
  std::string reason;
  errc code = errc::ok;
  size_t in_flight = 0;  ///< write batches still draining
};
/// The drain is over: tell every rank how many of its writes completed (peer_drained).
struct tell_drained {
  static constexpr std::string_view name = "tell_drained";
};
/// The lifecycle's: cancel and arm deadlines, report a status, end the actor.
struct life {
  static constexpr std::string_view name = "life";
  lifecycle_effects effects;
};

inline void inspect(auto& f, reply& x) { f("outcome", x.outcome); }
inline void inspect(auto& f, ack& x) { f("link", x.link)("token", x.token)("outcome", x.outcome); }
inline void inspect(auto& f, post_chunk& x) {
  f("chunk", x.chunk)("first", x.first)("ends_room", x.ends_room);
}
inline void inspect(auto&, pump&) {}
inline void inspect(auto&, announce&) {}
inline void inspect(auto& f, tell_failed& x) {
  f("reason", x.reason)("code", x.code)("in_flight", x.in_flight);
}
inline void inspect(auto&, tell_drained&) {}
inline void inspect(auto& f, life& x) { f("effects", x.effects); }

using effect =
    std::variant<reply, ack, post_chunk, pump, announce, tell_failed, tell_drained, life>;
using effects = std::vector<effect>;

class room {
 public:
  /// `tp_rank`, `tp_size`, `pp_rank`: this prefill rank, for refusals; `layers`: the global
  /// layer ids it holds (core/layout.hpp `layer_ids`), which layer-wise sends name.
  room(uint64_t id, lifecycle_limits limits, uint32_t tp_rank, uint32_t tp_size, uint32_t pp_rank,
       std::vector<uint32_t> layers = {});
  room() = default;

  /// Feed the room one event: what it asks of its actor, in order.
  effects on(event e);

  room_phase phase() const { return life_.phase(); }
  const room_lifecycle& lifecycle() const { return life_; }
  bool ready() const { return expected_ && links_.size() == expected_; }
  const std::vector<link_record>& links() const { return links_; }
  uint32_t prefix_tokens() const { return ready() ? prefix_ : 0; }
  size_t queued() const { return queued_.size(); }
  size_t in_flight() const { return batches_.size(); }
  uint64_t bytes() const;
  /// The ranks' addresses, comma-separated, for logs.
  std::string peer_name() const;

 private:
  effects handle(ev::start);
  effects handle(ev::prepare in);
  effects handle(ev::chunk e);
  effects handle(ev::posted e);
  effects handle(ev::chunk_posted e);
  effects handle(ev::pumped e);
  effects handle(ev::batch_done e);
  effects handle(ev::outcome e);
  effects handle(ev::cancel e);
  effects handle(ev::peer_down e);
  effects handle(ev::expired e);
  result<> check(const ev::prepare& in, bool& fatal) const;
  /// A last chunk's state pages against the count the decode ranks prepared.
  result<> state_pages_match(const proto::send& c) const;
  void take_chunk(proto::send c, effects& out);
  void fail(errc code, std::string reason, effects& out);
  void finish_drain(const std::string& note, effects& out);
  void maybe_announce(effects& out);
  void advance(room_status s, effects& out);

  uint64_t id_ = 0;
  room_lifecycle life_;
  uint32_t tp_rank_ = 0, tp_size_ = 1, pp_rank_ = 0;
  std::vector<link_record> links_;
  uint32_t expected_ = 0;  ///< known from the first prepare's geometry
  uint32_t prefix_ = 0;
  chunk_cursor cursor_;
  chunk_layers layers_;      ///< the open chunk's layers sent (layer-wise sends)
  uint32_t open_first_ = 0;  ///< the open chunk's first page position (once ready)
  /// A send accepted before every rank prepared, with what taking it did to its chunk.
  struct queued_send {
    proto::send send;
    chunk_layers::step step;
  };
  std::deque<queued_send> queued_;
  std::unordered_set<uint32_t> sent_pages_;
  std::unordered_map<uint64_t, size_t> batches_;  ///< in flight -> link index
  int unposted_ = 0;                              ///< post_chunk effects not yet carried out
  bool last_taken_ = false;                       ///< the send that ends the room was taken
  bool pack_pending_ = false;
  bool announced_ = false;
};

}  // namespace ferry::sender
