// Validation: what a parsed config means, its ranges and consistency (ranks below sizes, pool
// sizes within bounds, tensor shapes that shard over tp.size), reported as the first problem with
// its full key path.
#include <cstdlib>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/access.hpp"
#include "core/config.hpp"
#include "core/config_detail.hpp"
#include "core/layout.hpp"
#include "core/model_catalogue.hpp"

namespace ferry {

using detail::fail;
using detail::quote;

namespace {

// ---------------------------------------------------------------------------------------------
// Validation: meaning, ranges, consistency
// ---------------------------------------------------------------------------------------------

/// Largest total size of one pool: 1 TiB. Larger is almost certainly a unit mistake, and keeps
/// offset arithmetic elsewhere far from 64-bit overflow.
constexpr uint64_t max_pool_bytes = uint64_t{1} << 40;

bool is_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

/// Multiplication and addition that stick at UINT64_MAX instead of wrapping, so an absurd pool
/// size is reported as too large rather than wrapping to something small and passing.
constexpr uint64_t saturated = std::numeric_limits<uint64_t>::max();

uint64_t sat_mul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? saturated : r;
}

uint64_t sat_add(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? saturated : r;
}

std::string bytes_text(uint64_t bytes) {
  return bytes == saturated ? "more than 2^64" : std::to_string(bytes);
}

void check_positive(uint64_t v, const std::string& path) {
  if (v == 0) fail(path, "expected a positive integer, got 0");
}

void check_log_level(const std::string& level, const std::string& path) {
  for (std::string_view known : log_level_names)
    if (level == known) return;
  fail(path, "expected trace, debug, info, warn, error or off, got " + level);
}

void check_range(uint64_t v, uint64_t lo, uint64_t hi, const std::string& path) {
  if (v < lo || v > hi) {
    fail(path, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                   ", got " + std::to_string(v));
  }
}

/// Items a request names by u32 index (no_index, 0xFFFFFFFF, is none): fewer than that.
void check_index_count(uint64_t v, const std::string& path) {
  if (v >= 0xFFFFFFFFull)
    fail(path, "expected fewer than 4294967295 (a request names one by a u32 index), got " +
                   std::to_string(v));
}

void check_dtype(uint32_t v, const std::string& path) {
  if (v != 1 && v != 2 && v != 4 && v != 8) {
    fail(path, "expected 1, 2, 4 or 8, got " + std::to_string(v));
  }
}

/// A tensor's dtype name and its width in bytes: what `tensors[].dtype` may say.
constexpr std::pair<std::string_view, uint32_t> dtype_names[] = {
    {"bf16", 2}, {"fp16", 2},  {"fp32", 4},  {"fp64", 8},  {"fp8_e4m3", 1}, {"fp8_e5m2", 1},
    {"int8", 1}, {"uint8", 1}, {"int16", 2}, {"int32", 4}, {"int64", 8}};

void check_dtype_name(const std::string& name, uint32_t bytes, const std::string& path) {
  if (name.empty()) return;
  std::string known;
  for (const auto& [n, width] : dtype_names) {
    if (name == n) {
      if (width != bytes)
        fail(path, "expected a type " + std::to_string(bytes) + " bytes wide (dtype_bytes), got " +
                       name + " (" + std::to_string(width) + " bytes)");
      return;
    }
    known += (known.empty() ? "" : ", ") + std::string(n);
  }
  fail(path, "expected one of " + known + ", got " + quote(name));
}

void check_layer_ids(const std::vector<uint32_t>& ids, const std::string& path) {
  if (ids.empty()) fail(path, "expected a non-empty list, got []");
  std::set<uint32_t> seen;
  for (uint32_t id : ids) {
    if (!seen.insert(id).second) {
      fail(path, "expected unique layer ids, got " + std::to_string(id) + " twice");
    }
  }
}

void check_pool_total(uint64_t total, const std::string& path) {
  if (total > max_pool_bytes) {
    fail(path, "expected at most " + std::to_string(max_pool_bytes) +
                   " bytes (1 TiB) in total, got " + bytes_text(total));
  }
}

void validate_tensor(const state_tensor_config& t, const std::string& path, uint32_t tp_size) {
  if (t.name.empty()) fail(path + ".name", "expected a non-empty name, got \"\"");
  if (t.shape.empty()) fail(path + ".shape", "expected a non-empty list, got []");
  for (size_t j = 0; j < t.shape.size(); ++j) {
    check_positive(t.shape[j], path + ".shape[" + std::to_string(j) + "]");
  }
  check_dtype(t.dtype_bytes, path + ".dtype_bytes");
  check_dtype_name(t.dtype, t.dtype_bytes, path + ".dtype");
  if (t.slice_axis && *t.slice_axis >= t.shape.size()) {
    const size_t dims = t.shape.size();
    fail(path + ".slice_axis", "expected an axis index below " + std::to_string(dims) +
                                   " (shape has " + std::to_string(dims) +
                                   (dims == 1 ? " dim" : " dims") + "), got " +
                                   std::to_string(*t.slice_axis));
  }
  if (!t.shard_groups.empty() && !t.slice_axis)
    fail(path + ".shard_groups", "expected slice_axis to be given with shard_groups");
  // A plan under a TP mismatch has a segment per outer index and group: keep it bounded.
  if (t.slice_axis) {
    uint64_t outer = 1;
    for (uint32_t j = 0; j < *t.slice_axis && j < t.shape.size(); ++j)
      outer = sat_mul(outer, t.shape[j]);
    const uint64_t groups = std::max<size_t>(1, t.shard_groups.size());
    if (sat_mul(outer, groups) > 65536)
      fail(path + ".shape",
           "expected at most 65536 dims before the sliced axis times its "
           "shard groups, got " +
               std::to_string(outer) + " x " + std::to_string(groups));
  }
  if (t.shard_groups.size() > 64)
    fail(path + ".shard_groups",
         "expected at most 64 groups, got " + std::to_string(t.shard_groups.size()));
  if (!t.shard_units.empty() && t.shard_units.size() != t.shard_groups.size())
    fail(path + ".shard_units", "expected one entry per shard group (" +
                                    std::to_string(t.shard_groups.size()) + "), got " +
                                    std::to_string(t.shard_units.size()));
  if (!t.shard_groups.empty()) {
    uint64_t sum = 0, held = 0;
    for (size_t j = 0; j < t.shard_groups.size(); ++j) {
      const std::string at = "[" + std::to_string(j) + "]";
      check_positive(t.shard_groups[j], path + ".shard_groups" + at);
      sum = sat_add(sum, t.shard_groups[j]);
      const uint64_t units = t.group_units(j);
      if (j < t.shard_units.size()) {
        check_positive(units, path + ".shard_units" + at);
        if (t.shard_groups[j] % units != 0)
          fail(path + ".shard_units" + at, "expected a divisor of shard_groups" + at + " = " +
                                               std::to_string(t.shard_groups[j]) +
                                               " (units are equal), got " + std::to_string(units));
      }
      if (j >= t.shard_units.size() && units % tp_size != 0)
        fail(path + ".shard_groups" + at,
             "expected a multiple of tp.size " + std::to_string(tp_size) +
                 " (each rank holds an equal share of every group), got " +
                 std::to_string(t.shard_groups[j]) +
                 " (a group held whole by several ranks is described with shard_units)");
      if (j < t.shard_units.size() && units % tp_size != 0 && tp_size % units != 0)
        fail(path + ".shard_units" + at,
             "expected a multiple or a divisor of tp.size " + std::to_string(tp_size) +
                 " (each rank holds an equal share of the group's units, or one whole unit "
                 "that tp.size / units ranks hold alike), got " +
                 std::to_string(units));
      held = sat_add(held, shard_share(t.shard_groups[j], units, tp_size, 0).second);
    }
    // Groups are unsharded sizes while shape is per rank: what a rank holds of each group,
    // summed, is its sliced axis.
    const uint64_t sliced = t.shape[*t.slice_axis];
    if (held != sliced) {
      const bool replicated = !t.shard_units.empty();
      fail(path + ".shard_groups",
           replicated ? "expected the groups' shares at tp.size " + std::to_string(tp_size) +
                            " to sum to shape[" + std::to_string(*t.slice_axis) +
                            "] = " + std::to_string(sliced) + ", got " + std::to_string(held) +
                            " (groups summing to " + std::to_string(sum) + ")"
                      : "expected entries summing to shape[" + std::to_string(*t.slice_axis) +
                            "] x tp.size = " + std::to_string(sliced) + " x " +
                            std::to_string(tp_size) + " = " + bytes_text(sat_mul(sliced, tp_size)) +
                            ", got a sum of " + bytes_text(sum));
    }
  }
}

/// Explicit buffer offsets (pool_placement::offsets): one per buffer, no two buffers overlapping.
void check_offsets(const pool_layout& computed, const std::vector<uint64_t>& offsets,
                   const std::string& path) {
  if (offsets.empty()) return;
  if (offsets.size() != computed.buffers.size())
    fail(path, "expected one offset per buffer (" + std::to_string(computed.buffers.size()) +
                   "), got " + std::to_string(offsets.size()));
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // (begin, end)
  for (size_t b = 0; b < offsets.size(); ++b) {
    const auto& buf = computed.buffers[b];
    const uint64_t bytes = sat_mul(buf.item_bytes, buf.items);
    if (sat_add(offsets[b], bytes) == UINT64_MAX)
      fail(path + "[" + std::to_string(b) + "]",
           "expected an offset the buffer fits after, got " + std::to_string(offsets[b]));
    spans.emplace_back(offsets[b], offsets[b] + bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t j = 1; j < spans.size(); ++j)
    if (spans[j].first < spans[j - 1].second)
      fail(path, "expected buffers that do not overlap, got one at " +
                     std::to_string(spans[j].first) + " inside the one at " +
                     std::to_string(spans[j - 1].first));
}

}  // namespace

bool described_yet(const pools_config& pools) {
  return !((pools.kv && pools.kv->placement.registered && pools.kv->layer_ids.empty()) ||
           (pools.mamba && pools.mamba->placement.registered && pools.mamba->tensors.empty()) ||
           (pools.aux && pools.aux->placement.registered && pools.aux->rows == 0));
}

namespace {

void validate_pools(const ferry_config& cfg) {
  const pools_config& pools = cfg.pools;
  if (!pools.kv && !pools.mamba && !pools.aux) {
    fail("pools", std::string("expected at least one of kv, mamba or aux for role ") +
                      to_string(cfg.role) + ", got none");
  }
  // A pool the engine's registration describes has nothing to check until it is described.
  auto waiting = [](const pool_placement& p, bool empty) { return p.registered && empty; };
  const bool kv_known = pools.kv && !waiting(pools.kv->placement, pools.kv->layer_ids.empty());
  const bool mamba_known =
      pools.mamba && !waiting(pools.mamba->placement, pools.mamba->tensors.empty());
  const bool aux_known = pools.aux && !waiting(pools.aux->placement, pools.aux->rows == 0);
  const node_layout computed = make_layout(pools);

  if (kv_known) {
    const kv_pool_config& kv = *pools.kv;
    check_layer_ids(kv.layer_ids, "pools.kv.layer_ids");
    check_positive(kv.page_tokens, "pools.kv.page_tokens");
    check_positive(kv.kv_heads, "pools.kv.kv_heads");
    if (kv.total_heads != 0 && !kv.mla) {
      // Heads split evenly over TP ranks, or each rank holds one head replicated tp/total times.
      const uint32_t tp = cfg.tp.size, total = kv.total_heads;
      const bool ok = tp <= total ? total % tp == 0 && kv.kv_heads == total / tp
                                  : tp % total == 0 && kv.kv_heads == 1;
      if (!ok)
        fail("pools.kv.total_heads",
             "expected heads that divide evenly over tp.size " + std::to_string(tp) +
                 " (kv_heads = total_heads / tp.size, or kv_heads 1 with tp.size a multiple of "
                 "total_heads), got total_heads " +
                 std::to_string(total) + " with kv_heads " + std::to_string(kv.kv_heads));
    }
    check_positive(kv.head_dim, "pools.kv.head_dim");
    check_dtype(kv.dtype_bytes, "pools.kv.dtype_bytes");
    check_positive(kv.pages, "pools.kv.pages");
    check_index_count(kv.pages, "pools.kv.pages");
    uint64_t page =
        sat_mul(sat_mul(kv.page_tokens, kv.kv_heads), sat_mul(kv.head_dim, kv.dtype_bytes));
    check_pool_total(sat_mul(sat_mul(page, kv.pages), kv.buffer_count()), "pools.kv");
    check_offsets(computed[pool_kind::kv], kv.placement.offsets, "pools.kv.offsets");
  }

  if (mamba_known) {
    const mamba_pool_config& mamba = *pools.mamba;
    check_positive(mamba.slots, "pools.mamba.slots");
    check_index_count(mamba.slots, "pools.mamba.slots");
    check_layer_ids(mamba.layer_ids, "pools.mamba.layer_ids");
    // A Mamba layer is not an attention layer; SWA, DSA and MiniMax index-K buffers belong to
    // attention layers (DSA's and MiniMax's to the KV pool's own).
    if (mamba.type == state_type::minimax_index_k && cfg.pp.size > 1)
      fail("pools.mamba.type",
           "expected pp.size 1 for minimax_index_k state (SGLang refuses it "
           "with PP > 1), got pp.size " +
               std::to_string(cfg.pp.size));
    if (mamba.type == state_type::dsa && kv_known && !pools.kv->mla)
      fail("pools.mamba.type",
           "expected MLA KV (pools.kv.mla: true) for dsa state: the DSA "
           "indexer cache exists for MLA models only");
    if (paged(mamba.type) && !pools.kv)
      fail("pools.mamba.type", std::string("expected a kv pool beside a paged state pool (") +
                                   to_string(mamba.type) + " is indexed by pages, like KV)");
    // Falcon-H1 runs attention and a Mamba2 mixer side by side in every layer.
    const bool shared = cfg.model && catalogue_shared_layers(cfg.model->architecture);
    if (kv_known && mamba.type == state_type::mamba && !shared) {
      const std::set<uint32_t> kv_ids(pools.kv->layer_ids.begin(), pools.kv->layer_ids.end());
      for (uint32_t id : mamba.layer_ids) {
        if (kv_ids.count(id) != 0) {
          fail("pools.mamba.layer_ids", "expected ids disjoint from pools.kv.layer_ids, got " +
                                            std::to_string(id) + " in both");
        }
      }
    }
    if (mamba.tensors.empty()) fail("pools.mamba.tensors", "expected a non-empty list, got []");
    std::set<std::string> names;
    uint64_t per_layer_slot = 0;
    for (size_t i = 0; i < mamba.tensors.size(); ++i) {
      const state_tensor_config& t = mamba.tensors[i];
      const std::string path = "pools.mamba.tensors[" + std::to_string(i) + "]";
      validate_tensor(t, path, cfg.tp.size);
      if (!names.insert(t.name).second) {
        fail(path + ".name",
             "expected a name unique within pools.mamba.tensors, got " + quote(t.name) + " again");
      }
      uint64_t bytes = t.dtype_bytes;
      for (uint64_t dim : t.shape) bytes = sat_mul(bytes, dim);
      per_layer_slot = sat_add(per_layer_slot, bytes);
    }
    const uint64_t total = sat_mul(sat_mul(mamba.slots, mamba.layer_ids.size()), per_layer_slot);
    check_pool_total(total, "pools.mamba");
    check_offsets(computed[pool_kind::state], mamba.placement.offsets, "pools.mamba.offsets");
  }

  if (aux_known) {
    const aux_pool_config& aux = *pools.aux;
    check_positive(aux.rows, "pools.aux.rows");
    check_index_count(aux.rows, "pools.aux.rows");
    const auto sizes = aux.row_sizes();
    uint64_t all = 0;
    for (size_t b = 0; b < sizes.size(); ++b) {
      const auto path = sizes.size() == 1 ? std::string("pools.aux.row_bytes")
                                          : "pools.aux.row_bytes[" + std::to_string(b) + "]";
      // A registered pool's rows are the engine's (SGLang's metadata tensors): any size.
      if (aux.placement.registered)
        check_positive(sizes[b], path);
      else if (sizes[b] < 64 || sizes[b] % 8 != 0)
        fail(path, "expected a multiple of 8 that is at least 64, got " + std::to_string(sizes[b]));
      all = sat_add(all, sizes[b]);
    }
    if (aux.room_id_buffer != aux_pool_config::no_room_id) {
      if (aux.room_id_buffer >= sizes.size())
        fail("pools.aux.room_id_buffer", "expected a buffer index below " +
                                             std::to_string(sizes.size()) + " or none, got " +
                                             std::to_string(aux.room_id_buffer));
      if (sizes[aux.room_id_buffer] < 8)
        fail("pools.aux.room_id_buffer",
             "expected a buffer whose rows hold a room id (8 bytes), got buffer " +
                 std::to_string(aux.room_id_buffer) + " with rows of " +
                 std::to_string(sizes[aux.room_id_buffer]) + " bytes");
    }
    check_pool_total(sat_mul(aux.rows, all), "pools.aux");
    check_offsets(computed[pool_kind::aux], aux.placement.offsets, "pools.aux.offsets");
  }
}

}  // namespace

namespace detail {

/// host:port, host being a name, an IPv4 address or a bracketed IPv6 address.
bool is_host_port(std::string_view s) {
  const size_t colon = s.rfind(':');
  if (colon == std::string_view::npos) return false;
  const std::string_view host = s.substr(0, colon);
  const std::string_view port = s.substr(colon + 1);
  if (host.empty()) return false;
  if (host.front() == '[') {
    if (host.size() < 3 || host.back() != ']') return false;
  } else if (host.find(':') != std::string_view::npos) {
    return false;  // unbracketed IPv6 is ambiguous with the port separator
  }
  if (!all_digits(port) || port.size() > 5) return false;
  const int value = std::atoi(std::string(port).c_str());
  return value >= 1 && value <= 65535;
}

void validate_all(const ferry_config& cfg) {
  if (cfg.instance_ranks.size() > 256)
    fail("discovery.instance_ranks",
         "expected at most 256 ranks, got " + std::to_string(cfg.instance_ranks.size()));
  for (size_t i = 0; i < cfg.instance_ranks.size(); ++i) {
    const auto path = "discovery.instance_ranks[" + std::to_string(i) + "]";
    if (!is_host_port(cfg.instance_ranks[i]))
      fail(path, "expected host:port (a port in 1..65535), got " + quote(cfg.instance_ranks[i]));
    for (size_t j = 0; j < i; ++j)
      if (cfg.instance_ranks[j] == cfg.instance_ranks[i])
        fail(path, quote(cfg.instance_ranks[i]) + " is listed twice");
  }
  if (!is_name(cfg.node_name)) {
    fail("node.name", "expected a non-empty name of [A-Za-z0-9._-], got " + quote(cfg.node_name));
  }
  if (cfg.instance != "auto" && !is_name(cfg.instance)) {
    fail("node.instance",
         "expected \"auto\" or a name of [A-Za-z0-9._-], got " + quote(cfg.instance));
  }
  // Both go into /dev/shm names ("ferry.<node>.<instance>.state"), at most NAME_MAX (255) bytes.
  if (cfg.node_name.size() > max_node_name) {
    fail("node.name", "expected at most " + std::to_string(max_node_name) +
                          " characters (it names the daemon's shared-memory objects), got " +
                          std::to_string(cfg.node_name.size()));
  }
  if (cfg.instance.size() > max_instance_name) {
    fail("node.instance", "expected at most " + std::to_string(max_instance_name) +
                              " characters (it names the daemon's shared-memory objects), got " +
                              std::to_string(cfg.instance.size()));
  }

  if (!is_host_port(cfg.control_listen)) {
    fail("listen.control",
         "expected host:port with a port in 1..65535, got " + quote(cfg.control_listen));
  }
  if (!cfg.metrics_listen.empty() && !is_host_port(cfg.metrics_listen)) {
    fail("listen.metrics",
         "expected host:port with a port in 1..65535 (or nothing: no metrics "
         "endpoint), got " +
             quote(cfg.metrics_listen));
  }
  if (cfg.client_listen.empty() || cfg.client_listen.front() != '/') {
    fail("listen.client", "expected an absolute path, got " + quote(cfg.client_listen));
  }
  // sockaddr_un::sun_path is 108 bytes including the terminating NUL.
  if (cfg.client_listen.size() >= 108) {
    fail("listen.client", "expected a path shorter than 108 bytes (unix socket limit), got a " +
                              std::to_string(cfg.client_listen.size()) + "-byte path");
  }

  if (cfg.fabric.provider.empty()) fail("fabric.provider", "expected a provider name, got \"\"");
  if (cfg.fabric.address.empty()) fail("fabric.address", "expected an address, got \"\"");
  check_range(cfg.fabric.max_inflight_writes, 1, 65536, "fabric.max_inflight_writes");
  if (cfg.fabric.max_inflight_bytes != 0)
    check_range(cfg.fabric.max_inflight_bytes, 4096, uint64_t{1} << 40,
                "fabric.max_inflight_bytes");
  check_range(cfg.fabric.write_piece_bytes, 4096, uint64_t{1} << 30, "fabric.write_piece_bytes");
  if (cfg.fabric.staging_bytes != 0)
    check_range(cfg.fabric.staging_bytes, 1 << 20, uint64_t{1} << 40, "fabric.staging_bytes");
  if (cfg.fabric.pack_threshold_bytes)
    check_range(*cfg.fabric.pack_threshold_bytes, 0, uint64_t{1} << 30,
                "fabric.pack_threshold_bytes");
  check_range(cfg.fabric.rails, 1, max_fabric_rails, "fabric.rails");
  if (cfg.fabric.express_bytes != 0)
    check_range(cfg.fabric.express_bytes, 4096, uint64_t{1} << 30, "fabric.express_bytes");

  check_range(cfg.timeouts.handshake_ms, 1, 3600000, "timeouts.handshake_ms");
  check_range(cfg.timeouts.bootstrapping_ms, 1, 3600000, "timeouts.bootstrapping_ms");
  check_range(cfg.timeouts.waiting_for_input_ms, 1, 3600000, "timeouts.waiting_for_input_ms");
  check_range(cfg.timeouts.transferring_ms, 1, 3600000, "timeouts.transferring_ms");
  check_range(cfg.timeouts.transfer_ms, 1, 3600000, "timeouts.transfer_ms");
  check_range(cfg.timeouts.drain_ms, 1, 600000, "timeouts.drain_ms");
  check_range(cfg.timeouts.stop_ms, 0, 3600000, "timeouts.stop_ms");
  check_range(cfg.timeouts.heartbeat_ms, 10, 600000, "timeouts.heartbeat_ms");
  check_range(cfg.timeouts.heartbeat_misses, 1, 1000, "timeouts.heartbeat_misses");

  check_range(cfg.limits.max_active_rooms, 1, 1u << 20, "limits.max_active_rooms");
  check_range(cfg.limits.max_clients, 0, 1u << 20, "limits.max_clients");  // 0: auto
  check_range(cfg.limits.client_frame_ms, 10, 3600000, "limits.client_frame_ms");
  check_range(cfg.limits.peer_preamble_ms, 10, 600000, "limits.peer_preamble_ms");
  check_range(cfg.limits.max_pending_peers, 1, 65536, "limits.max_pending_peers");
  check_range(cfg.limits.max_pending_peers_per_source, 1, cfg.limits.max_pending_peers,
              "limits.max_pending_peers_per_source");

  check_range(cfg.tp.size, 1, 1024, "tp.size");
  if (cfg.tp.rank >= cfg.tp.size) {
    fail("tp.rank", "expected a rank below tp.size " + std::to_string(cfg.tp.size) + ", got " +
                        std::to_string(cfg.tp.rank));
  }

  check_range(cfg.pp.size, 1, 1024, "pp.size");
  if (cfg.pp.rank >= cfg.pp.size) {
    fail("pp.rank", "expected a rank below pp.size " + std::to_string(cfg.pp.size) + ", got " +
                        std::to_string(cfg.pp.rank));
  }

  check_range(cfg.dp.size, 1, 1024, "dp.size");
  if (cfg.dp.rank >= cfg.dp.size) {
    fail("dp.rank", "expected a rank below dp.size " + std::to_string(cfg.dp.size) + ", got " +
                        std::to_string(cfg.dp.rank));
  }

  check_range(cfg.runtime.workers, 0, 256, "runtime.workers");  // 0: one per core

  if (const auto& sec = cfg.security; !sec.accepted_cluster_secret_file.empty()) {
    if (sec.cluster_secret_file.empty())
      fail("security.accepted_cluster_secret_file",
           "needs security.cluster_secret_file too: the secret this daemon proves with (the "
           "accepted one is only checked in peers' proofs)");
    if (sec.accepted_cluster_secret_file == sec.cluster_secret_file)
      fail("security.accepted_cluster_secret_file",
           "expected a file other than security.cluster_secret_file, got the same " +
               quote(sec.cluster_secret_file));
  }
  // Names are resolved now, so a user or group this host does not know stops the start.
  if (auto access = resolve_client_access(cfg.security); !access)
    throw detail::config_failure{access.message};

  check_log_level(cfg.log.level, "log.level");
  for (const auto& [logger, level] : cfg.log.levels) check_log_level(level, "log.levels." + logger);
  if (cfg.log.format != "text" && cfg.log.format != "json")
    fail("log.format", "expected text or json, got " + cfg.log.format);
  check_range(cfg.log.summary_ms, 100, 86400000, "log.summary_ms");
  check_range(cfg.log.burst, 0, 1000000, "log.burst");

  if (cfg.model) {
    if (cfg.model->architecture.empty())
      fail("model.architecture",
           "expected the model's architecture (config.json's "
           "architectures[0], e.g. Qwen3NextForCausalLM), got \"\"");
    const auto& covers = cfg.model->state_covers;
    if (!covers.empty() && covers != "n" && covers != "n_minus_1")
      fail("model.state_covers",
           "expected n (the state covers all N prompt tokens) or n_minus_1 (all but the last), "
           "got " +
               quote(covers));
  }

  validate_pools(cfg);
}

}  // namespace detail
}  // namespace ferry
