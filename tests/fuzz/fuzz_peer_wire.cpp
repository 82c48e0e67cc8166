// libFuzzer target: the peer channel's frame reader and message decoder (core/peer_wire.hpp),
// the code that reads what an authenticated peer sends. The input goes three ways:
// - as a byte stream to a frame_reader, fed in slices the input chooses: it must never deliver a
//   message (the input cannot know the key's MAC) and, once failed, stay failed;
// - as a stream of frames sealed with the reader's own key, the MACs fixed up, so the body
//   decoders behind the checks are reached: each delivered message must encode back to a body
//   the decoder reads to the same bytes;
// - as a body for every message kind (decode_body directly).

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "core/peer_wire.hpp"

namespace {

using namespace ferry;
using namespace ferry::peer_wire;

const bytes key(32, 0x5a);

void stream(const uint8_t* data, size_t size) {
  frame_reader r(key);
  const size_t slice = size ? 1 + data[0] % 64 : 1;
  bool failed = false;
  for (size_t pos = 0; pos < size; pos += slice) {
    r.feed(data + pos, std::min(slice, size - pos));
    message m;
    std::string e;
    for (int i = 0; i < 4; ++i) {
      const auto k = r.next(m, e);
      if (k == frame_reader::result_kind::message) std::abort();  // forged without the key
      if (failed && k != frame_reader::result_kind::failed) std::abort();
      if (k == frame_reader::result_kind::failed) {
        if (e.empty()) std::abort();
        failed = true;
      }
      if (k != frame_reader::result_kind::failed) break;
    }
  }
}

/// The input as one frame: a header of its first 16 bytes (length clamped to the rest), the rest
/// as the body, and a correct MAC, so the decoder behind the checks runs.
void sealed(const uint8_t* data, size_t size) {
  if (size < header_bytes) return;
  std::vector<uint8_t> f(data, data + size);
  const uint32_t body = static_cast<uint32_t>(size - header_bytes);
  for (int i = 0; i < 4; ++i) f[size_t(i)] = uint8_t(body >> (8 * i));
  std::memset(f.data() + 8, 0, 8);  // sequence 0
  uint8_t mac[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  HMAC(EVP_sha256(), key.data(), int(key.size()), f.data(), f.size(), mac, &len);
  f.insert(f.end(), mac, mac + mac_bytes);
  frame_reader r(key);
  r.feed(f.data(), f.size());
  message m;
  std::string e;
  if (r.next(m, e) != frame_reader::result_kind::message) return;
  // What was accepted encodes to a body that decodes to the same message's bytes.
  const auto again = encode_body(m);
  auto d = decode_body(kind_of(m), again);
  if (!d || encode_body(d.value) != again) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  stream(data, size);
  sealed(data, size);
  for (uint8_t k = 0; k <= max_kind + 1; ++k) {
    auto d = decode_body(static_cast<kind>(k), {data, size});
    if (!d && d.message.empty()) std::abort();
  }
  return 0;
}
