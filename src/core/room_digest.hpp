#pragma once
/// End-to-end checksums of a room (integrity.checksums): for each link, one XXH3-64 digest per
/// buffer pair the link moves (a KV buffer, a state tensor of one layer, an aux buffer), over
/// the bytes it moves in the decode's order: page position by position (each token's slice when
/// the link slices heads), slot segment by segment, the aux row. The prefill digests the source
/// bytes it sends and the decode the bytes that landed in its pages after any unpack, so
/// packing, unpacking, rails and the fabric are all covered; a digest that differs names the
/// buffer, its layer and the destination bytes it covers.
///
/// Pure: it reads memory through the base address of each space it is given; it never
/// allocates per byte and never sorts.

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/geometry.hpp"
#include "core/layout.hpp"
#include "core/plan.hpp"

namespace ferry {

/// The items one side of a link names for a room (the decode's, or the prefill's by position).
struct room_items {
  std::span<const uint32_t> pages;        ///< KV pages by position
  uint32_t slot = no_index;               ///< the state slot (a slot-indexed state pool)
  std::span<const uint32_t> state_pages;  ///< a paged state pool's pages by position
  uint32_t row = no_index;                ///< the aux row
};

/// One digest: what it covers at the decode, and its value.
struct room_digest {
  space where = space::kv;  ///< kv, state or aux: the decode's pool
  uint32_t buffer = 0;      ///< the buffer's index in that pool's layout
  uint64_t first = 0;       ///< the lowest destination byte it covers (offset in the pool)
  uint64_t end = 0;         ///< one past the highest
  uint64_t value = 0;
};

/// Which side's bytes a digest reads.
enum class digest_side : uint8_t { source, destination };

/// The digests of link `link` for one room, in a fixed order (KV buffer pairs, state buffer
/// pairs, aux buffers, each as the link plan lists them). `side` picks the items and the
/// memory read: the prefill passes both item sets and the source bases; the decode passes its
/// own items as both (only destination offsets are read) and its bases. `bases` are indexed by
/// space (kv, state, aux).
std::vector<room_digest> digest_room(const link_plan& link, const node_layout& src,
                                     const node_layout& dst, const room_items& src_items,
                                     const room_items& dst_items,
                                     const std::array<const uint8_t*, 3>& bases, digest_side side);

/// The first digest of `got` (the decode's) that differs from `sent` (the prefill's), named:
/// "kv buffer 5 (v, layer 2): destination bytes [4096, 12288) of the kv pool differ from what
/// prefill P sent (digest 0x... landed, 0x... sent)". Empty when all are equal. `from` names the
/// prefill.
std::string digest_difference(const std::vector<room_digest>& got,
                              const std::vector<uint64_t>& sent, const node_layout& dst,
                              const std::string& from);

}  // namespace ferry
