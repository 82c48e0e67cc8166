#pragma once
/// Rails: a daemon's several fabric endpoints (transport/rail_engine.hpp). Two pure rules live
/// here, so they are tested without a fabric:
/// - which of a peer's endpoints each of ours talks to (`pair_rails`): bulk rail i with the
///   peer's bulk rail i, the express rail with the peer's express rail; rail 0 is the one the
///   hello names on both sides, so it is never in the list;
/// - how a batch's writes are spread over the bulk rails a peer shares (`stripe`): each write
///   goes to the rail with the fewest bytes so far, so every rail carries about the same bytes
///   and a room's writes progress on all of them at once.

#include <cstdint>
#include <utility>
#include <vector>

namespace ferry::rails {

/// One endpoint's kind, in the order a daemon lists them (`engine::rails()`): bulk rails first
/// (rail 0, the hello's, is the first), then at most one express rail.
struct kind {
  bool express = false;
};

/// Pairs (our rail, the peer's rail) for every rail beyond 0 that both daemons have: our k-th
/// bulk rail with the peer's k-th, our express rail with the peer's. Rail counts may differ; a
/// rail without a partner is not used with that peer.
std::vector<std::pair<uint32_t, uint32_t>> pair_rails(const std::vector<kind>& ours,
                                                      const std::vector<kind>& theirs);

/// The lane (0 .. lanes-1) of each write, given the writes' lengths: each goes to the lane with
/// the fewest bytes so far (the lowest on a tie), in order. `lanes` 0 is taken as 1.
std::vector<uint32_t> stripe(const std::vector<uint64_t>& lengths, uint32_t lanes);

}  // namespace ferry::rails
