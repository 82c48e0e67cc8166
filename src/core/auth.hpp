#pragma once
/// Peer authentication with a shared cluster secret: HMAC-SHA256 challenge-response at handshake.
///
/// Each side sends a fresh random nonce. The accepting side proves the secret with
/// `proof("accept", its nonce, the connecting side's nonce, ...)`, the connecting side with
/// `proof("connect", ...)`: distinct labels, so a proof can never be reflected back. The secret
/// itself never crosses the wire. It authenticates the peer; it does not encrypt or
/// integrity-protect the messages that follow (the control channel is plain TCP).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/errors.hpp"

namespace ferry {

using bytes = std::vector<uint8_t>;

inline constexpr size_t auth_nonce_bytes = 32;
inline constexpr size_t min_secret_bytes = 16;

/// `n` bytes from the operating system's random source.
bytes random_bytes(size_t n);

/// HMAC-SHA256(key, message): 32 bytes (OpenSSL).
bytes hmac_sha256(std::string_view key, const bytes& message);

/// HMAC-SHA256(secret, the four fields, each prefixed with its 32-bit little-endian length).
bytes auth_proof(std::string_view secret, std::string_view label, const bytes& a, const bytes& b,
                 std::string_view c);

/// Constant-time comparison (length leaks, content does not).
bool proofs_equal(const bytes& x, const bytes& y);

/// The cluster secrets of a daemon. It proves with one (`security.cluster_secret_file`) and
/// accepts a peer's proof made with that one or, while the cluster rotates its secret, with a
/// second (`security.accepted_cluster_secret_file`). A peer proving either is authenticated;
/// which one it used is reported only to this daemon's operator (its log and metrics).
struct cluster_secrets {
  cluster_secrets() = default;
  /// `proving` empty: no secret (peers are not authenticated); `also_accepted` empty: none.
  cluster_secrets(std::string proving, std::string also_accepted = {});
  cluster_secrets(const char* proving) : cluster_secrets(std::string(proving)) {}

  std::vector<std::string> accepted;  ///< the proving one first; empty: no secret

  bool empty() const { return accepted.empty(); }
  const std::string& proving() const { return accepted.front(); }
};

/// Which of `secrets.accepted` the peer's `proof` over (label, a, b, c) was made with: its
/// index, or -1 for none. Every accepted secret's proof is computed and compared in constant
/// time, whichever matched, so the time taken does not tell which one did.
int matching_secret(const cluster_secrets& secrets, const bytes& proof, std::string_view label,
                    const bytes& a, const bytes& b, std::string_view c);

/// Read a cluster secret file: it must exist, not be readable or writable by group or others,
/// and hold at least `min_secret_bytes` bytes (one trailing newline is dropped). The error names
/// the key, the path and what is wrong (`errc::config_invalid`).
result<std::string> read_secret_file(const std::string& path,
                                     std::string_view key = "security.cluster_secret_file");

}  // namespace ferry
