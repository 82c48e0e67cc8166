#pragma once
/// Ferry daemon configuration as plain structs with in-class defaults, and their size helpers:
/// what the pool layouts (layout.hpp), the client protocol (protocol.hpp) and the C++ client
/// need, without the YAML parser or the validation (config.hpp). Installed with the client
/// (Ferry::client) under <prefix>/include/ferry/core; it includes only the standard library.

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace ferry {

/// Which side(s) of a prefill/decode pair this daemon serves.
enum class node_role { prefill, decode, both };

/// One transferable state tensor of a Mamba (or other recurrent) layer, per slot.
struct state_tensor_config {
  std::string name;             ///< e.g. "conv", "temporal"
  std::vector<uint64_t> shape;  ///< per-slot shape at this rank's TP, e.g. [8192, 3]
  uint32_t dtype_bytes = 0;     ///< 2 for bf16, 4 for fp32
  /// Index into `shape` of the TP-sliced axis. Absent: the slicing is unknown, so the tensor can
  /// move only between equal TP sizes (a mismatch is refused, never copied whole).
  std::optional<uint32_t> slice_axis;
  std::vector<uint64_t> shard_groups;  ///< full (unsharded) sub-block sizes along the sliced axis,
                                       ///< e.g. GDN conv [2048, 2048, 4096]; empty = one block
  /// Per shard group, how many units it has: a unit is never split across ranks. At TP P a
  /// group of U units is sliced when P divides U (rank r holds units [r*U/P, (r+1)*U/P)) and
  /// replicated when U divides P (rank r holds unit r / (P/U), as P/U ranks do): Mamba2's B and
  /// C groups with n_groups below TP. Empty: every group's units are its elements (sliced only).
  std::vector<uint64_t> shard_units{};
  /// The element type's name (bf16, fp16, fp32, fp8_e4m3, ...; empty: dtype_bytes alone says
  /// it): two types of one width, bf16 and fp16, are told apart at handshake.
  std::string dtype{};

  /// Bytes of one slot of this tensor for one layer.
  uint64_t slot_bytes() const;
  /// Length of the sliced axis at this rank (shape[slice_axis]; 0 without a slice axis).
  uint64_t sliced_dim() const;
  /// Product of the dims before the sliced axis (1 unless e.g. Kimi conv [K-1, dim]).
  uint64_t outer_count() const;
  /// Bytes of one unit of the sliced axis: product of the dims after it times dtype_bytes.
  uint64_t unit_bytes() const;
  /// Units of shard group `i` (its size when shard_units is empty).
  uint64_t group_units(size_t i) const {
    return i < shard_units.size() ? shard_units[i]
                                  : (i < shard_groups.size() ? shard_groups[i] : 0);
  }
};

/// The part of one shard group of `size` elements and `units` units that TP rank `rank` of `tp`
/// holds, as {first element, count}: a slice of whole units when tp divides units, else the one
/// unit rank / (tp / units) (replicated on tp / units ranks). {0, 0} when neither divides.
inline std::pair<uint64_t, uint64_t> shard_share(uint64_t size, uint64_t units, uint32_t tp,
                                                 uint32_t rank) {
  if (units == 0 || tp == 0 || size % units != 0) return {0, 0};
  const uint64_t unit = size / units;
  if (units % tp == 0) return {rank * (units / tp) * unit, units / tp * unit};
  if (tp % units == 0) return {rank / (tp / units) * unit, unit};
  return {0, 0};
}

/// Where a pool's description comes from and where its buffers lie.
///
/// One source of truth per pool: a daemon-owned pool is described by the config; a `memory:
/// client` pool whose config section says nothing else (`kv: {memory: client}`) is described by
/// the engine's register_memory (v7), which ferryd turns into this same form (docs/
/// architecture.md). `registered` marks such a pool: until the first registration its schema
/// fields are empty and only `memory` is known. `offsets` are the buffers' offsets in the pool's
/// address range, in layout order (layout.hpp), when they are not the computed ones (4 KiB
/// aligned, packed in order): a registered pool's, as a peer learns them from its hello.
struct pool_placement {
  bool registered = false;
  std::vector<uint64_t> offsets;
  bool operator==(const pool_placement&) const = default;
};

/// Paged KV pool: K and V buffers per attention layer (one buffer per layer for MLA).
/// Who owns a pool's memory: ferryd (a POSIX shm object it creates and clients map), or a
/// client that lends its own memory with register_memory (docs/protocol.md).
enum class pool_memory : uint8_t { daemon, client };
const char* to_string(pool_memory m);

struct kv_pool_config {
  std::vector<uint32_t> layer_ids;  ///< global model layer ids of the attention layers
  uint32_t page_tokens = 1;         ///< tokens per page (SGLang CUDA default 1)
  uint32_t kv_heads = 0;            ///< KV heads held by this rank
  uint32_t head_dim = 0;
  uint32_t dtype_bytes = 2;
  bool mla = false;    ///< true: one buffer per layer, no K/V split
  uint64_t pages = 0;  ///< pages per buffer
  /// KV heads of the whole model; 0 means kv_heads x tp.size. Needed when heads are replicated
  /// (tp.size > total heads, e.g. Qwen3-Next's 2 heads at TP4: kv_heads 1, total_heads 2).
  uint32_t total_heads = 0;

  /// Bytes of one page of one layer buffer (K or V).
  uint64_t page_bytes() const;
  /// Number of layer buffers: 2 per layer, or 1 per layer for MLA.
  uint32_t buffer_count() const;
  /// Total KV heads of the model for a daemon at TP size `tp_size`.
  uint32_t model_heads(uint32_t tp_size) const {
    return total_heads ? total_heads : kv_heads * tp_size;
  }
  pool_memory memory = pool_memory::daemon;  ///< who owns the memory
  pool_placement placement{};                ///< see pool_placement
};

/// What a state pool holds, as SGLang's `StateType` names it, and so how a request indexes it:
/// `mamba` by exactly one slot (the single-state rule: a scalar everywhere); `swa` (the
/// sliding window's KV pages), `dsa` (the DSA indexer cache of MLA models) and `minimax_index_k`
/// by a list of pages of their own, like KV (docs/architecture.md, "State components").
enum class state_type : uint8_t { mamba = 0, swa = 1, dsa = 2, minimax_index_k = 3 };
inline constexpr uint8_t state_type_count = 4;
const char* to_string(state_type t);
/// Whether requests index a pool of this type with a page list (else with one slot).
constexpr bool paged(state_type t) { return t != state_type::mamba; }

/// State pool: `slots` slots (pages, for a paged type); every layer in `layer_ids` holds every
/// tensor in `tensors`.
struct mamba_pool_config {
  state_type type = state_type::mamba;
  uint64_t slots = 0;
  std::vector<uint32_t> layer_ids;
  std::vector<state_tensor_config> tensors;
  pool_memory memory = pool_memory::daemon;  ///< who owns the memory
  pool_placement placement{};                ///< see pool_placement
};

/// Aux (metadata) rows, one per in-flight request, in one or more buffers (SGLang's
/// MetadataBuffers: one tensor per kind of metadata, each with its own row size); a request's
/// row index names its row in every buffer. The first 8 bytes of the row of buffer
/// `room_id_buffer` hold the room id (little-endian u64), as SGLang's `bootstrap_room` tensor
/// does; ferryd checks it before it sends the row (`no_room_id`: no such check).
struct aux_pool_config {
  static constexpr uint32_t no_room_id = 0xFFFFFFFFu;
  uint64_t rows = 0;
  uint64_t row_bytes = 0;                  ///< of buffer 0
  std::vector<uint64_t> more_row_bytes{};  ///< of buffers 1.. (a registered pool's MetadataBuffers)
  uint32_t room_id_buffer = 0;
  pool_memory memory = pool_memory::daemon;  ///< who owns the memory
  pool_placement placement{};                ///< see pool_placement

  /// The row size of every buffer, in order.
  std::vector<uint64_t> row_sizes() const {
    std::vector<uint64_t> out{row_bytes};
    out.insert(out.end(), more_row_bytes.begin(), more_row_bytes.end());
    return out;
  }
};

struct pools_config {
  std::optional<kv_pool_config> kv;
  std::optional<mamba_pool_config> mamba;
  std::optional<aux_pool_config> aux;
};

/// The most endpoints `fabric.rails` may ask for.
inline constexpr uint32_t max_fabric_rails = 16;

/// fabric.express_bytes when a config does not set it: 1 MiB on tcp and shm, where it was
/// measured (docs/performance.md §18), 0 (no express rail) on providers where it was not.
inline uint64_t default_express_bytes(const std::string& provider) {
  return provider == "tcp" || provider == "shm" ? (1u << 20) : 0;
}

/// fabric.max_inflight_bytes when a config does not set it: 16 MiB per rail on tcp and shm,
/// where it was measured (docs/performance.md §26: a 16-token room beside four bulk rooms
/// waits behind at most that much, and bulk keeps its rate), none on other providers.
inline uint64_t default_max_inflight_bytes(const std::string& provider) {
  return provider == "tcp" || provider == "shm" ? (16u << 20) : 0;
}

/// fabric.rails when a config does not set it: 2 on shm, whose target copies every write on
/// its progress thread (one rail moves what one core copies: 0.7 x the raw fabric's warm
/// rate, two rails 0.9-1.0 x, docs/performance.md §26); 1 elsewhere (tcp gains nothing, §18).
inline uint32_t default_rails(const std::string& provider) { return provider == "shm" ? 2 : 1; }

struct fabric_config {
  std::string provider = "tcp";       ///< any libfabric provider name: tcp, shm, verbs, efa...
  std::string address = "127.0.0.1";  ///< interface address the endpoint binds to (if used)
  uint32_t max_inflight_writes = 64;  ///< credit bound on posted, uncompleted writes
  /// Bound on one peer's posted, uncompleted payload bytes per rail (0: the write count alone).
  /// Unset in a config file: the provider's default (`default_max_inflight_bytes`).
  uint64_t max_inflight_bytes = 0;
  uint64_t write_piece_bytes = 1 << 20;  ///< large state tensors are split into pieces this size
  /// Endpoints for bulk writes, each with its own progress thread; a batch is striped across
  /// those a peer shares (1..max_rails). Unset in a config file: the provider's default
  /// (`default_rails`).
  uint32_t rails = 1;
  /// Batches of at most this many bytes go on an express endpoint of their own, so small rooms
  /// never queue behind bulk; 0: no express endpoint. Unset in a config file: the provider's
  /// default (`default_express_bytes`).
  uint64_t express_bytes = 0;
  /// Registered bounce memory for head-sliced KV under a TP mismatch (pack at the source,
  /// unpack at the destination) and for small runs of fragmented page lists; 0 disables it
  /// (then one write per token and layer, and one write per run).
  uint64_t staging_bytes = 256ull << 20;
  /// One write is worth this many bytes of copying: runs of pages smaller than this are packed
  /// through staging when the writes saved outweigh the copies (core/pack.hpp); 0: never.
  /// Unset: by provider (`pack_threshold()`).
  std::optional<uint64_t> pack_threshold_bytes;

  /// The effective pack_threshold_bytes: as set, else what was measured for the provider
  /// (docs/performance.md §2): 65536 where every write is a socket send (tcp, sockets), 8192
  /// elsewhere (shm; verbs and efa were not measured).
  uint64_t pack_threshold() const;
};

struct timeouts_config {
  uint32_t handshake_ms = 10000;  ///< connect + handshake with a peer
  /// Per-state bounds, each counted from entering the state (either side of a room):
  uint32_t bootstrapping_ms = 30000;      ///< prefill: the decode's prepares; decode: peers,
                                          ///< staging and the prefill's acceptance
  uint32_t waiting_for_input_ms = 60000;  ///< prefill: the client's chunks; decode: first write
  uint32_t transferring_ms = 60000;       ///< first write to commit
  uint32_t transfer_ms = 120000;  ///< a room must reach a terminal state within this, overall
  uint32_t drain_ms = 2000;       ///< after a failure, in-flight writes must drain within this
  uint32_t heartbeat_ms = 1000;   ///< connected peers exchange a heartbeat this often
  uint32_t heartbeat_misses = 3;  ///< a peer silent for heartbeat_ms x misses is declared dead
  /// A stop (SIGTERM, SIGINT) lets the rooms accepted before it finish within this, then stops
  /// at once; 0: stop at once
  uint32_t stop_ms = 30000;
};

struct limits_config {
  uint32_t max_active_rooms = 16384;  ///< admission: non-terminal rooms per side (prefill, decode)
  /// Client connections at once; more are refused. 0 (the default): half of the descriptors
  /// ferryd may open, at most 4096, so peers, the fabric and CAF keep the other half.
  uint32_t max_clients = 0;
  uint32_t client_frame_ms = 10000;  ///< a started client frame must be complete within this
  /// The peer port (transport/channels/peer_gate.hpp): a connection must finish Ferry's preamble
  /// within this, before CAF sees a byte of it; at most `max_pending_peers` connections are in the
  /// preamble at once, `max_pending_peers_per_source` from one address (over either, the
  /// oldest pending one in that scope is reset).
  uint32_t peer_preamble_ms = 3000;
  uint32_t max_pending_peers = 64;
  uint32_t max_pending_peers_per_source = 8;
};

struct tp_config {
  uint32_t size = 1;
  uint32_t rank = 0;
};

/// Pipeline stage; the layers a stage holds are its pools' layer_ids.
struct pp_config {
  uint32_t size = 1;
  uint32_t rank = 0;
};

/// Attention data parallelism: the group of this rank within its engine instance. `tp` is then
/// the attention TP inside the group; a room's KV and state live in one group's ranks only.
struct dp_config {
  uint32_t size = 1;
  uint32_t rank = 0;
};

/// The actor runtime. Workers: CAF's scheduler threads, which run every actor (none of them ever
/// waits on the fabric or the network); 0 (the default): one per core.
struct runtime_config {
  uint32_t workers = 0;
};

/// What a decode checks of the bytes that land (docs/reliability.md, "Checksums").
struct integrity_config {
  /// Every room this decode receives carries the prefill's digests of what it sent, and reports
  /// Success only once what landed digests the same (XXH3-64 per buffer pair,
  /// core/room_digest.hpp); a difference fails the room with checksum_mismatch. Needs peer protocol
  /// 11 on the prefill.
  bool checksums = false;
};

/// ferryd's named loggers (docs/operations.md, "Logs"): what `log.levels` may name.
inline constexpr std::string_view logger_names[] = {"ferryd", "scheduler", "room",
                                                    "peer",   "client",    "transport"};
/// The levels a logger may have, least severe first.
inline constexpr std::string_view log_level_names[] = {"trace", "debug", "info",
                                                       "warn",  "error", "off"};

struct log_config {
  std::string level = "info";   ///< every logger's level unless `levels` names it
  std::string format = "text";  ///< text (a line per record) or json (an object per line)
  /// Per-logger levels, e.g. {peer: debug}: a logger of `logger_names` and its level.
  std::vector<std::pair<std::string, std::string>> levels;
  /// Every this many ms, one info line of what the rooms did (written only when some ended),
  /// and the counts of the lines the burst limit left out.
  uint32_t summary_ms = 60000;
  /// Per-room lines of one kind (a failure, a refusal) logged per summary interval; the rest
  /// are counted and said in one line. 0: no limit.
  uint32_t burst = 20;
};

struct security_config {
  /// File holding the cluster secret peers prove at handshake (challenge-response); empty: peers
  /// are not authenticated. The file must not be readable by group or others.
  std::string cluster_secret_file;
  /// A second secret file accepted from peers but never proved with, while a cluster rotates
  /// its secret (docs/operations.md, "Secrets"); empty: none. Needs `cluster_secret_file`.
  std::string accepted_cluster_secret_file;
  /// Users (names or uids) and groups (names or gids) admitted to the client socket and the
  /// pools beside ferryd's own user and root (core/access.hpp); empty: nobody else.
  std::vector<std::string> client_users;
  std::vector<std::string> client_groups;
};

/// What the transferred state means, beyond its bytes: the model it belongs to and how much of
/// the prompt it covers. Declared in the config's `model` section and checked equal on both
/// sides of a pair at handshake, so a decode never resumes from a state that means something
/// else (docs/configuration.md, "model").
struct model_contract {
  std::string architecture;  ///< config.json's architectures[0], e.g. Qwen3NextForCausalLM
  /// "n": the Mamba state covers all N prompt tokens; "n_minus_1": all but the last (the decode
  /// runs the last one); empty: not declared
  std::string state_covers;
  /// Layout-relevant config.json fields (heads, groups, kernel sizes, dtypes...), as text
  std::vector<std::pair<std::string, std::string>> fields{};
  bool operator==(const model_contract&) const = default;
};

/// The model catalogue's inputs (the `model` section's config_json, engine and dtypes) and the
/// pools' layout fields it generated, which the config and an engine's registrations are
/// checked against (core/model_catalogue.hpp). Peers are not sent it: they read the result.
struct catalogue_config {
  std::string config_json;                        ///< path of the model's config.json
  std::string engine = "sglang";                  ///< "sglang" or "vllm", optionally "@REVISION"
  std::string conv_layout;                        ///< vLLM's SD or DS (empty: SD)
  std::string kv_dtype, conv_dtype, state_dtype;  ///< overrides (empty: the defaults)
  std::string family;                             ///< what the lookup found
  std::string convention;                         ///< the convention used, "sglang@2026-12"
  std::optional<kv_pool_config> kv;               ///< generated layouts (their sizes 0)
  std::optional<mamba_pool_config> mamba;
};

struct ferry_config {
  std::string node_name;
  std::string instance = "auto";  ///< "auto": a random id chosen at each start
  node_role role = node_role::both;
  std::string control_listen = "127.0.0.1:7400";  ///< host:port for peer daemons (CAF)
  std::string client_listen;                      ///< unix socket path for local clients
  /// host:port of the HTTP endpoint for /metrics, /healthz and /readyz; empty: not served
  std::string metrics_listen;
  fabric_config fabric;
  timeouts_config timeouts;
  limits_config limits;
  security_config security;
  tp_config tp;
  pp_config pp;
  dp_config dp;
  runtime_config runtime;
  integrity_config integrity{};
  pools_config pools;
  log_config log;
  /// Control addresses ("host:port") of every rank of the engine instance this daemon serves
  /// (its TP, PP and DP ranks, this one included or not): what a peer's `discover` of any one
  /// of them answers (docs/protocol.md).
  std::vector<std::string> instance_ranks;
  std::optional<model_contract> model{};        ///< the `model` section (absent: nothing declared)
  std::optional<catalogue_config> catalogue{};  ///< model.config_json given
};

/// The client limit for `max_clients` 0 (auto), given the daemon's descriptor limit.
inline uint32_t auto_max_clients(uint64_t nofile) {
  return static_cast<uint32_t>(std::clamp<uint64_t>(nofile / 2, 16, 4096));
}

/// Actor workers for `runtime.workers` 0 (auto): one per core, at least one.
inline uint32_t auto_workers(uint32_t cores) { return std::clamp<uint32_t>(cores, 1, 256); }

/// Longest node.name and node.instance: together they name the daemon's /dev/shm objects.
inline constexpr size_t max_node_name = 128;
inline constexpr size_t max_instance_name = 64;

const char* to_string(node_role r);

}  // namespace ferry
