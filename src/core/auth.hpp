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

/// Read the cluster secret file: it must exist, not be readable or writable by group or others,
/// and hold at least `min_secret_bytes` bytes (one trailing newline is dropped). The error names
/// the path and what is wrong (`errc::config_invalid`).
result<std::string> read_secret_file(const std::string& path);

}  // namespace ferry
