#pragma once
/// Ferry's peer channel on the wire: how the messages of core/peer_messages.hpp travel between
/// two daemons once the peer preamble (core/peer_preamble.hpp) has authenticated the connection.
/// Every message and field is described once, in src/core/wire.yaml (scripts/gen_wire.py).
/// The byte logic alone (transport/channels/peer_link.hpp does the I/O), so it can be fuzzed and
/// tested without sockets.
///
/// A frame, integers little-endian:
///   header 16 B: u32 body length | u8 kind | u8 flags (0) | u16 reserved (0) | u64 sequence
///   body        (the message; its length at most `max_body(kind)`)
///   mac    16 B: HMAC-SHA256(direction key, header | body), first 16 bytes
/// Each direction has its own key, derived from the preamble's nonces and the cluster secrets
/// both sides proved (`link_keys`), and its own sequence, from 0, one per frame. A reader
/// checks, in order and before decoding a byte of the body: the kind is known, flags and
/// reserved are zero, the length is within the kind's bound (so a claimed 4 GiB is refused from
/// the header alone), then, once the frame is whole, the MAC and the sequence. A frame that fails
/// any check ends the link: a forged, replayed, reordered or truncated frame is never decoded.
/// The body decoder reads every field bounds-checked, and a body must be consumed exactly.
///
/// Without a cluster secret the keys come from the nonces alone: the MAC then catches
/// corruption and stray bytes, and authenticates nothing (as the preamble does not).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/auth.hpp"
#include "core/errors.hpp"
#include "core/peer_messages.hpp"
#include "core/peer_wire_kinds.hpp"

namespace ferry::peer_wire {

inline constexpr size_t header_bytes = 16, mac_bytes = 16;

// The message kinds, the `message` variant and the string and blob limits are generated from
// wire.yaml (peer_wire_kinds.hpp), as is every body's codec (peer_codec.cpp).

inline kind kind_of(const message& m) { return static_cast<kind>(m.index() + 1); }
const char* name(kind k);

/// Bounds. A page list of a prepare may hold as many pages as a client's prepare can (its frame
/// is at most 16 MiB), so a prepare body may be as large; everything else is small.
inline constexpr uint32_t max_list_body = (16u << 20) + 4096;
inline constexpr uint32_t max_small_body = 128u << 10;
inline constexpr uint32_t max_hello_body = max_yaml_bytes + (64u << 10);  ///< and the rest
inline constexpr uint32_t max_rails_body =
    static_cast<uint32_t>(4 + max_peer_rails * (4 + max_blob_bytes + 1));
/// The announcement, then up to max_room_digests.
inline constexpr uint32_t max_announce_checked_body = 32 + 4 + 8 * max_room_digests;
/// The most bytes a body of this kind may have.
uint32_t max_body(kind k);
/// The peer protocol version that has messages of this kind (a daemon sends one only to a peer
/// that speaks it).
uint32_t first_version(kind k);

/// The body of a message (no header, no MAC).
std::vector<uint8_t> encode_body(const message& m);
/// A body back to its message; the error names the message and the field that is wrong.
result<message> decode_body(kind k, std::span<const uint8_t> body);

/// The two keys of one side of a link: what it seals with, what it opens with.
struct link_keys {
  bytes send, recv;
};
/// Both sides derive the same pair, mirrored: from the accepting side's proving secret, the
/// connecting side's, and the preamble's two nonces (`accept_secret` and `connect_secret` are
/// empty without a cluster secret).
link_keys derive_keys(std::string_view accept_secret, std::string_view connect_secret,
                      const bytes& connect_nonce, const bytes& accept_nonce, bool we_accept);

/// Seals messages into frames for one direction of a link.
class frame_writer {
 public:
  explicit frame_writer(bytes key) : key_(std::move(key)) {}
  /// Append the frame of `m` to `out`.
  void seal(const message& m, std::vector<uint8_t>& out);
  uint64_t next_sequence() const { return seq_; }

 private:
  bytes key_;
  uint64_t seq_ = 0;
};

/// Cuts one direction's byte stream into checked frames and decodes them.
class frame_reader {
 public:
  explicit frame_reader(bytes key) : key_(std::move(key)) {}
  /// Bytes that arrived.
  void feed(const uint8_t* data, size_t n);
  enum class result_kind { more, message, failed };
  /// The next whole frame: `message` with `out`; `more` when the bytes of a whole frame have not
  /// arrived yet; `failed` with `error` (the stream is bad from here on: end the link).
  result_kind next(message& out, std::string& error);
  /// Bytes held that do not make a whole frame yet.
  size_t buffered() const { return buf_.size() - pos_; }
  /// Take only frames of kind `k` (checked from the header, before the body is awaited), or,
  /// with none, every kind. A link that awaits its first message takes only a hello.
  void only(std::optional<kind> k) { only_ = k; }

 private:
  bytes key_;
  bytes buf_;
  size_t pos_ = 0;
  uint64_t seq_ = 0;
  bool failed_ = false;
  std::string error_;
  std::optional<kind> only_;
};

}  // namespace ferry::peer_wire
