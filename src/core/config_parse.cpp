// Parsing: YAML text to the config structs, checking only keys and types (an unknown or repeated
// key, a string where a number belongs); what the values mean is config_validate.cpp's.
#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config.hpp"
#include "core/config_detail.hpp"

namespace ferry {

using detail::all_digits;
using detail::fail;
using detail::quote;

namespace {

// ---------------------------------------------------------------------------------------------
// Parsing: YAML nodes to structs, types only
// ---------------------------------------------------------------------------------------------

/// Plain (unquoted) scalars carry the non-specific tag "?"; quoted ones carry "!".
bool is_plain(const YAML::Node& n) { return n.Tag() == "?"; }

bool is_bool_word(std::string_view s) {
  return s == "true" || s == "True" || s == "TRUE" || s == "false" || s == "False" || s == "FALSE";
}

bool looks_numeric(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

/// The value seen, for "got ..." texts: numbers and booleans as written, other text quoted so a
/// string where a number belongs is visibly a string.
std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      return "null";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      break;
  }
  const std::string& s = n.Scalar();
  if (is_plain(n) && (looks_numeric(s) || is_bool_word(s))) return s;
  return quote(s);
}

/// Reads a non-negative integer no larger than `max`. Only plain scalars count: a quoted "4" is a
/// string, which keeps the type rules of the file obvious.
uint64_t read_uint(const YAML::Node& n, const std::string& path, uint64_t max) {
  if (!n.IsScalar() || !is_plain(n)) fail(path, "expected an integer, got " + describe(n));
  std::string_view s = n.Scalar();
  if (s.size() > 1 && s[0] == '-' && all_digits(s.substr(1))) {
    fail(path, "expected a non-negative integer, got " + std::string(s));
  }
  std::string_view digits = s;
  if (!digits.empty() && digits[0] == '+') digits.remove_prefix(1);
  int base = 10;
  if (digits.size() > 2 && digits[0] == '0' && (digits[1] == 'x' || digits[1] == 'X')) {
    digits.remove_prefix(2);
    base = 16;
  }
  uint64_t value = 0;
  const char* first = digits.data();
  const char* last = digits.data() + digits.size();
  const auto [ptr, ec] = std::from_chars(first, last, value, base);
  if (digits.empty() || ptr != last ||
      (ec != std::errc{} && ec != std::errc::result_out_of_range)) {
    fail(path, "expected an integer, got " + describe(n));
  }
  if (ec == std::errc::result_out_of_range || value > max) {
    fail(path, "expected an integer at most " + std::to_string(max) + ", got " + std::string(s));
  }
  return value;
}

void read(const YAML::Node& n, const std::string& path, uint32_t& out) {
  out = static_cast<uint32_t>(read_uint(n, path, std::numeric_limits<uint32_t>::max()));
}

void read(const YAML::Node& n, const std::string& path, uint64_t& out) {
  out = read_uint(n, path, std::numeric_limits<uint64_t>::max());
}

/// Where `s` is not printable UTF-8 (a control character, or bytes that are no UTF-8), or
/// npos. A config's text is printed again (`--check-config`, a peer's hello) and must read back
/// the same, which such bytes would not.
size_t unprintable_at(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) return i;
    const size_t len = c < 0x80           ? 1
                       : (c >> 5) == 0x6  ? 2
                       : (c >> 4) == 0xe  ? 3
                       : (c >> 3) == 0x1e ? 4
                                          : 0;
    if (len == 0 || i + len > s.size()) return i;
    for (size_t j = 1; j < len; ++j)
      if ((static_cast<unsigned char>(s[i + j]) >> 6) != 0x2) return i;
    i += len;
  }
  return std::string::npos;
}

void read(const YAML::Node& n, const std::string& path, std::string& out) {
  if (!n.IsScalar()) fail(path, "expected a string, got " + describe(n));
  out = n.Scalar();
  if (const auto at = unprintable_at(out); at != std::string::npos)
    fail(path, fmt::format("expected printable UTF-8 text, got byte 0x{:02x} at offset {}",
                           static_cast<unsigned char>(out[at]), at));
}

void read(const YAML::Node& n, const std::string& path, bool& out) {
  if (n.IsScalar() && is_plain(n) && is_bool_word(n.Scalar())) {
    out = n.Scalar()[0] == 't' || n.Scalar()[0] == 'T';
    return;
  }
  fail(path, "expected true or false, got " + describe(n));
}

template <class T>
void read(const YAML::Node& n, const std::string& path, std::optional<T>& out) {
  T value{};
  read(n, path, value);
  out = value;
}

template <class T>
void read(const YAML::Node& n, const std::string& path, std::vector<T>& out) {
  if (!n.IsSequence()) fail(path, "expected a list, got " + describe(n));
  out.clear();
  out.reserve(n.size());
  for (size_t i = 0; i < n.size(); ++i) {
    T value{};
    read(n[i], path + "[" + std::to_string(i) + "]", value);
    out.push_back(std::move(value));
  }
}

/// A YAML map whose keys are checked against a fixed set before any value is read, so a typo is
/// reported as an unknown key rather than as a missing required key. A null node (an absent
/// section, or `key:` with nothing under it) reads as an empty map.
class section {
 public:
  section(const YAML::Node& node, std::string path, std::initializer_list<std::string_view> keys)
      : section(node, std::move(path),
                std::span<const std::string_view>(keys.begin(), keys.size())) {}
  section(const YAML::Node& node, std::string path, std::span<const std::string_view> keys)
      : path_(std::move(path)) {
    const std::string where = path_.empty() ? "config" : path_;
    if (node.IsNull()) return;
    if (!node.IsMap()) fail(where, "expected a map, got " + describe(node));
    for (const auto& entry : node) {
      const YAML::Node& key = entry.first;
      const std::string name = key.IsScalar() ? key.Scalar() : describe(key);
      bool known = false;
      for (std::string_view k : keys) known = known || (key.IsScalar() && k == name);
      if (!known && name == "prepare_wait_ms" && path_ == "timeouts")
        fail(child(name), "unknown key (renamed to timeouts.bootstrapping_ms)");
      if (!known) fail(child(name), "unknown key");
      // yaml-cpp accepts repeated keys and keeps the first; a repeat is almost always an edit
      // mistake, so refuse it instead of silently ignoring the later value.
      for (const auto& seen : entries_) {
        if (seen.first == name) fail(child(name), "duplicate key");
      }
      entries_.emplace_back(name, entry.second);
    }
  }

  /// Full key path of `key` within this section.
  std::string child(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }

  /// How many keys the section has.
  size_t size() const { return entries_.size(); }

  /// The value under `key`, if the key is present.
  std::optional<YAML::Node> find(std::string_view key) const {
    for (const auto& [name, value] : entries_) {
      if (name == key) return value;
    }
    return std::nullopt;
  }

  /// The value under `key`, or a null node (an empty sub-section) when absent.
  YAML::Node get_or_null(std::string_view key) const {
    auto value = find(key);
    return value ? *value : YAML::Node();
  }

  template <class T>
  void optional_field(std::string_view key, T& out) const {
    if (auto value = find(key)) read(*value, child(key), out);
  }

  template <class T>
  void required_field(std::string_view key, T& out) const {
    auto value = find(key);
    if (!value) fail(child(key), "required key is missing");
    read(*value, child(key), out);
  }

 private:
  std::string path_;
  std::vector<std::pair<std::string, YAML::Node>> entries_;
};

pool_memory parse_memory(const section& s, const std::string& path) {
  std::optional<std::string> text;
  s.optional_field("memory", text);
  if (!text || *text == "daemon") return pool_memory::daemon;
  if (*text == "client") return pool_memory::client;
  fail(path + ".memory", "expected daemon or client, got " + *text);
}

state_type parse_state_type(const section& s) {
  std::optional<std::string> text;
  s.optional_field("type", text);
  if (!text) return state_type::mamba;
  for (uint8_t t = 0; t < state_type_count; ++t)
    if (*text == to_string(static_cast<state_type>(t))) return static_cast<state_type>(t);
  fail("pools.mamba.type", "expected mamba, swa, dsa or minimax_index_k, got " + *text);
}

node_role parse_role(const YAML::Node& n, const std::string& path) {
  std::string text;
  read(n, path, text);
  if (text == "prefill") return node_role::prefill;
  if (text == "decode") return node_role::decode;
  if (text == "both") return node_role::both;
  fail(path, "expected prefill, decode or both, got " + text);
}

/// A `memory: client` section that gives nothing but `memory`: the engine's registration
/// describes the pool (pool_placement::registered). A described one, as ferryd writes it for
/// its peers, says `registered: true` beside its description.
bool described_by_registration(const section& s, pool_memory memory, const std::string& path) {
  bool said = false;
  s.optional_field("registered", said);
  if (said && memory != pool_memory::client)
    fail(path + ".registered", "expected only with memory: client");
  return memory == pool_memory::client && (said || s.size() == 1);
}

kv_pool_config parse_kv(const YAML::Node& n) {
  const section s(n, "pools.kv",
                  {"layer_ids", "page_tokens", "kv_heads", "total_heads", "head_dim", "dtype_bytes",
                   "mla", "pages", "memory", "offsets", "registered"});
  kv_pool_config kv;
  kv.memory = parse_memory(s, "pools.kv");
  kv.placement.registered = described_by_registration(s, kv.memory, "pools.kv");
  if (kv.placement.registered && s.size() == 1) {
    kv.page_tokens = 0;  // the registration says it
    return kv;
  }
  s.required_field("layer_ids", kv.layer_ids);
  s.optional_field("page_tokens", kv.page_tokens);
  s.required_field("kv_heads", kv.kv_heads);
  s.optional_field("total_heads", kv.total_heads);
  s.required_field("head_dim", kv.head_dim);
  s.optional_field("dtype_bytes", kv.dtype_bytes);
  s.optional_field("mla", kv.mla);
  s.required_field("pages", kv.pages);
  s.optional_field("offsets", kv.placement.offsets);
  return kv;
}

state_tensor_config parse_tensor(const YAML::Node& n, const std::string& path) {
  const section s(
      n, path,
      {"name", "shape", "dtype_bytes", "dtype", "slice_axis", "shard_groups", "shard_units"});
  state_tensor_config t;
  s.required_field("name", t.name);
  s.required_field("shape", t.shape);
  s.required_field("dtype_bytes", t.dtype_bytes);
  s.optional_field("slice_axis", t.slice_axis);
  s.optional_field("shard_groups", t.shard_groups);
  s.optional_field("shard_units", t.shard_units);
  s.optional_field("dtype", t.dtype);
  return t;
}

std::string expand_environment(const std::string& value, const std::string& path);

model_contract parse_model(const YAML::Node& n, std::optional<catalogue_config>& catalogue) {
  const section s(n, "model",
                  {"architecture", "state_covers", "fields", "config_json", "engine", "conv_layout",
                   "kv_dtype", "conv_dtype", "state_dtype"});
  model_contract m;
  if (s.find("config_json")) {
    catalogue.emplace();
    s.required_field("config_json", catalogue->config_json);
    catalogue->config_json = expand_environment(catalogue->config_json, "model.config_json");
    s.optional_field("engine", catalogue->engine);
    s.optional_field("conv_layout", catalogue->conv_layout);
    s.optional_field("kv_dtype", catalogue->kv_dtype);
    s.optional_field("conv_dtype", catalogue->conv_dtype);
    s.optional_field("state_dtype", catalogue->state_dtype);
    s.optional_field("architecture", m.architecture);  // from config.json when not given
  } else {
    for (const char* key : {"engine", "conv_layout", "kv_dtype", "conv_dtype", "state_dtype"})
      if (s.find(key))
        fail(std::string("model.") + key,
             "expected model.config_json beside it (it says how to read the model's config)");
    s.required_field("architecture", m.architecture);
  }
  s.optional_field("state_covers", m.state_covers);
  if (auto fields = s.find("fields")) {
    if (!fields->IsMap()) fail("model.fields", "expected a map, got " + describe(*fields));
    for (const auto& entry : *fields) {
      const std::string key = entry.first.IsScalar() ? entry.first.Scalar() : describe(entry.first);
      if (!entry.second.IsScalar())
        fail("model.fields." + key, "expected a number or a word, got " + describe(entry.second));
      for (const auto& seen : m.fields)
        if (seen.first == key) fail("model.fields." + key, "duplicate key");
      m.fields.emplace_back(key, entry.second.Scalar());
    }
    std::sort(m.fields.begin(), m.fields.end());
  }
  return m;
}

mamba_pool_config parse_mamba(const YAML::Node& n) {
  const section s(n, "pools.mamba",
                  {"type", "slots", "layer_ids", "tensors", "memory", "offsets", "registered"});
  mamba_pool_config mamba;
  mamba.memory = parse_memory(s, "pools.mamba");
  mamba.placement.registered = described_by_registration(s, mamba.memory, "pools.mamba");
  if (mamba.placement.registered && s.size() == 1) return mamba;
  mamba.type = parse_state_type(s);
  s.required_field("slots", mamba.slots);
  s.required_field("layer_ids", mamba.layer_ids);
  const auto tensors = s.find("tensors");
  if (!tensors) fail("pools.mamba.tensors", "required key is missing");
  if (!tensors->IsSequence()) {
    fail("pools.mamba.tensors", "expected a list, got " + describe(*tensors));
  }
  for (size_t i = 0; i < tensors->size(); ++i) {
    mamba.tensors.push_back(
        parse_tensor((*tensors)[i], "pools.mamba.tensors[" + std::to_string(i) + "]"));
  }
  s.optional_field("offsets", mamba.placement.offsets);
  return mamba;
}

aux_pool_config parse_aux(const YAML::Node& n) {
  const section s(n, "pools.aux",
                  {"rows", "row_bytes", "memory", "room_id_buffer", "offsets", "registered"});
  aux_pool_config aux;
  aux.memory = parse_memory(s, "pools.aux");
  aux.placement.registered = described_by_registration(s, aux.memory, "pools.aux");
  if (aux.placement.registered && s.size() == 1) return aux;
  s.required_field("rows", aux.rows);
  // One row size (one buffer), or a list of them (one buffer each, as SGLang's MetadataBuffers).
  const auto rows = s.find("row_bytes");
  if (!rows) fail("pools.aux.row_bytes", "required key is missing");
  if (rows->IsSequence()) {
    std::vector<uint64_t> sizes;
    read(*rows, "pools.aux.row_bytes", sizes);
    if (sizes.empty()) fail("pools.aux.row_bytes", "expected a non-empty list, got []");
    aux.row_bytes = sizes.front();
    aux.more_row_bytes.assign(sizes.begin() + 1, sizes.end());
  } else {
    read(*rows, "pools.aux.row_bytes", aux.row_bytes);
  }
  if (auto room = s.find("room_id_buffer")) {
    if (room->IsScalar() && room->Scalar() == "none")
      aux.room_id_buffer = aux_pool_config::no_room_id;
    else
      read(*room, "pools.aux.room_id_buffer", aux.room_id_buffer);
  }
  s.optional_field("offsets", aux.placement.offsets);
  return aux;
}

/// `${NAME}` in `value` replaced by the environment's NAME, so that one config file serves many
/// runs (a temporary directory per run, systemd's ${RUNTIME_DIRECTORY}). NAME is letters,
/// digits and '_'; an unset or empty NAME fails naming it. Any other '$' stays as it is.
std::string expand_environment(const std::string& value, const std::string& path) {
  std::string out;
  size_t at = 0;
  for (size_t open; (open = value.find("${", at)) != std::string::npos;) {
    const size_t close = value.find('}', open + 2);
    if (close == std::string::npos) fail(path, "a '${' without its '}' in '" + value + "'");
    const std::string name = value.substr(open + 2, close - open - 2);
    const bool well_formed = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                             std::all_of(name.begin(), name.end(), [](char c) {
                               return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                             });
    if (!well_formed) fail(path, "'${" + name + "}' is not an environment variable name");
    const char* v = std::getenv(name.c_str());
    if (!v || !*v)
      fail(path,
           "${" + name + "} names the environment variable " + name + ", which is unset or empty");
    out += value.substr(at, open - at);
    out += v;
    at = close + 1;
  }
  return out + value.substr(at);
}

ferry_config parse_root(const YAML::Node& root) {
  ferry_config cfg;
  const section top(root, "",
                    {"node", "role", "listen", "fabric", "timeouts", "limits", "security", "tp",
                     "pp", "dp", "runtime", "integrity", "log", "pools", "discovery", "model"});
  if (auto model = top.find("model")) cfg.model = parse_model(*model, cfg.catalogue);

  const section node(top.get_or_null("node"), "node", {"name", "instance"});
  node.required_field("name", cfg.node_name);
  node.optional_field("instance", cfg.instance);

  if (auto role = top.find("role")) cfg.role = parse_role(*role, "role");

  const section discovery(top.get_or_null("discovery"), "discovery", {"instance_ranks"});
  discovery.optional_field("instance_ranks", cfg.instance_ranks);

  const section listen(top.get_or_null("listen"), "listen", {"control", "client", "metrics"});
  listen.optional_field("control", cfg.control_listen);
  listen.required_field("client", cfg.client_listen);
  cfg.client_listen = expand_environment(cfg.client_listen, "listen.client");
  listen.optional_field("metrics", cfg.metrics_listen);

  const section fabric(
      top.get_or_null("fabric"), "fabric",
      {"provider", "address", "max_inflight_writes", "max_inflight_bytes", "write_piece_bytes",
       "staging_bytes", "pack_threshold_bytes", "rails", "express_bytes"});
  fabric.optional_field("provider", cfg.fabric.provider);
  fabric.optional_field("address", cfg.fabric.address);
  fabric.optional_field("max_inflight_writes", cfg.fabric.max_inflight_writes);
  if (fabric.find("max_inflight_bytes"))
    fabric.optional_field("max_inflight_bytes", cfg.fabric.max_inflight_bytes);
  else
    cfg.fabric.max_inflight_bytes = default_max_inflight_bytes(cfg.fabric.provider);
  fabric.optional_field("write_piece_bytes", cfg.fabric.write_piece_bytes);
  fabric.optional_field("staging_bytes", cfg.fabric.staging_bytes);
  fabric.optional_field("pack_threshold_bytes", cfg.fabric.pack_threshold_bytes);
  if (fabric.find("rails"))
    fabric.optional_field("rails", cfg.fabric.rails);
  else
    cfg.fabric.rails = default_rails(cfg.fabric.provider);
  // Unset: on for the providers it was measured on (docs/performance.md §18: small rooms beside
  // bulk 1.00 x idle on shm and 1.07 x on tcp with it, 40 x and 102 x without; bulk unchanged).
  if (fabric.find("express_bytes"))
    fabric.optional_field("express_bytes", cfg.fabric.express_bytes);
  else
    cfg.fabric.express_bytes = default_express_bytes(cfg.fabric.provider);

  const section timeouts(
      top.get_or_null("timeouts"), "timeouts",
      {"handshake_ms", "bootstrapping_ms", "waiting_for_input_ms", "transferring_ms", "transfer_ms",
       "drain_ms", "heartbeat_ms", "heartbeat_misses", "stop_ms"});
  timeouts.optional_field("handshake_ms", cfg.timeouts.handshake_ms);
  timeouts.optional_field("bootstrapping_ms", cfg.timeouts.bootstrapping_ms);
  timeouts.optional_field("waiting_for_input_ms", cfg.timeouts.waiting_for_input_ms);
  timeouts.optional_field("transferring_ms", cfg.timeouts.transferring_ms);
  timeouts.optional_field("transfer_ms", cfg.timeouts.transfer_ms);
  timeouts.optional_field("drain_ms", cfg.timeouts.drain_ms);
  timeouts.optional_field("stop_ms", cfg.timeouts.stop_ms);
  timeouts.optional_field("heartbeat_ms", cfg.timeouts.heartbeat_ms);
  timeouts.optional_field("heartbeat_misses", cfg.timeouts.heartbeat_misses);

  const section security(
      top.get_or_null("security"), "security",
      {"cluster_secret_file", "accepted_cluster_secret_file", "client_users", "client_groups"});
  security.optional_field("cluster_secret_file", cfg.security.cluster_secret_file);
  security.optional_field("accepted_cluster_secret_file",
                          cfg.security.accepted_cluster_secret_file);
  security.optional_field("client_users", cfg.security.client_users);
  security.optional_field("client_groups", cfg.security.client_groups);

  const section limits(top.get_or_null("limits"), "limits",
                       {"max_active_rooms", "max_clients", "client_frame_ms", "peer_preamble_ms",
                        "max_pending_peers", "max_pending_peers_per_source"});
  limits.optional_field("max_active_rooms", cfg.limits.max_active_rooms);
  limits.optional_field("max_clients", cfg.limits.max_clients);
  limits.optional_field("client_frame_ms", cfg.limits.client_frame_ms);
  limits.optional_field("peer_preamble_ms", cfg.limits.peer_preamble_ms);
  limits.optional_field("max_pending_peers", cfg.limits.max_pending_peers);
  limits.optional_field("max_pending_peers_per_source", cfg.limits.max_pending_peers_per_source);

  const section tp(top.get_or_null("tp"), "tp", {"size", "rank"});
  tp.optional_field("size", cfg.tp.size);
  tp.optional_field("rank", cfg.tp.rank);

  const section pp(top.get_or_null("pp"), "pp", {"size", "rank"});
  pp.optional_field("size", cfg.pp.size);
  pp.optional_field("rank", cfg.pp.rank);

  const section dp(top.get_or_null("dp"), "dp", {"size", "rank"});
  dp.optional_field("size", cfg.dp.size);
  dp.optional_field("rank", cfg.dp.rank);

  const section runtime(top.get_or_null("runtime"), "runtime", {"workers"});
  runtime.optional_field("workers", cfg.runtime.workers);

  const section integrity(top.get_or_null("integrity"), "integrity", {"checksums"});
  integrity.optional_field("checksums", cfg.integrity.checksums);

  const section log(top.get_or_null("log"), "log",
                    {"level", "format", "levels", "summary_ms", "burst"});
  log.optional_field("level", cfg.log.level);
  log.optional_field("format", cfg.log.format);
  log.optional_field("summary_ms", cfg.log.summary_ms);
  log.optional_field("burst", cfg.log.burst);
  const section levels(log.get_or_null("levels"), "log.levels", logger_names);
  for (std::string_view name : logger_names) {
    std::optional<std::string> level;
    levels.optional_field(name, level);
    if (level) cfg.log.levels.emplace_back(name, *level);
  }

  // The catalogue fills the pools' layout fields the text leaves out, before they are read.
  if (cfg.catalogue) {
    YAML::Node tree = root;  // a handle: the pools below see what the catalogue wrote
    detail::apply_catalogue(cfg, tree);
  }
  const section pools(top.get_or_null("pools"), "pools", {"kv", "mamba", "aux"});
  if (auto kv = pools.find("kv")) cfg.pools.kv = parse_kv(*kv);
  if (auto mamba = pools.find("mamba")) cfg.pools.mamba = parse_mamba(*mamba);
  if (auto aux = pools.find("aux")) cfg.pools.aux = parse_aux(*aux);
  if (cfg.catalogue) detail::check_catalogue(cfg);
  return cfg;
}

}  // namespace

namespace detail {

result<ferry_config> parse_text(const std::string& text, const std::string& source,
                                const std::vector<config_override>& overrides) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::string what = source + ": YAML syntax error";
    if (!e.mark.is_null()) {
      what += " at line " + std::to_string(e.mark.line + 1) + ", column " +
              std::to_string(e.mark.column + 1);
    }
    return error{errc::config_invalid, what + ": " + e.msg};
  }
  try {
    apply_overrides(root, overrides);
    return parse_root(root);
  } catch (const config_failure& f) {
    return error{errc::config_invalid, f.what};
  } catch (const YAML::Exception& e) {
    // Not expected (every access is type-checked first), but never let yaml-cpp escape.
    return error{errc::config_invalid, source + ": " + e.msg};
  }
}

}  // namespace detail
}  // namespace ferry
