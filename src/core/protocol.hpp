#pragma once
/// Local client protocol (docs/protocol.md): framed binary messages over a unix stream socket.
///
/// Every message and field is described once, in src/core/wire.yaml, from which
/// scripts/gen_wire.py generates the body codecs of this library and of the Python client.
///
/// Frame: u32 length (bytes after this field) | u16 type | u16 flags (0) | u32 seq | body.
/// All integers little-endian. Strings: u32 byte count + bytes. Lists: u32 count + elements.
/// A reply echoes the request's seq; pushed events carry seq 0.
///
/// Versions 3 to 10 (docs/protocol.md, "Versions"): the hello says the client's range, the
/// daemon answers in the highest common version, and the encoding of a few messages depends on
/// it (`encode`/`decode` take the connection's version).
///
/// The Mamba state slot and aux row are scalar u32 fields (no_index = absent): a list of state
/// indices cannot be expressed. A frame with bytes left over after its last field is rejected.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

// Installed with Ferry::client: neighbours included by file name (src/core/CMakeLists.txt).
#include "errors.hpp"
#include "layout.hpp"
#include "protocol_wire.hpp"
#include "status.hpp"

namespace ferry::proto {

// Versions, limits and the frame types (msg_type) are generated from wire.yaml, as is every
// body's codec: protocol_wire.hpp, protocol_codec.cpp.

// --- requests (client -> ferryd) ---
struct hello {
  uint16_t version = protocol_version;  ///< the highest version the client speaks
  std::string client_name;
  /// Rooms this connection creates (a decode prepare, a prefill room's first send) are
  /// cancelled when it closes. Libraries set it; ferryctl, whose commands each use their own
  /// connection, does not.
  bool cancel_on_disconnect = true;
  /// The lowest version the client speaks (on the wire only when `version` >= 4).
  uint16_t min_version = min_protocol_version;
};
/// Decode side: where this room's bytes must land.
struct prepare {
  uint64_t room = 0;
  /// Control addresses "host:port" of the prefill ferryds to receive from: the ranks this
  /// decode rank needs (ferryd picks them by the geometry declared at handshake, so naming every
  /// rank of the prefill instance is fine).
  std::vector<std::string> prefill_peers;
  std::vector<uint32_t> dst_pages;  ///< destination KV pages, in token order
  uint32_t state_slot = no_index;   ///< exactly one destination Mamba slot
  uint32_t aux_row = no_index;      ///< destination aux row
  /// v4: tokens of the prompt the decode already holds (SGLang's decode_prefix_len); carried
  /// to the prefill, whose poll answers it, so its engine sends from there.
  uint32_t prefix_tokens = 0;
  /// v8: the destination pages of a paged state pool (swa, dsa, minimax_index_k: its own page
  /// list, e.g. the sliding window's pages); empty for a Mamba pool, which takes `state_slot`.
  std::vector<uint32_t> state_pages{};
  /// v10: check this room end to end (docs/reliability.md, "Checksums"): it reports Success
  /// only once the landed bytes digest as the prefill's did, as every room of a daemon with
  /// `integrity.checksums` does.
  bool checksum = false;
};
/// Prefill side: one chunk of the room, or (v6) the layers [first_layer, first_layer +
/// layer_count) of one chunk; the last chunk's sends carry the state slot and aux row.
/// Layer-wise sends (docs/protocol.md, "Layer-wise sends"): every send of a chunk names its
/// pages, each of the rank's layers once; the chunk is complete when all were named, and the
/// room's aux row goes with the send that completes its last chunk.
struct send {
  uint64_t room = 0;
  std::vector<uint32_t> src_pages;
  bool last = false;
  uint32_t state_slot = no_index;  ///< exactly one source Mamba slot (last chunk only)
  uint32_t aux_row = no_index;     ///< source aux row (last chunk only)
  uint32_t first_layer = 0;        ///< v6: the first global layer id of the range
  uint32_t layer_count = 0;        ///< v6: layers in the range; 0 = every layer of the rank
  /// v8: the source pages of a paged state pool (last chunk only; as many as the decode's)
  std::vector<uint32_t> state_pages{};
};
inline void inspect(auto& f, send& x) {
  f("room", x.room)("src_pages", x.src_pages)("last", x.last)("state_slot", x.state_slot)(
      "aux_row", x.aux_row)("first_layer", x.first_layer)("layer_count", x.layer_count)(
      "state_pages", x.state_pages);
}
struct poll {
  uint64_t room = 0;
};
struct cancel {
  uint64_t room = 0;
};
struct subscribe {
  uint64_t room = 0;
};
/// What an `info` asks for; the reply is a JSON document (docs/protocol.md, "Info documents").
enum class info_topic : uint8_t { status = 0, rooms = 1, peers = 2, pools = 3, timelines = 4 };
struct info {
  info_topic topic = info_topic::status;
};
/// v4: the status of many rooms in one round trip.
struct poll_many {
  std::vector<uint64_t> rooms;
};
/// v4: every rank of the engine instance whose daemon listens at `address`.
struct discover {
  std::string address;
};
/// Kinds of memory a client may lend (docs/gpu.md); this build registers host memory only.
enum class memory_kind : uint8_t { host = 0, cuda_dmabuf = 1, cuda_ipc = 2, cuda_vmm_fd = 3 };
const char* to_string(memory_kind k);
/// One buffer of a lent pool: bytes [fd_offset, fd_offset + item_bytes * items) of the frame's
/// descriptor `fd_index`, and what the buffer is (as the pool's layout lists it).
struct memory_buffer {
  uint32_t fd_index = 0;
  uint64_t fd_offset = 0;
  uint64_t item_bytes = 0;
  uint64_t items = 0;
  uint32_t layer_id = 0;
  uint32_t tensor = 0;
  buffer_kind kind = buffer_kind::aux;
  // v7: how the buffer is sliced across TP ranks, as SGLang's KVArgs says it (what ferryd needs
  // to describe a pool from its registration; zero where it does not apply).
  uint32_t slice_dim = 0;  ///< KV: heads at this rank; state: the sliced axis' length here
  uint32_t total_dim = 0;  ///< KV: heads of the whole model (0: slice_dim x TP)
  uint64_t outer = 0;      ///< state: product of the dims before the sliced axis (0 taken as 1)
  std::vector<uint64_t> groups{};  ///< state: full (unsharded) group sizes along the sliced axis
  /// v9, state: units of each group (empty: every group's units are its elements), for groups
  /// held whole by several ranks (Mamba2 B and C with n_groups below TP; config shard_units)
  std::vector<uint64_t> units{};
  bool operator==(const memory_buffer&) const = default;
};
/// v4: a client lends its own memory for a `memory: client` pool; `fd_count` descriptors ride
/// on the frame's first byte (SCM_RIGHTS). v7: with the facts that describe a pool whose config
/// leaves its description to the registration (docs/protocol.md, register_memory).
struct register_memory {
  static constexpr uint32_t no_room_id = 0xFFFFFFFFu;
  pool_kind pool = pool_kind::kv;
  memory_kind kind = memory_kind::host;
  uint32_t fd_count = 0;
  std::vector<memory_buffer> buffers;
  uint32_t page_tokens = 0;  ///< v7, kv: tokens per page
  /// v7, aux: the buffer whose rows start with the room id (SGLang's `bootstrap_room`), or none
  uint32_t room_id_buffer = no_room_id;
  state_type state = state_type::mamba;  ///< v8, state: what the pool holds (its indexing)
};

/// v5: start the drain a SIGTERM starts (docs/operations.md, "Drain"): no new rooms, the
/// accepted ones run to their end, then ferryd exits. Answered `ok` at once; again while the
/// drain runs, `ok` again (it never turns into the second signal's stop at once).
struct drain {};
/// v5: set the level of one of ferryd's loggers (`logger`), or of all of them (`logger` empty),
/// while it runs; answered `ok`, or invalid_request naming the unknown logger or level.
struct set_log_level {
  std::string logger;
  std::string level;  ///< trace, debug, info, warn, error or off
};

// --- replies and events (ferryd -> client) ---
struct ok {};
/// The error reply is the error vocabulary's own type (core/errors.hpp).
using error = ferry::error;
struct pool_info {
  bool present = false;
  std::string shm_name;  ///< POSIX shm object to map (shm_open)
  pool_layout layout;
  /// v7: described by its registration (`memory: client` and nothing else in the config): a
  /// client registers it from its own tensors, not from `layout` (the first registration's).
  bool registered = false;
};
struct hello_reply {
  uint16_t version = protocol_version;
  std::string node;
  std::string instance;
  std::string role;
  std::string control;  ///< the daemon's control address (what a decode prepare names)
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  uint32_t page_tokens = 0;  ///< tokens per KV page (0 without a kv pool)
  std::string config_yaml;   ///< the daemon's effective config (geometry of pools and ranks)
  pool_info pools[pool_kind_count];
  /// v4: the range the daemon speaks.
  uint16_t min_version = min_protocol_version;
  uint16_t max_version = protocol_version;
};
struct poll_reply {
  uint64_t room = 0;
  room_status status = room_status::failed;
  std::string reason;
  errc code = errc::ok;  ///< v4: why it failed (ok unless Failed)
  /// v4, prefill side: the decode's prepare.prefix_tokens once every decode rank prepared
  /// (WaitingForInput and after); 0 before and on a decode.
  uint32_t prefix_tokens = 0;
};
struct info_reply {
  std::string text;  ///< the topic's JSON document
};
struct event {
  uint64_t room = 0;
  room_status status = room_status::failed;
  std::string reason;
  errc code = errc::ok;        ///< v4: why it failed (ok unless Failed)
  uint32_t prefix_tokens = 0;  ///< v4: as in poll_reply
};
/// One rank of a discovered instance: its position when its daemon answered, else why not.
struct discovered_rank {
  std::string address;
  bool up = false;
  std::string node;
  uint32_t tp_size = 0, tp_rank = 0, pp_size = 0, pp_rank = 0;
  uint32_t dp_size = 0, dp_rank = 0;  ///< its attention DP group
  std::string reason;                 ///< why it is down ("" when up)
};
struct discover_reply {
  std::vector<discovered_rank> ranks;
};
/// v4: one entry per room asked, in order.
struct poll_many_reply {
  std::vector<poll_reply> rooms;
};

using message = std::variant<hello, prepare, send, poll, cancel, subscribe, info, ok, error,
                             hello_reply, poll_reply, info_reply, event, poll_many, poll_many_reply,
                             register_memory, discover, discover_reply, drain, set_log_level>;

msg_type type_of(const message& m);
/// The first protocol version that has message type `t` (3 for an unknown type).
uint16_t first_version(msg_type t);
const char* to_string(msg_type t);

/// Why `m` cannot go in protocol `version` although its type can: a field set that the version
/// does not carry (an older daemon would act as if it were not set), e.g. "a checked room needs
/// protocol version 10; this connection speaks 9"; nullopt when it can. Generated from
/// wire.yaml (`refuse_older`), as the Python client's encoder refuses the same fields.
std::optional<std::string> too_old(const message& m, uint16_t version);

/// Encode a complete frame (header + body) in protocol `version`.
std::vector<uint8_t> encode(const message& m, uint32_t seq, uint16_t version = protocol_version);

/// A decoded frame, or a decoding error naming the message type and the field.
struct decoded {
  std::optional<message> msg;
  uint32_t seq = 0;
  errc code = errc::ok;
  std::string error;
  bool framing_lost = false;  ///< the length field was unusable: the stream must be closed
};

/// Decode one frame body in protocol `version`. `type` and `seq` come from the header; `body`
/// excludes the header. (hello and hello_reply carry their own version and decode the same in
/// both.)
decoded decode(uint16_t type, uint32_t seq, std::span<const uint8_t> body,
               uint16_t version = protocol_version);

/// The version a daemon speaking [min_protocol_version, protocol_version] answers a client
/// speaking [lo, hi] in, or 0 when the ranges do not meet.
uint16_t negotiate(uint16_t lo, uint16_t hi);

/// One frame as it came, its body not decoded yet (what a client's session reads).
struct raw_frame {
  uint16_t type = 0;
  uint16_t flags = 0;
  uint32_t seq = 0;
  std::vector<uint8_t> body;
};

/// Incremental frame splitter for a byte stream.
class frame_reader {
 public:
  /// Frames from now on are decoded in `version` (after the hello settled it).
  void set_version(uint16_t version) { version_ = version; }
  /// Append received bytes.
  void feed(std::span<const uint8_t> bytes);
  /// Extract the next complete frame. Returns nullopt when more bytes are needed. A length field
  /// above `max_frame_bytes` or below the header size yields an error (the stream is then
  /// unusable and should be closed).
  std::optional<decoded> next();
  /// The next complete frame, undecoded; nullopt when more bytes are needed. An unusable length
  /// field (the stream must be closed) is an error.
  std::optional<result<raw_frame>> next_raw();
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  /// The header of the next frame once it is whole (its length checked), else nullopt; an
  /// unusable length field gives its error with `framing_lost`.
  std::optional<decoded> take(raw_frame& header, std::span<const uint8_t>& body);
  void compact();
  std::vector<uint8_t> buf_;
  size_t pos_ = 0;
  uint16_t version_ = protocol_version;
};

}  // namespace ferry::proto
