// libFuzzer target: the client protocol's frame splitter and decoder, fed arbitrary bytes in
// arbitrary slices, as a hostile or broken client would send them. Properties: no crash, no
// hang; every frame either decodes or carries an error text; a decoded message re-encodes to a
// frame that decodes to the same type.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/protocol.hpp"

using namespace ferry::proto;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  // The first byte picks how the stream is sliced into reads (1..256 bytes each).
  const size_t step = size_t{data[0]} + 1;
  std::span<const uint8_t> in(data + 1, size - 1);
  frame_reader reader;
  for (size_t off = 0; off < in.size(); off += step) {
    reader.feed(in.subspan(off, std::min(step, in.size() - off)));
    for (int frames = 0; frames < 1024; ++frames) {
      auto d = reader.next();
      if (!d) break;
      if (d->msg) {
        const auto bytes = encode(*d->msg, d->seq);
        frame_reader again;
        again.feed(bytes);
        auto r = again.next();
        if (!r || !r->msg || type_of(*r->msg) != type_of(*d->msg)) std::abort();
      } else if (d->error.empty()) {
        std::abort();  // a refused frame must say why
      }
      if (d->framing_lost) return 0;  // the daemon closes such a stream
    }
  }
  return 0;
}
