#pragma once
/// A decode room (one Receiver actor, actors/receiver.cpp) as a pure state machine: its inputs
/// are events (a named prefill peer resolved or unusable, staging granted or freed, a prefill
/// rank's acknowledgement, announcement, outcome or drain report, writes landed, the unpack
/// done, a cancel, a peer down, a deadline), its outputs are effects (reserve staging, send the
/// prepares, tell the ranks the outcome, unpack, fence a rank, release staging, and the
/// lifecycle's status reports and deadlines). The actor keeps the data plane: it looks the
/// named peers up, decides which links land in staging (core/pack.hpp), sends the messages,
/// copies KV out of staging.
///
/// The rules, on top of the lifecycle's (core/room_lifecycle.hpp):
/// - Once every named peer is resolved (handshake done or failed), the ranks the geometry needs
///   are selected among the usable ones (select_prefill_peers); an unusable peer matters only if
///   it is needed. KV that lands in staging (head-sliced KV to unpack, or a fragmented page
///   list's whole pages to scatter) lands in one staging block for the room. When every link
///   landing there can ask for it (peer version 10), the block is reserved when the first of
///   them asks, its writes being about to start, and each asking link is granted its offset
///   (the room waits for it in WaitingForInput, as its prefill ranks do, bounded by that
///   status's deadline and the whole room's, timeouts.transfer_ms);
///   otherwise it is reserved before the prepares go out. When staging is full, a room that
///   must unpack waits; a room whose block is only worth having (every link scatters) does not
///   wait: its KV goes one write per run. A room larger than the whole area falls back to one
///   write per token, or per run.
/// - WaitingForInput once every selected rank accepted; Transferring at the first write landed
///   or announcement. Success is never inferred from a local event: only when the writes counted
///   as landed (remote CQ data) equal the sum of every rank's announced total, then after the
///   unpack. More writes than announced fails the room.
/// - Failed means "the pages, slot, row and staging of this room may be reused". So once the
///   prepares went out a failing room drains: every rank must have refused, been fenced, or
///   reported how many of its writes completed and had that many land. At the drain deadline the
///   ranks still open are fenced (their connections end, closing their keys), and the fences
///   complete the drain: Failed is never reported while a write may still land.
///
/// The table of every (phase, event) pair is tests/core/test_receiver_room.cpp.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/geometry.hpp"
#include "core/inspect.hpp"
#include "core/plan.hpp"
#include "core/room_lifecycle.hpp"

namespace ferry::receiver {

/// What the lifecycle waits for in each status, for the timeout reasons.
inline constexpr std::array<const char*, 3> waits = {
    "waiting for the prefill peers, staging and their acceptance", "waiting for the first write",
    "waiting for the remaining writes"};

/// One selected prefill rank (named peer `named`; its writes carry `token`).
struct link_record {
  size_t named = 0;
  std::string address;
  uint64_t token = 0;
  uint64_t unpack_bytes = 0;        ///< staging its KV lands in (0: none)
  bool optional = false;            ///< a block to scatter: worth having, not worth a wait
  std::optional<uint64_t> staging;  ///< where in the room's block it lands
  bool on_request = false;          ///< its prepare said: ask for the staging offset
  bool requested = false;           ///< it asked (granted once the block is reserved)
  bool accepted = false;
  bool refused = false;  ///< refused the prepare: it never writes
  bool fenced = false;   ///< its connection ended and its registrations are closed
  std::optional<uint64_t> announced;
  std::optional<uint64_t> drained;  ///< writes it completed, once its room failed
  bool must_fence = false;          ///< it reported failed writes: only its fence settles it
  uint64_t landed = 0;
  /// No write of this rank can land in the room any more.
  bool settled() const {
    return refused || fenced || (!must_fence && drained && landed >= *drained);
  }
};

// The events, fed one at a time to `room::on` (core/inspect.hpp: each a name and its fields).
namespace ev {
using room_ev::start;
/// Named peer `i` finished its handshake: its geometry, and the staging its KV would land in
/// (plan_landing); `optional`: a block to scatter, which the room does not wait for; `asks`: it
/// asks for its staging offset when its writes are about to start (version 10).
struct resolved {
  static constexpr std::string_view name = "resolved";
  size_t i = 0;
  rank_schema schema;
  uint64_t unpack_bytes = 0;
  bool optional = false;
  bool asks = false;
};
/// Named peer `i` cannot be used (its handshake failed).
struct unusable {
  static constexpr std::string_view name = "unusable";
  size_t i = 0;
  errc code = errc::ok;
  std::string why;
};
/// Named peer `i`'s writes are about to start: it asks where its KV lands in staging.
struct staging_requested {
  static constexpr std::string_view name = "staging_requested";
  size_t i = 0;
  uint64_t token = 0;
};
/// A `reserve_staging` got the block at `at`.
struct staging_reserved {
  static constexpr std::string_view name = "staging_reserved";
  uint64_t at = 0;
};
/// Staging freed up (a reservation that waits asks again).
struct staging_freed {
  static constexpr std::string_view name = "staging_freed";
};
/// A reservation that was not to wait found staging full: the optional blocks are dropped.
struct staging_declined {
  static constexpr std::string_view name = "staging_declined";
};
/// A prefill rank's answer to its prepare.
struct prepare_ack {
  static constexpr std::string_view name = "prepare_ack";
  size_t i = 0;
  uint64_t token = 0;
  bool ok = false;
  errc code = errc::ok;
  std::string reason;
};
/// A prefill rank's total of writes.
struct announce {
  static constexpr std::string_view name = "announce";
  size_t i = 0;
  uint64_t token = 0, writes = 0, bytes = 0;
};
/// A prefill rank's outcome (peer_outcome).
struct outcome {
  static constexpr std::string_view name = "outcome";
  size_t i = 0;
  uint64_t token = 0;
  bool ok = false;
  errc code = errc::ok;
  std::string reason;
};
/// Rank `i` drained: `completed` of its writes (notifications) completed and `failed` did not.
/// A failed write may leave writes of its batch placed or in flight that no landed notification
/// covers, so a rank that reports one is fenced.
struct drained {
  static constexpr std::string_view name = "drained";
  size_t i = 0;
  uint64_t token = 0, completed = 0, failed = 0;
};
/// `count` writes carrying `token` landed.
struct landed {
  static constexpr std::string_view name = "landed";
  uint64_t token = 0, count = 0;
};
/// The `unpack` is done.
struct unpacked {
  static constexpr std::string_view name = "unpacked";
};
/// The `verify` is done: `code` ok when every digest matched, else checksum_mismatch (or why it
/// could not check) and the first difference.
struct verified {
  static constexpr std::string_view name = "verified";
  errc code = errc::ok;
  std::string reason;
};
using room_ev::cancel;
/// Named peer `i`'s connection ended (`fenced`: its registrations are closed).
struct peer_down {
  static constexpr std::string_view name = "peer_down";
  size_t i = 0;
  bool fenced = false;
  errc code = errc::ok;
  std::string why;
};
using room_ev::expired;

inline void inspect(auto& f, resolved& x) {
  f("i", x.i)("schema", x.schema)("unpack_bytes", x.unpack_bytes)("optional", x.optional)("asks",
                                                                                          x.asks);
}
inline void inspect(auto& f, unusable& x) { f("i", x.i)("code", x.code)("why", x.why); }
inline void inspect(auto& f, staging_requested& x) { f("i", x.i)("token", x.token); }
inline void inspect(auto& f, staging_reserved& x) { f("at", x.at); }
inline void inspect(auto&, staging_freed&) {}
inline void inspect(auto&, staging_declined&) {}
inline void inspect(auto& f, prepare_ack& x) {
  f("i", x.i)("token", x.token)("ok", x.ok)("code", x.code)("reason", x.reason);
}
inline void inspect(auto& f, announce& x) {
  f("i", x.i)("token", x.token)("writes", x.writes)("bytes", x.bytes);
}
inline void inspect(auto& f, outcome& x) {
  f("i", x.i)("token", x.token)("ok", x.ok)("code", x.code)("reason", x.reason);
}
inline void inspect(auto& f, drained& x) {
  f("i", x.i)("token", x.token)("completed", x.completed)("failed", x.failed);
}
inline void inspect(auto& f, landed& x) { f("token", x.token)("count", x.count); }
inline void inspect(auto&, unpacked&) {}
inline void inspect(auto& f, verified& x) { f("code", x.code)("reason", x.reason); }
inline void inspect(auto& f, peer_down& x) {
  f("i", x.i)("fenced", x.fenced)("code", x.code)("why", x.why);
}
}  // namespace ev

using event = std::variant<ev::start, ev::resolved, ev::unusable, ev::staging_requested,
                           ev::staging_reserved, ev::staging_freed, ev::staging_declined,
                           ev::prepare_ack, ev::announce, ev::outcome, ev::drained, ev::landed,
                           ev::unpacked, ev::verified, ev::cancel, ev::peer_down, ev::expired>;

// The effects, carried out in the order given.
/// Reserve `bytes` of staging; answered by `staging_reserved`, or, when full, later by
/// `staging_freed` (`wait`) or at once by `staging_declined` (not `wait`: every link's block
/// is optional).
struct reserve_staging {
  static constexpr std::string_view name = "reserve_staging";
  uint64_t bytes;
  bool wait = true;
};
/// The room's KV would need more staging than the whole area (or, `full`, its optional block
/// found staging full): one write per token (sliced) or per run (whole pages) instead.
struct no_staging {
  static constexpr std::string_view name = "no_staging";
  uint64_t need;
  bool full = false;
};
/// Send every link its prepare (with its token and staging offset, or `staging_on_request`
/// for a link with `on_request`).
struct send_prepares {
  static constexpr std::string_view name = "send_prepares";
};
/// Tell link `link` where its KV lands in staging (its `staging`, none: write directly).
struct grant {
  static constexpr std::string_view name = "grant";
  size_t link;
};
/// Tell every link how the room ended (peer_outcome).
struct tell {
  static constexpr std::string_view name = "tell";
  bool ok;
  std::string reason;
  errc code;
};
/// The room failed (for the log).
struct failed {
  static constexpr std::string_view name = "failed";
  std::string reason;
};
/// Copy the KV that landed in staging into the pages (links with `staging`); then `unpacked`.
struct unpack {
  static constexpr std::string_view name = "unpack";
};
/// Digest what landed and compare it with each rank's digests (a checked room); then
/// `verified`.
struct verify {
  static constexpr std::string_view name = "verify";
};
/// The room's staging block may be reused.
struct release_staging {
  static constexpr std::string_view name = "release_staging";
  uint64_t at;
};
/// End link `link`'s connection (its keys closed): its drain did not complete in time.
struct fence {
  static constexpr std::string_view name = "fence";
  size_t link;
  std::string reason;
};
/// The lifecycle's: cancel and arm deadlines, report a status, end the actor.
struct life {
  static constexpr std::string_view name = "life";
  lifecycle_effects effects;
};

inline void inspect(auto& f, reserve_staging& x) { f("bytes", x.bytes)("wait", x.wait); }
inline void inspect(auto& f, no_staging& x) { f("need", x.need)("full", x.full); }
inline void inspect(auto&, send_prepares&) {}
inline void inspect(auto& f, grant& x) { f("link", x.link); }
inline void inspect(auto& f, tell& x) { f("ok", x.ok)("reason", x.reason)("code", x.code); }
inline void inspect(auto& f, failed& x) { f("reason", x.reason); }
inline void inspect(auto&, unpack&) {}
inline void inspect(auto&, verify&) {}
inline void inspect(auto& f, release_staging& x) { f("at", x.at); }
inline void inspect(auto& f, fence& x) { f("link", x.link)("reason", x.reason); }
inline void inspect(auto& f, life& x) { f("effects", x.effects); }

using effect = std::variant<reserve_staging, no_staging, send_prepares, grant, tell, failed, unpack,
                            verify, release_staging, fence, life>;
using effects = std::vector<effect>;

class room {
 public:
  /// `named`: the prefill peers the client named (their addresses); named peer i's link uses
  /// token `first_token + i`. `staging_capacity`: fabric.staging_bytes (0: none). `checks`:
  /// what lands is verified against the ranks' digests before Success (integrity.checksums, or
  /// the client's prepare.checksum).
  room(uint64_t id, lifecycle_limits limits, rank_schema mine, std::vector<std::string> named,
       uint64_t first_token, uint32_t pages, uint64_t staging_capacity, bool checks = false);
  room() = default;

  /// Feed the room one event: what it asks of its actor, in order.
  effects on(event e);

  room_phase phase() const { return life_.phase(); }
  const room_lifecycle& lifecycle() const { return life_; }
  bool selected() const { return selected_; }
  bool prepared() const { return prepared_; }
  /// The room's staging block is reserved when its links ask (not before the prepares).
  bool staging_on_request() const { return on_request_; }
  /// A reservation is out and waits for staging to free up.
  bool waiting_for_staging() const { return reserving_; }
  uint64_t staging_need() const { return staging_need_; }
  bool all_accepted() const;
  const std::vector<link_record>& links() const { return links_; }
  /// The link of named peer `i`, if it was selected.
  const link_record* link_of(size_t i) const;
  uint64_t bytes() const { return bytes_; }
  const commit_counter& commit() const { return commit_; }

 private:
  struct named_peer {
    std::string address;
    bool resolved = false;
    rank_schema schema;
    uint64_t unpack_bytes = 0;
    bool optional = false;
    bool asks = false;
    std::string unusable;  ///< why it cannot be used ("" = fine or not known yet)
    errc code = errc::ok;
  };
  effects handle(ev::start);
  effects handle(ev::resolved e);
  effects handle(ev::unusable e);
  effects handle(ev::staging_requested e);
  effects handle(ev::staging_reserved e);
  effects handle(ev::staging_freed);
  effects handle(ev::staging_declined);
  effects handle(ev::prepare_ack e);
  effects handle(ev::announce e);
  effects handle(ev::outcome e);
  effects handle(ev::drained e);
  effects handle(ev::landed e);
  effects handle(ev::unpacked);
  effects handle(ev::verified e);
  effects handle(ev::cancel e);
  effects handle(ev::peer_down e);
  effects handle(ev::expired e);
  link_record* link(size_t i, uint64_t token);
  void select(effects& out);
  void reserve_and_prepare(effects& out);
  void grant_requested(effects& out);
  void evaluate(commit_counter::state c, effects& out);
  void succeed(effects& out);
  /// Every write landed and any unpack is done: verify first when the room checks.
  void landed_all(effects& out);
  void fail(errc code, std::string reason, bool tell_peers, effects& out);
  void finish_drain(effects& out);
  void release(effects& out);
  void advance(room_status s, effects& out);
  bool ended() const { return life_.draining() || life_.terminal(); }

  uint64_t id_ = 0;
  room_lifecycle life_;
  rank_schema mine_;
  std::vector<named_peer> named_;
  size_t looked_up_ = 0;  ///< named peers resolved either way
  uint64_t first_token_ = 0;
  uint32_t pages_ = 0;
  uint64_t capacity_ = 0;
  bool selected_ = false;
  std::vector<link_record> links_;
  uint64_t staging_need_ = 0;
  bool on_request_ = false;          ///< the block is reserved when a link asks
  bool reserving_ = false;           ///< a reserve_staging is out
  std::optional<uint64_t> staging_;  ///< the room's block
  bool prepared_ = false;
  bool unpacking_ = false;
  bool checks_ = false;     ///< a checked room: verify before Success
  bool verifying_ = false;  ///< a verify is out
  commit_counter commit_;
  uint64_t bytes_ = 0;
  std::string drain_note_;  ///< what the drain deadline found (and fenced)
};

}  // namespace ferry::receiver
