#pragma once
/// A pool the engine's registration describes (`memory: client` with nothing else in the
/// config, pool_placement::registered): what a register_memory (v7) says, turned into the pool's
/// config section and the place of every buffer in ferryd's address range. Pure: it reads only
/// the request and the descriptors' sizes, so it is tested without a daemon.
///
/// The rules (docs/protocol.md, register_memory):
/// - a buffer lies anywhere in its descriptor (any byte offset); ferryd maps the pages each
///   buffer touches (runs of them merged), one run after the other, and nothing in between;
/// - kv: K of every layer then V of the same layers (one `KV` buffer per layer for MLA), one
///   page size and page count, the heads at this rank (`slice_dim`) and in the model
///   (`total_dim`), tokens per page from the request;
/// - state: tensor-major then layer, every tensor over the same layers, one slot count; each
///   tensor's slot size and slicing facts (`slice_dim`, `outer`, `groups`) the same on every
///   layer;
/// - aux: one buffer per kind of metadata, one row count, each its own row size; the room id
///   in the buffer the request names (or none).
/// The section then meets validate_config like any config's.

#include <optional>
#include <string>
#include <vector>

#include "core/config_types.hpp"
#include "core/errors.hpp"
#include "core/protocol.hpp"

namespace ferry {

/// The page lent memory is mapped in: offsets in a registration's table and the spans ferryd maps
/// are multiples of it, and a memfd of larger blocks (huge pages) is refused.
inline constexpr uint64_t lent_page_bytes = 4096;

/// Bytes [begin, end) of descriptor `fd` (page-aligned) mapped at offset `at` of the pool.
struct fd_span {
  uint32_t fd = 0;
  uint64_t begin = 0, end = 0, at = 0;
  bool operator==(const fd_span&) const = default;
};

struct described_pool {
  pools_config section;        ///< only the registered pool is set, with its offsets
  std::vector<fd_span> spans;  ///< runs of pages, by descriptor then offset
  uint64_t bytes = 0;          ///< the pool's address range
};

/// The pool `req` describes, with descriptors of `fd_sizes` bytes; or invalid_request naming the
/// first buffer or descriptor that does not fit the rules. (validate_config checks the rest.)
result<described_pool> describe_registration(const proto::register_memory& req,
                                             const std::vector<uint64_t>& fd_sizes);

/// How `now` differs from `first` (a pool's description is fixed by its first registration for
/// the daemon's life: peers planned with it), or nothing when they are the same.
std::optional<std::string> registration_difference(pool_kind k, const described_pool& first,
                                                   const described_pool& now);

}  // namespace ferry
