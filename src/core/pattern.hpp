#pragma once
/// Deterministic byte patterns for verification: the content of a source item is a function of
/// (room, buffer, position within the request), so a destination can be checked without knowing
/// which source pages were used. Used by tests, ferry-bench and the main job.

#include <cstdint>
#include <cstring>
#include <span>

namespace ferry {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Seed of one item: room, buffer index within its pool, pool kind and the item's position in
/// the request (page position for KV, 0 for state and aux).
inline uint64_t pattern_seed(uint64_t room, uint32_t pool, uint32_t buffer, uint64_t position) {
  return splitmix64(room * 0x100000001b3ull ^ (uint64_t{pool} << 56) ^ (uint64_t{buffer} << 32) ^
                    position);
}

/// Fill `out` with the pattern for `seed` (8-byte words; a tail is filled bytewise).
inline void fill_pattern(std::span<uint8_t> out, uint64_t seed) {
  size_t i = 0;
  uint64_t w = seed;
  for (; i + 8 <= out.size(); i += 8) {
    w = w * 6364136223846793005ull + 1442695040888963407ull;
    std::memcpy(out.data() + i, &w, 8);
  }
  w = w * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t k = 0; i < out.size(); ++i, ++k) out[i] = static_cast<uint8_t>(w >> (8 * k));
}

/// Index of the first byte differing from the pattern, or -1 when all bytes match.
inline int64_t check_pattern(std::span<const uint8_t> in, uint64_t seed) {
  size_t i = 0;
  uint64_t w = seed;
  for (; i + 8 <= in.size(); i += 8) {
    w = w * 6364136223846793005ull + 1442695040888963407ull;
    if (std::memcmp(in.data() + i, &w, 8) != 0) {
      for (size_t k = 0; k < 8; ++k)
        if (in[i + k] != static_cast<uint8_t>(w >> (8 * k))) return static_cast<int64_t>(i + k);
    }
  }
  w = w * 6364136223846793005ull + 1442695040888963407ull;
  for (size_t k = 0; i < in.size(); ++i, ++k)
    if (in[i] != static_cast<uint8_t>(w >> (8 * k))) return static_cast<int64_t>(i);
  return -1;
}

}  // namespace ferry
