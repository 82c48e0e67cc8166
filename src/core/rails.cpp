#include "core/rails.hpp"

#include <algorithm>

namespace ferry::rails {

std::vector<std::pair<uint32_t, uint32_t>> pair_rails(const std::vector<kind>& ours,
                                                      const std::vector<kind>& theirs) {
  // Indices of the bulk rails and of the express rail, on each side.
  auto split = [](const std::vector<kind>& all, std::vector<uint32_t>& bulk, int64_t& express) {
    for (uint32_t i = 0; i < all.size(); ++i) {
      if (!all[i].express)
        bulk.push_back(i);
      else if (express < 0)
        express = i;
    }
  };
  std::vector<uint32_t> our_bulk, their_bulk;
  int64_t our_express = -1, their_express = -1;
  split(ours, our_bulk, our_express);
  split(theirs, their_bulk, their_express);
  std::vector<std::pair<uint32_t, uint32_t>> out;
  // The first bulk rail of each is rail 0 (the hello's): paired already.
  for (size_t k = 1; k < std::min(our_bulk.size(), their_bulk.size()); ++k)
    out.emplace_back(our_bulk[k], their_bulk[k]);
  if (our_express > 0 && their_express > 0)
    out.emplace_back(static_cast<uint32_t>(our_express), static_cast<uint32_t>(their_express));
  return out;
}

std::vector<uint32_t> stripe(const std::vector<uint64_t>& lengths, uint32_t lanes) {
  lanes = std::max<uint32_t>(lanes, 1);
  std::vector<uint64_t> load(lanes, 0);
  std::vector<uint32_t> out;
  out.reserve(lengths.size());
  for (uint64_t len : lengths) {
    const auto lane =
        static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
    load[lane] += len;
    out.push_back(lane);
  }
  return out;
}

}  // namespace ferry::rails
