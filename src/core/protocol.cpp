// What both directions of the client protocol use: the names of memory kinds and version
// negotiation. The type tables and every body's codec are generated from wire.yaml
// (protocol_codec.cpp); framing is in protocol_encode.cpp, decoding and the cutting of a byte
// stream into frames in protocol_decode.cpp.
#include "core/protocol.hpp"

#include <algorithm>

namespace ferry::proto {

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
