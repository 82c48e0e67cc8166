#pragma once
/// Parallel geometry: which prefill ranks feed which decode rank, and which bytes of a token row
/// or a state slot go where when the two sides run different tensor-parallel (TP) sizes or
/// pipeline (PP) stages. Pure functions; docs/geometry.md explains the rules with an example.
///
/// Ownership (the definition every rule below follows):
/// - KV heads, H in total, TP size P: if P <= H, rank r holds heads [r*H/P, (r+1)*H/P); if
///   P > H, rank r holds the single head r / (P/H) (each head replicated P/H times). MLA KV is
///   replicated on every rank.
/// - A sliced state tensor axis of full length D, split into shard groups G_0..G_k (sum = D;
///   one group [D] when none are given): rank r holds [r*G_i/P, (r+1)*G_i/P) of every group,
///   groups concatenated in order. Dims before the sliced axis are "outer" rows, repeated.
///   A group with shard_units U holds whole units: sliced by units when P divides U, else (U
///   divides P) rank r holds unit r / (P/U), replicated like a KV head (Mamba2 B and C).
/// - Layers are paired by global layer id; a PP stage holds the layer ids in its pools.
///
/// A decode rank d of Pd receives from prefill TP ranks [d*(Ps/Pd), (d+1)*(Ps/Pd)) when Ps > Pd
/// (gather) or from rank d / (Pd/Ps) when Ps <= Pd (scatter), of every PP stage when the decode
/// has PP 1, else of its own stage. Each byte it needs is sent exactly once: a head held by
/// several prefill ranks (a KV head, or a replicated state group) is sent by the lowest of them.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/config.hpp"
#include "core/layout.hpp"

namespace ferry {

/// What a daemon declares at handshake about its place in the model.
struct rank_schema {
  pools_config pools;
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  uint32_t pp_size = 1;
  uint32_t pp_rank = 0;
  uint32_t dp_size = 1;  ///< attention DP: a room's source ranks are of one group
  uint32_t dp_rank = 0;
  std::optional<model_contract> model{};  ///< what the state means (config `model`), checked equal
};
rank_schema schema_of(const ferry_config& cfg);

/// The first difference between two sides' model contracts (config `model`: architecture,
/// what the state covers, the layout-relevant fields), named; nullopt when they agree. A side
/// that declares none differs from one that does.
std::optional<std::string> contract_difference(const std::optional<model_contract>& prefill,
                                               const std::optional<model_contract>& decode);

/// A range [first, first + count) of heads or dims.
struct unit_range {
  uint64_t first = 0;
  uint64_t count = 0;
  bool operator==(const unit_range&) const = default;
};

/// KV heads held by TP rank `rank` of `tp` when the model has `total` KV heads.
/// Precondition: tp divides total or total divides tp.
unit_range kv_heads_of(uint32_t total, uint32_t tp, uint32_t rank);

/// Prefill TP ranks decode rank `decode_rank` (of `pd`) receives from, ascending.
/// Precondition: ps divides pd or pd divides ps.
std::vector<uint32_t> prefill_ranks_for(uint32_t ps, uint32_t pd, uint32_t decode_rank);

/// How many decode ranks prepare each room on one prefill rank of the same stage: max(1, Pd/Ps).
uint32_t decode_ranks_per_prefill(uint32_t ps, uint32_t pd);

/// Bytes copied within one item (a token row of one KV buffer, or a state slot of one buffer).
struct segment {
  uint64_t src = 0;  ///< offset within the source item
  uint64_t dst = 0;  ///< offset within the destination item
  uint64_t length = 0;
  bool operator==(const segment&) const = default;
};

/// Index of a buffer in the source and in the destination pool layout.
struct buffer_pair {
  uint32_t src = 0;
  uint32_t dst = 0;
  uint32_t tensor = 0;  ///< state tensor index (state pairs only)
  bool operator==(const buffer_pair&) const = default;
};

/// How a link moves KV.
enum class kv_mode : uint8_t {
  none,         ///< nothing: another prefill rank sends these heads (or MLA non-leader)
  whole_pages,  ///< same heads on both sides: runs of pages copy whole
  pack,         ///< the decode row is a slice of the prefill row: gather the slice of every
                ///< token into contiguous staging at the source, one write per run
  unpack,       ///< the prefill row is a slice of the decode row: write whole source runs into
                ///< the decode's staging; the decode scatters them into its pages on commit
};
const char* to_string(kv_mode m);

/// Everything about moving a room from one prefill rank to one decode rank that does not depend
/// on the room: computed once per peer pair at handshake and cached; per request only page,
/// slot and row indices (and staging offsets) change.
struct link_plan {
  bool in_group = false;  ///< the decode rank receives from this prefill rank at all

  kv_mode kv = kv_mode::none;
  std::vector<buffer_pair> kv_buffers;  ///< paired by (K or V, global layer id)
  uint32_t page_tokens = 1;
  uint64_t src_page_bytes = 0, dst_page_bytes = 0;
  uint64_t src_row_bytes = 0, dst_row_bytes = 0;  ///< one token of one KV buffer
  segment row;                                    ///< the slice of a token row that moves

  std::vector<buffer_pair> state_buffers;            ///< paired by (tensor, global layer id)
  std::vector<std::vector<segment>> state_segments;  ///< per tensor: segments within a slot

  bool aux = false;  ///< this link carries the aux row

  /// Destination staging a room of `pages` decode pages needs (kv_mode::unpack only).
  uint64_t unpack_staging_bytes(uint64_t pages) const;
  /// Destination staging a room of `pages` decode pages takes when this link's KV lands in
  /// staging, laid out [buffer pair][page position][page_tokens × row slice] (core/pack.hpp);
  /// 0 for kv_mode::none.
  uint64_t landing_bytes(uint64_t pages) const;
  /// Human-readable one-line summary for logs.
  std::string describe() const;
};

/// The plan for prefill rank `src` sending to decode rank `dst`, or the first incompatibility
/// (`errc::peer_incompatible`) naming the field and both values (page size, dtype, head_dim, head
/// counts that do not divide, a prefill layer id the decode lacks, a state tensor whose dims do not
/// divide, missing slicing metadata under a TP mismatch...). A pair outside each other's group
/// gives a plan with in_group = false (still validated for schema compatibility).
result<link_plan> make_link_plan(const rank_schema& src, const rank_schema& dst);

/// Which of the `named` prefill ranks the decode rank `decode` receives from (indices into
/// `named`), checking that every required TP rank of every required PP stage is named exactly
/// once and that the chosen stages hold every decode layer exactly once. Named peers outside
/// the decode rank's group are left out. The error names what is missing or duplicated.
result<std::vector<size_t>> select_prefill_peers(const rank_schema& decode,
                                                 std::span<const rank_schema> named);

}  // namespace ferry
