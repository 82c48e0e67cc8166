#pragma once
/// The state of a Sender (actors/sender.cpp: messages, the machine's effects) shared with its
/// data plane (actors/sender_post.cpp: planning, packing and posting write batches).

#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "actors/actors.hpp"
#include "actors/room_lifecycle_glue.hpp"
#include "actors/room_trace.hpp"
#include "core/pack.hpp"
#include "core/plan.hpp"
#include "core/sender_room.hpp"
#include "transport/channels/client_gateway.hpp"

namespace ferry::sending {

/// The data plane of one decode rank (machine link i is links[i]).
struct decode_link {
  peer_info_ptr peer;
  caf::actor connection;
  peer_prepare prep;
  std::vector<uint32_t> dst_state_pages{};  // a paged state pool's (peer_prepare_paged)
  std::deque<pack_job> jobs;  // KV waiting to be gathered through staging (core/pack.hpp)
  // Sends held until the decode grants this link's staging (prep.dst_staging is
  // staging_on_request until then); `asked`: the request went out.
  std::vector<sender::post_chunk> held{};
  bool asked = false;
  bool digests = false;  // it prepared with peer_prepare_checked: send it our digests
};

struct sender_state {
  static inline const char* name = "ferry.sender";
  context_ptr ctx;
  caf::actor scheduler;
  uint64_t room = 0;
  sender::room machine;  // the room's rules (core/sender_room.hpp)
  deadline_tokens timers{};
  std::vector<decode_link> links;
  uint64_t next_batch = 1;
  /// Carried by every batch of the room: its failure cancels what is not posted yet.
  std::shared_ptr<transport::write_cancel> cancel = std::make_shared<transport::write_cancel>();
  bool pump_scheduled = false;  // a pump_atom to self is on its way
  std::vector<planned_write> writes;
  std::vector<strided_copy> copies;
  std::vector<pack_job> slice;         // the jobs of one packed batch
  std::unique_ptr<trace::file> trace;  // FERRY_TRACE_DIR (actors/room_trace.hpp)
  commit_clock commit;                 // where the commit phase starts (actors/metrics.hpp)
  room_timeline timeline;              // its milestones (actors/room_timeline.hpp)
  uint32_t prepares = 0;               // decode prepares taken (room_update::prepares)
  /// What the room sends, by position, for the digests of links that ask (peer_announce_checked).
  std::vector<uint32_t> src_pages{}, src_state_pages{};
  uint32_t src_slot = no_index, src_row = no_index;
};

using sender_actor = caf::stateful_actor<sender_state>;

/// What the effects of one event answer: the client request being handled, the connection a
/// prepare came from.
struct answering {
  const client_request* request = nullptr;
  caf::actor prepare_from;
  peer_info_ptr prepare_peer;  ///< the peer whose prepare this answers
};

void apply(sender_actor* self, sender::effects fx, const answering& to = {});

// The data plane (actors/sender_post.cpp).

/// Whether KV still waits: to be packed through staging, or for the decode's staging grant.
bool pack_pending(const sender_state& st);
/// Pack and post queued KV while staging lasts, a slice at a time: each slice is one batch,
/// whose completion releases it. When staging is full, the room resumes on its next batch
/// completion or staging release (staging_atom), whichever comes first. After a quantum of
/// copying it yields (pump_atom to itself), so no worker copies for long.
void pump(sender_actor* self);
/// Pump, then tell the machine whether anything still waits for staging.
void pumped(sender_actor* self);
/// Plan one send for link `i`, the layers of its range (core/pack.hpp): runs that go straight
/// out are posted now; runs gathered through staging (always so for head-sliced KV) queue for
/// the pump. The last chunk's sends add the state segments of their layers, and the send that
/// ends the room the aux row.
void post_link(sender_actor* self, size_t i, const sender::post_chunk& post);

/// Feed the machine one event, traced with FERRY_TRACE_DIR (actors/room_trace.hpp).
inline sender::effects feed(sender_state& st, sender::event e) {
  return trace::feed(st.trace.get(), st.machine, std::move(e));
}

}  // namespace ferry::sending
