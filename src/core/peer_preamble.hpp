#pragma once
/// Ferry's peer preamble: the first bytes on every peer connection, exchanged before the peer
/// channel's first frame (transport/channels/peer_gate.hpp does the I/O; this is the byte logic
/// alone, so it can be fuzzed and unit-tested without sockets).
///
/// All frames are fixed size, integers big-endian, magic "FERRY-PP", version 2 (version 1 was
/// followed by CAF's BASP; its daemons do not interoperate with this one and are refused, named):
///   C->S HELLO     176 B: magic | u16 version | 'H' | flags (bit 0: has a secret) | nonce[32]
///                         | node[128] (NUL-padded) | 4 reserved
///   S->C CHALLENGE 208 B: magic | u16 version | 'C' | flags | u32 status | nonce[32] | node[128]
///                         | proof[32] = auth_proof(secret, "ferry-pp-accept", c_nonce, s_nonce,
///                           s_node)
///   C->S PROOF      48 B: magic | u16 version | 'P' | 0 | 4 reserved
///                         | proof[32] = auth_proof(secret, "ferry-pp-connect", s_nonce, c_nonce,
///                           c_node)
///   S->C VERDICT    16 B: magic | u16 version | 'V' | 0 | u32 status
/// Then both sides speak the peer channel (core/peer_wire.hpp), under keys derived from the two
/// nonces and the secrets proved (`keys()`). Authentication is mutual: the connecting side
/// checks the accepting side's proof before it sends its own or a frame of the channel. Each side
/// proves with its own secret and accepts a proof made with any of its accepted ones (two while
/// a cluster rotates its secret: core/auth.hpp). Without a secret the proofs are zero and only
/// structure, version and node name are checked.
///
/// Fixed sizes are the point: a side asks for exactly the rest of the current frame (`want()`)
/// and never reads past it, so no byte of the channel is consumed, and there is no length
/// field an attacker could inflate. Garbage fails at its first byte that differs from the magic.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/auth.hpp"
#include "core/peer_wire.hpp"

namespace ferry::preamble {

inline constexpr uint16_t version = 2;
inline constexpr size_t hello_size = 176, challenge_size = 208, proof_size = 48, verdict_size = 16;
inline constexpr size_t node_bytes = 128;  ///< config.hpp's max_node_name

/// Status in a CHALLENGE or VERDICT: why the accepting side refused.
/// The secret statuses are worded from the refusing side, as the Ferry-level handshake's were.
enum class status : uint32_t {
  ok = 0,
  version = 1,
  secret_required = 2,    ///< the refuser has a cluster secret, the peer offered no challenge
  auth = 3,               ///< the peer's proof is wrong
  name = 4,               ///< the peer's node name is not a valid name
  secret_unexpected = 5,  ///< the peer has a cluster secret, the refuser has none
};
const char* status_text(uint32_t s);

/// What a side does after consuming input.
enum class outcome {
  reading,   ///< send `out` (if any), then read `want()` more bytes
  finished,  ///< send `out` (if any), then hand the socket over
  failed,    ///< send `out` (if any: a refusal the peer can report), then close; see `error`
};
struct step {
  outcome next = outcome::reading;
  std::vector<uint8_t> out;
  std::string error;
  bool garbage = false;  ///< failed because the input is not a preamble at all (bad magic/frame)
};

/// Why a peer speaking preamble version `theirs` cannot be served.
std::string version_mismatch(uint16_t theirs);

/// A node name on the wire: 1..128 bytes of [A-Za-z0-9._-].
bool valid_node_name(const std::string& node);

/// The accepting side of one connection.
class acceptor {
 public:
  acceptor(std::string node, cluster_secrets secrets);
  /// Bytes still needed to complete the current frame (0 once finished or failed).
  size_t want() const { return done_ ? 0 : need_ - got_; }
  /// Consume `n` <= want() bytes that arrived.
  step feed(const uint8_t* data, size_t n);
  const std::string& peer_node() const { return peer_node_; }
  /// Once finished: the channel's keys for this side.
  peer_wire::link_keys keys() const;

 private:
  step on_hello();
  step on_proof();
  step refuse(status s, char frame);
  std::string node_, peer_node_;
  cluster_secrets secrets_;
  bytes nonce_, peer_nonce_;
  uint8_t in_[hello_size] = {};
  size_t need_ = hello_size, got_ = 0;
  bool done_ = false, have_hello_ = false;
  int peer_secret_ = -1;  ///< which of our accepted secrets the peer proved with
};

/// The connecting side of one connection; send `hello()` first.
class dialer {
 public:
  dialer(std::string node, cluster_secrets secrets);
  std::vector<uint8_t> hello();
  size_t want() const { return done_ ? 0 : need_ - got_; }
  step feed(const uint8_t* data, size_t n);
  const std::string& peer_node() const { return peer_node_; }
  /// Once finished: the channel's keys for this side.
  peer_wire::link_keys keys() const;

 private:
  step on_challenge();
  step on_verdict();
  std::string node_, peer_node_;
  cluster_secrets secrets_;
  bytes nonce_, peer_nonce_;
  uint8_t in_[challenge_size] = {};
  size_t need_ = challenge_size, got_ = 0;
  bool done_ = false, have_challenge_ = false;
  int peer_secret_ = -1;  ///< which of our accepted secrets the peer proved with
};

}  // namespace ferry::preamble
