// ferry-bench --digest-rate: how fast one core digests with XXH3-64, the hash of
// integrity.checksums (core/room_digest.hpp), over a buffer far larger than the caches, as a
// prefill or a decode digests a room's bytes. What a checked room costs is this rate against the
// fabric's (docs/performance.md §27).

#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "tools/bench/bench.hpp"

namespace ferry::bench {

int digest_rate(uint32_t passes, const std::string& json) {
  constexpr size_t bytes = size_t{256} << 20;
  std::vector<uint8_t> buf(bytes);
  for (size_t i = 0; i < bytes; ++i) buf[i] = static_cast<uint8_t>(i * 131 + (i >> 12));
  std::vector<double> rates;
  uint64_t sink = 0;
  for (uint32_t p = 0; p < std::max<uint32_t>(passes, 1); ++p) {
    const auto t0 = std::chrono::steady_clock::now();
    sink ^= XXH3_64bits(buf.data(), buf.size());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    rates.push_back(static_cast<double>(bytes) / s / 1e9);
  }
  auto sorted = rates;
  std::sort(sorted.begin(), sorted.end());
  const double median = sorted[sorted.size() / 2];
  std::cout << "digest rate: XXH3-64 over 256 MiB on one core, " << rates.size()
            << " passes: median " << median << " GB/s (min " << sorted.front() << ", max "
            << sorted.back() << ")" << (sink == 1 ? " " : "") << "\n";
  if (!json.empty()) {
    nlohmann::json j{{"mode", "digest_rate"},
                     {"hash", "XXH3-64"},
                     {"bytes", bytes},
                     {"gbps", rates},
                     {"median_gbps", median}};
    if (json == "-") {
      std::cout << j.dump() << "\n";
    } else {
      std::ofstream f(json);
      f << j.dump(2) << "\n";
      if (!f.flush()) {
        std::cerr << "ferry-bench: cannot write --json file " << json << "\n";
        return 1;
      }
    }
  }
  return 0;
}

}  // namespace ferry::bench
