#pragma once
/// The benchmark's raw-fabric baseline: the same write sizes Ferry posts for a workload, as plain
/// fi_writedata between this process and a forked target process (raw_fabric.hpp).

#include <cstdint>
#include <string>
#include <vector>

#include "core/plan.hpp"

namespace ferry::bench {

struct baseline_result {
  double gbps = 0;  ///< 10^9 bytes per second
  double seconds = 0;
  uint64_t bytes = 0;
  std::string provider;
  std::string error;
};

/// Post `waves` × `concurrency` copies of `request` (one request's planned writes) with `window`
/// writes in flight. Each copy gets its own region of the source and target buffers, laid out
/// compactly, so the memory touched is what the Ferry run touches.
/// `paced`: each request waits for its own grant from the target, `concurrency` requests in
/// flight (raw_options::room_writes): the raw bound with one control round trip per room.
/// Unpaced, `warmup_waves` more waves go first, untimed (ferry-bench --warmup-waves).
baseline_result run_baseline(const std::string& provider, const std::vector<planned_write>& request,
                             uint32_t concurrency, uint32_t waves, uint32_t window,
                             bool paced = false, uint32_t warmup_waves = 1);

}  // namespace ferry::bench
