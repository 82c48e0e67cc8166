// Encoding: messages to frames (header, then the body in the connection's version; the bodies
// are generated from wire.yaml into protocol_codec.cpp).
#include <cstdint>
#include <vector>

#include "core/protocol.hpp"
#include "core/protocol_io.hpp"

namespace ferry::proto {

std::vector<uint8_t> encode(const message& m, uint32_t seq, uint16_t version) {
  std::vector<uint8_t> out;
  out.reserve(64);
  detail::writer w(out, version);
  w.num(uint32_t{0});  // length, patched below
  w.num(static_cast<uint16_t>(type_of(m)));
  w.num(uint16_t{0});
  w.num(seq);
  detail::encode_body(w, m);
  const uint32_t len = static_cast<uint32_t>(out.size() - 4);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  return out;
}

}  // namespace ferry::proto
