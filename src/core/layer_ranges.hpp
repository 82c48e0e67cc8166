#pragma once
/// Layer-wise sends (docs/protocol.md, "Layer-wise sends"): a send may name a range of global
/// layer ids, so an engine sends a room's KV and state layer by layer as its forward pass makes
/// them. Pure: the rank's layers (core/layout.hpp `layer_ids`) and the sends.
///
/// The rules:
/// - A range lies within the rank's layers (from its lowest to its highest id) and names at
///   least one of them; `layer_count` 0 names every layer (a whole send, as before version 6).
/// - Every send of a chunk names the chunk's pages (and `last`; on the last chunk the same state
///   slot and aux row), and each of the rank's layers once. The chunk is complete once all its
///   layers were named; the next chunk starts only then.
/// - The state segments of a layer go with the last chunk's send that names the layer; the aux
///   row goes with the send that completes the last chunk.

#include <cstdint>
#include <vector>

#include "core/errors.hpp"
#include "core/protocol.hpp"

namespace ferry {

/// Global layer ids [first, first + count); count 0 means every layer.
struct layer_range {
  uint32_t first = 0;
  uint32_t count = 0;
  bool all() const { return count == 0; }
  bool contains(uint32_t layer) const {
    return all() || (layer >= first && uint64_t{layer} < uint64_t{first} + count);
  }
  static layer_range of(const proto::send& s) { return {s.first_layer, s.layer_count}; }
  bool operator==(const layer_range&) const = default;
};

/// A send's range against the rank's `layers` (ascending): a first layer without a count, a
/// range that reaches outside [lowest, highest], or one that names none of them is refused
/// (`errc::invalid_request`, the text naming the room, the range and the rank's layers).
result<> check_layer_range(const std::vector<uint32_t>& layers, uint64_t room, layer_range r);

/// Which layers of the open chunk of a room were sent: the Sender's record of its client's
/// layer-wise sends (core/sender_room.hpp). Whole sends open and complete a chunk at once.
class chunk_layers {
 public:
  /// `layers`: the rank's layer ids, ascending, each once (empty: whole sends only).
  explicit chunk_layers(std::vector<uint32_t> layers = {});

  /// What taking a send would do.
  struct step {
    bool opens = false;      ///< it is the first send of its chunk
    bool completes = false;  ///< with it every layer of the chunk was sent
    uint32_t chunk = 0;      ///< its chunk's index in the room
  };
  /// Whether `s` may be taken now, and what it would do; nothing changes. The error
  /// (invalid_request) says what was wrong, without the room (the caller adds it).
  result<step> check(const proto::send& s) const;
  /// Record `s`, which `check` accepted.
  step take(const proto::send& s);

  const std::vector<uint32_t>& layers() const { return layers_; }
  /// A chunk has some of its layers sent, not all.
  bool open() const { return open_; }

 private:
  /// Indices into layers_ of the range [lo, hi).
  std::pair<size_t, size_t> span_of(layer_range r) const;

  std::vector<uint32_t> layers_;
  bool open_ = false;
  uint32_t chunk_ = 0;  ///< the open chunk, or the next one
  proto::send opened_;  ///< the open chunk's first send (its pages, last, slot and row)
  std::vector<bool> sent_;
  size_t sent_count_ = 0;
};

}  // namespace ferry
