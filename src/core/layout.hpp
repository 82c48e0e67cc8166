#pragma once
/// Memory layouts of the three pools, derived deterministically from the pool config so both
/// daemons (and clients) compute identical offsets from the same numbers.
///
/// KV pool: buffers [K(l0) .. K(ln), V(l0) .. V(ln)] (MLA: one buffer per layer), each
///   `pages * page_bytes`; page p of buffer b is at `buffers[b].offset + p * item_bytes`.
/// State pool: buffers tensor-major then layer [t0(l0) .. t0(ln), t1(l0) ..], each
///   `slots * slot_bytes`; slot s of buffer b is at `buffers[b].offset + s * item_bytes`.
/// Aux pool: one buffer of `rows * row_bytes` per row size (`aux_pool_config::row_sizes`).
/// Every buffer starts on a 4 KiB boundary, packed in this order, unless the pool's placement
/// gives its offsets (a pool its registration describes: the engine's own, any byte).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

// Installed with Ferry::client: neighbours included by file name (src/core/CMakeLists.txt).
#include "config_types.hpp"

namespace ferry {

enum class pool_kind : uint8_t { kv = 0, state = 1, aux = 2 };
inline constexpr int pool_kind_count = 3;
const char* to_string(pool_kind k);

/// What a buffer holds, for display and compatibility checks.
enum class buffer_kind : uint8_t { k = 0, v = 1, kv = 2, state = 3, aux = 4 };
/// "K", "V", "KV", "state" or "aux".
const char* to_string(buffer_kind k);

struct buffer_layout {
  uint64_t offset = 0;      ///< from the pool base
  uint64_t item_bytes = 0;  ///< one page (KV), one slot (state) or one row (aux)
  uint64_t items = 0;       ///< pages, slots or rows
  uint32_t layer_id = 0;    ///< global layer id (0 for aux)
  uint32_t tensor = 0;      ///< state tensor index (0 otherwise)
  buffer_kind kind = buffer_kind::aux;
};

struct pool_layout {
  bool present = false;
  uint64_t total_bytes = 0;
  std::vector<buffer_layout> buffers;
};

struct node_layout {
  pool_layout pools[pool_kind_count];
  const pool_layout& operator[](pool_kind k) const { return pools[static_cast<int>(k)]; }
  pool_layout& operator[](pool_kind k) { return pools[static_cast<int>(k)]; }
};

node_layout make_layout(const pools_config& cfg);

/// The global layer ids a rank holds: those of its KV and state buffers, ascending, each once.
/// A send's layer range (docs/protocol.md, "Layer-wise sends") names these.
std::vector<uint32_t> layer_ids(const node_layout& layout);

/// A stable 64-bit hash of a pool schema: a peer sends it with its config so the receiver can
/// tell a corrupted handshake from a real difference.
uint64_t compatibility_hash(const pools_config& cfg);

}  // namespace ferry
