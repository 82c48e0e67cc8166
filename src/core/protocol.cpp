// What both directions of the client protocol use: the type of each message, the names of
// message types and memory kinds, and version negotiation. Encoding is in protocol_encode.cpp,
// decoding and the cutting of a byte stream into frames in protocol_decode.cpp.
#include "core/protocol.hpp"

#include <algorithm>

namespace ferry::proto {

msg_type type_of(const message& m) {
  static constexpr msg_type types[] = {msg_type::hello,
                                       msg_type::prepare,
                                       msg_type::send,
                                       msg_type::poll,
                                       msg_type::cancel,
                                       msg_type::subscribe,
                                       msg_type::info,
                                       msg_type::ok,
                                       msg_type::error,
                                       msg_type::hello_reply,
                                       msg_type::poll_reply,
                                       msg_type::info_reply,
                                       msg_type::event,
                                       msg_type::poll_many,
                                       msg_type::poll_many_reply,
                                       msg_type::register_memory,
                                       msg_type::discover,
                                       msg_type::discover_reply,
                                       msg_type::drain,
                                       msg_type::set_log_level};
  return types[m.index()];
}

uint16_t first_version(msg_type t) {
  switch (t) {
    case msg_type::poll_many:
    case msg_type::poll_many_reply:
    case msg_type::register_memory:
    case msg_type::discover:
    case msg_type::discover_reply:
      return 4;
    case msg_type::drain:
    case msg_type::set_log_level:
      return 5;
    default:
      return 3;
  }
}

const char* to_string(msg_type t) {
  switch (t) {
    case msg_type::hello:
      return "hello";
    case msg_type::prepare:
      return "prepare";
    case msg_type::send:
      return "send";
    case msg_type::poll:
      return "poll";
    case msg_type::cancel:
      return "cancel";
    case msg_type::subscribe:
      return "subscribe";
    case msg_type::info:
      return "info";
    case msg_type::ok:
      return "ok";
    case msg_type::error:
      return "error";
    case msg_type::hello_reply:
      return "hello_reply";
    case msg_type::poll_reply:
      return "poll_reply";
    case msg_type::info_reply:
      return "info_reply";
    case msg_type::event:
      return "event";
    case msg_type::poll_many:
      return "poll_many";
    case msg_type::poll_many_reply:
      return "poll_many_reply";
    case msg_type::register_memory:
      return "register_memory";
    case msg_type::discover:
      return "discover";
    case msg_type::discover_reply:
      return "discover_reply";
    case msg_type::drain:
      return "drain";
    case msg_type::set_log_level:
      return "set_log_level";
  }
  return "unknown";
}

const char* to_string(memory_kind k) {
  switch (k) {
    case memory_kind::host:
      return "host";
    case memory_kind::cuda_dmabuf:
      return "cuda_dmabuf";
    case memory_kind::cuda_ipc:
      return "cuda_ipc";
    case memory_kind::cuda_vmm_fd:
      return "cuda_vmm_fd";
  }
  return "unknown";
}

uint16_t negotiate(uint16_t lo, uint16_t hi) {
  const uint16_t best = std::min(hi, protocol_version);
  return best >= std::max(lo, min_protocol_version) ? best : 0;
}

}  // namespace ferry::proto
