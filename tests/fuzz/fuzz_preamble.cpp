// libFuzzer target: the peer preamble (core/peer_preamble.hpp), the only code that reads what
// anyone who can reach a ferryd's peer port sends before CAF does. The input is fed to the
// accepting side (with and without a cluster secret) and to the connecting side in the slices
// the peer gate would read: never more than want(), split where the input says.
//
// Checked beyond "no crash": a side never asks for more than one frame, never consumes bytes
// after it finished or failed, and an accepting side with a secret never finishes (the input
// cannot know the proof).

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "core/peer_preamble.hpp"

namespace {

using namespace ferry::preamble;

template <class Side>
void drive(Side& side, const uint8_t* data, size_t size, bool must_not_finish) {
  size_t pos = 0;
  // The first input byte picks the slice length (1..16, 0: whole want()): short reads happen.
  const size_t slice = size ? data[0] % 17 : 0;
  while (pos < size) {
    const size_t want = side.want();
    if (want == 0) return;  // finished or failed: the gate stops reading here
    if (want > challenge_size) std::abort();
    size_t n = std::min(want, size - pos);
    if (slice) n = std::min(n, slice);
    auto s = side.feed(data + pos, n);
    pos += n;
    if (s.next == outcome::finished && must_not_finish) std::abort();
    if (s.next != outcome::reading && side.want() != 0) std::abort();
    if (s.out.size() > challenge_size) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  {
    acceptor a("prefill-0", "a cluster secret of sixteen bytes or more");
    drive(a, data, size, true);
  }
  {
    acceptor a("prefill-0", "");
    drive(a, data, size, false);
  }
  {
    dialer d("decode-0", "a cluster secret of sixteen bytes or more");
    (void)d.hello();
    drive(d, data, size, true);
  }
  {
    dialer d("decode-0", "");
    (void)d.hello();
    drive(d, data, size, false);
  }
  return 0;
}
