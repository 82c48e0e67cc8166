#pragma once
/// Ferry's one error vocabulary: `errc`, a stable code grouped by area (sent to clients and
/// peers), plus a message that names what was wrong and the value seen. Every fallible call
/// returns `result<T>`; messages between actors carry `error`; the client protocol's error
/// reply is the same `error`. docs/architecture.md ("One error vocabulary") has the grep that
/// finds no other shape.

#include <cstdint>
#include <string>
#include <utility>

namespace ferry {

enum class errc : uint16_t {
  ok = 0,  ///< no error (a Success, an answered request)
  // config (100s)
  config_invalid = 100,  ///< a config key has a bad value or is unknown
  // fabric (200s)
  fabric_unavailable = 200,   ///< provider missing or endpoint could not be opened
  fabric_write_failed = 201,  ///< a posted write completed with an error
  fabric_error = 202,         ///< a fabric call failed (registration, address insertion, ...)
  checksum_mismatch = 203,    ///< the bytes that landed differ from what the prefill sent
  // peer / protocol (300s)
  peer_unreachable = 300,     ///< connect or handshake with a peer daemon failed
  peer_incompatible = 301,    ///< layouts, geometry, versions or cluster secrets do not fit
  peer_lost = 302,            ///< an established peer connection went down
  malformed_frame = 310,      ///< a client frame could not be decoded
  frame_too_large = 311,      ///< a client frame exceeds the size limit
  unsupported_version = 312,  ///< client protocol version not supported
  access_denied = 313,        ///< a client whose user ferryd does not admit (security.client_*)
  // request (400s)
  invalid_request = 400,  ///< a field of a request is out of range or inconsistent
  duplicate_room = 401,   ///< a non-terminal room with this id already exists
  unknown_room = 402,     ///< no room with this id is known
  room_finished = 403,    ///< the room already reached a terminal state
  wrong_role = 404,       ///< operation not served by this daemon's role
  timed_out = 405,        ///< a bounded wait expired
  cancelled = 406,        ///< cancelled by a client or the peer
  draining = 407,         ///< the daemon (or the peer named) is stopping: no new rooms
  // internal (500s)
  internal = 500,      ///< should not happen: a room actor ended abnormally, an invariant broke
  system_error = 501,  ///< an operating-system call failed (shm, mmap, locks): it names the call
};

/// Stable lower-case name of the code, e.g. "invalid_request".
const char* to_string(errc e);

/// All values, for exhaustiveness tests.
inline constexpr errc all_errc[] = {errc::ok,
                                    errc::config_invalid,
                                    errc::fabric_unavailable,
                                    errc::fabric_write_failed,
                                    errc::fabric_error,
                                    errc::checksum_mismatch,
                                    errc::peer_unreachable,
                                    errc::peer_incompatible,
                                    errc::peer_lost,
                                    errc::malformed_frame,
                                    errc::frame_too_large,
                                    errc::unsupported_version,
                                    errc::access_denied,
                                    errc::invalid_request,
                                    errc::duplicate_room,
                                    errc::unknown_room,
                                    errc::room_finished,
                                    errc::wrong_role,
                                    errc::timed_out,
                                    errc::cancelled,
                                    errc::draining,
                                    errc::internal,
                                    errc::system_error};

/// What went wrong: the kind, and words naming what and the value seen.
struct error {
  errc code = errc::internal;
  std::string message;
};

/// The value of `result<>`, for calls that return nothing but may fail.
struct none {};

/// A value, or the error that stopped it (`code` is `ok` exactly when `value` is meaningful).
template <class T = none>
struct [[nodiscard]] result {
  T value{};
  errc code = errc::ok;
  std::string message;

  result() = default;
  result(T v) : value(std::move(v)) {}
  result(ferry::error e) : code(e.code), message(std::move(e.message)) {}

  explicit operator bool() const { return code == errc::ok; }
  /// The error (meaningful only when failed).
  ferry::error error() const& { return {code, message}; }
  ferry::error error() && { return {code, std::move(message)}; }
};

}  // namespace ferry
