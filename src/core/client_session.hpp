#pragma once
/// The client side of one connection to ferryd as a pure machine: no socket, no clock. The C++
/// client (clients/cpp, ferry::client::client) is the I/O around it; the Python client's
/// ferry/session.py is the same machine, and both pass the cases of
/// tests/conformance/client_session.yaml.
///
/// A session numbers the requests it starts (seq 1, 2, ... skipping 0, which is for pushed
/// events, and any seq still in use) and reads each frame that comes back as one outcome:
///   reply    the reply to request `seq`, of the type that request expects;
///   refused  ferryd's error reply to it (`draining` when it says ferryd itself is draining,
///            not a peer it named);
///   failed   the reply cannot be taken (its body does not decode, or it is of another type):
///            that request fails, and the stream is still in step;
///   dropped  the reply to a request whose waiter gave up (`abandon`);
///   pushed   an event (seq 0);
///   ended    the connection cannot go on (ferryd's error about the connection itself, a frame
///            with flags set, or a reply that matches no request: taking it for another's would
///            shift every later reply).
/// The hello is the first request (seq 1); `read_hello` says what its answer means, including
/// when to say hello again in version 3 to a daemon that speaks only that.

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

// Installed with Ferry::client: neighbours included by file name (src/core/CMakeLists.txt).
#include "errors.hpp"
#include "protocol.hpp"

namespace ferry::proto {

/// What one frame from ferryd means to the session.
struct session_outcome {
  enum class kind : uint8_t { reply, refused, failed, dropped, pushed, ended };
  kind what = kind::ended;
  uint32_t seq = 0;            ///< the request it answers (reply, refused, failed, dropped)
  std::optional<message> msg;  ///< reply: the reply; pushed: the event
  ferry::error err;            ///< refused, failed, ended
  bool draining = false;       ///< refused: ferryd itself is draining
};

class client_session {
 public:
  /// Frames are read and written in `version` (the hello's offer until its reply settles it).
  explicit client_session(uint16_t version = protocol_version) : version_(version) {}
  uint16_t version() const { return version_; }
  void set_version(uint16_t v) { version_ = v; }

  /// Number `m` and encode it: its seq and its frame, to be sent now.
  std::pair<uint32_t, std::vector<uint8_t>> start(const message& m);
  /// The seqs waiting for their replies, in order.
  std::vector<uint32_t> outstanding() const;
  /// The waiter of `seq` gave up: its reply, should it come, is dropped. False when the reply
  /// was already read.
  bool abandon(uint32_t seq);
  /// The connection ended: the seqs of every request still waiting (they fail with the
  /// connection's error); nothing is outstanding any more.
  std::vector<uint32_t> end();
  /// What a frame from ferryd means (`body` excludes the 12-byte header).
  session_outcome on_frame(uint16_t type, uint16_t flags, uint32_t seq,
                           std::span<const uint8_t> body);

 private:
  struct request {
    msg_type type;
    msg_type expect;
  };
  uint16_t version_;
  uint32_t last_seq_ = 0;
  std::map<uint32_t, request> pending_;
  std::set<uint32_t> abandoned_;
};

/// Whether an error reply says this client's own ferryd is draining ("room 3: ferryd is
/// draining: ..."), not a peer it named ("peer HOST:PORT is draining: ...").
bool own_drain(const ferry::error& e);

/// What the answer to a hello offering [lo, hi] means.
struct hello_outcome {
  enum class kind : uint8_t { accepted, refused, ended };
  kind what = kind::ended;
  hello_reply reply;      ///< accepted
  ferry::error err;       ///< refused, ended
  bool retry_v3 = false;  ///< refused: say hello again, offering version 3 only
};
hello_outcome read_hello(session_outcome o, uint16_t lo, uint16_t hi);

}  // namespace ferry::proto
