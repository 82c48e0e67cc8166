#include "core/config.hpp"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <set>
#include <string_view>
#include <utility>

namespace ferry {

// ---------------------------------------------------------------------------------------------
// Size helpers
// ---------------------------------------------------------------------------------------------

uint64_t state_tensor_config::slot_bytes() const {
  uint64_t bytes = dtype_bytes;
  for (uint64_t dim : shape) bytes *= dim;
  return bytes;
}

uint64_t state_tensor_config::sliced_dim() const {
  // An out-of-range axis is a validation error; return 0 rather than read past the vector so
  // callers holding an unvalidated config cannot crash here.
  return slice_axis && *slice_axis < shape.size() ? shape[*slice_axis] : 0;
}

uint64_t state_tensor_config::outer_count() const {
  uint64_t count = 1;
  if (!slice_axis) return count;
  for (size_t i = 0; i < *slice_axis && i < shape.size(); ++i) count *= shape[i];
  return count;
}

uint64_t state_tensor_config::unit_bytes() const {
  uint64_t bytes = dtype_bytes;
  if (!slice_axis) return bytes;
  for (size_t i = *slice_axis + 1; i < shape.size(); ++i) bytes *= shape[i];
  return bytes;
}

uint64_t kv_pool_config::page_bytes() const {
  return uint64_t{page_tokens} * kv_heads * head_dim * dtype_bytes;
}

uint32_t kv_pool_config::buffer_count() const {
  const auto layers = static_cast<uint32_t>(layer_ids.size());
  return mla ? layers : 2 * layers;
}

const char* to_string(pool_memory m) { return m == pool_memory::client ? "client" : "daemon"; }

const char* to_string(node_role r) {
  switch (r) {
    case node_role::prefill:
      return "prefill";
    case node_role::decode:
      return "decode";
    case node_role::both:
      return "both";
  }
  return "both";
}

namespace {

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

/// Internal to this file: parsing and validation stop at the first problem, and unwinding out of
/// nested sections is simpler than threading optionals through every reader. Converted to a
/// `config_error` at each public entry point.
struct config_failure {
  std::string what;
};

[[noreturn]] void fail(const std::string& path, const std::string& expected_and_got) {
  throw config_failure{path + ": " + expected_and_got};
}

/// Largest total size of one pool: 1 TiB. Larger is almost certainly a unit mistake, and keeps
/// offset arithmetic elsewhere far from 64-bit overflow.
constexpr uint64_t max_pool_bytes = uint64_t{1} << 40;

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\x";
          out += hex[(c >> 4) & 0xf];
          out += hex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

bool is_name(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    const bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

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

void read(const YAML::Node& n, const std::string& path, std::string& out) {
  if (!n.IsScalar()) fail(path, "expected a string, got " + describe(n));
  out = n.Scalar();
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

node_role parse_role(const YAML::Node& n, const std::string& path) {
  std::string text;
  read(n, path, text);
  if (text == "prefill") return node_role::prefill;
  if (text == "decode") return node_role::decode;
  if (text == "both") return node_role::both;
  fail(path, "expected prefill, decode or both, got " + text);
}

kv_pool_config parse_kv(const YAML::Node& n) {
  const section s(n, "pools.kv",
                  {"layer_ids", "page_tokens", "kv_heads", "total_heads", "head_dim", "dtype_bytes",
                   "mla", "pages", "memory"});
  kv_pool_config kv;
  kv.memory = parse_memory(s, "pools.kv");
  s.required_field("layer_ids", kv.layer_ids);
  s.optional_field("page_tokens", kv.page_tokens);
  s.required_field("kv_heads", kv.kv_heads);
  s.optional_field("total_heads", kv.total_heads);
  s.required_field("head_dim", kv.head_dim);
  s.optional_field("dtype_bytes", kv.dtype_bytes);
  s.optional_field("mla", kv.mla);
  s.required_field("pages", kv.pages);
  return kv;
}

state_tensor_config parse_tensor(const YAML::Node& n, const std::string& path) {
  const section s(n, path, {"name", "shape", "dtype_bytes", "slice_axis", "shard_groups"});
  state_tensor_config t;
  s.required_field("name", t.name);
  s.required_field("shape", t.shape);
  s.required_field("dtype_bytes", t.dtype_bytes);
  s.optional_field("slice_axis", t.slice_axis);
  s.optional_field("shard_groups", t.shard_groups);
  return t;
}

mamba_pool_config parse_mamba(const YAML::Node& n) {
  const section s(n, "pools.mamba", {"slots", "layer_ids", "tensors", "memory"});
  mamba_pool_config mamba;
  mamba.memory = parse_memory(s, "pools.mamba");
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
  return mamba;
}

aux_pool_config parse_aux(const YAML::Node& n) {
  const section s(n, "pools.aux", {"rows", "row_bytes", "memory"});
  aux_pool_config aux;
  aux.memory = parse_memory(s, "pools.aux");
  s.required_field("rows", aux.rows);
  s.required_field("row_bytes", aux.row_bytes);
  return aux;
}

ferry_config parse_root(const YAML::Node& root) {
  ferry_config cfg;
  const section top(root, "",
                    {"node", "role", "listen", "fabric", "timeouts", "limits", "security", "tp",
                     "pp", "dp", "runtime", "log", "pools", "discovery"});

  const section node(top.get_or_null("node"), "node", {"name", "instance"});
  node.required_field("name", cfg.node_name);
  node.optional_field("instance", cfg.instance);

  if (auto role = top.find("role")) cfg.role = parse_role(*role, "role");

  const section discovery(top.get_or_null("discovery"), "discovery", {"instance_ranks"});
  discovery.optional_field("instance_ranks", cfg.instance_ranks);

  const section listen(top.get_or_null("listen"), "listen", {"control", "client"});
  listen.optional_field("control", cfg.control_listen);
  listen.required_field("client", cfg.client_listen);

  const section fabric(
      top.get_or_null("fabric"), "fabric",
      {"provider", "address", "max_inflight_writes", "write_piece_bytes", "staging_bytes"});
  fabric.optional_field("provider", cfg.fabric.provider);
  fabric.optional_field("address", cfg.fabric.address);
  fabric.optional_field("max_inflight_writes", cfg.fabric.max_inflight_writes);
  fabric.optional_field("write_piece_bytes", cfg.fabric.write_piece_bytes);
  fabric.optional_field("staging_bytes", cfg.fabric.staging_bytes);

  const section timeouts(
      top.get_or_null("timeouts"), "timeouts",
      {"handshake_ms", "bootstrapping_ms", "waiting_for_input_ms", "transferring_ms", "transfer_ms",
       "drain_ms", "heartbeat_ms", "heartbeat_misses"});
  timeouts.optional_field("handshake_ms", cfg.timeouts.handshake_ms);
  timeouts.optional_field("bootstrapping_ms", cfg.timeouts.bootstrapping_ms);
  timeouts.optional_field("waiting_for_input_ms", cfg.timeouts.waiting_for_input_ms);
  timeouts.optional_field("transferring_ms", cfg.timeouts.transferring_ms);
  timeouts.optional_field("transfer_ms", cfg.timeouts.transfer_ms);
  timeouts.optional_field("drain_ms", cfg.timeouts.drain_ms);
  timeouts.optional_field("heartbeat_ms", cfg.timeouts.heartbeat_ms);
  timeouts.optional_field("heartbeat_misses", cfg.timeouts.heartbeat_misses);

  const section security(top.get_or_null("security"), "security", {"cluster_secret_file"});
  security.optional_field("cluster_secret_file", cfg.security.cluster_secret_file);

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

  const section log(top.get_or_null("log"), "log", {"level"});
  log.optional_field("level", cfg.log.level);

  const section pools(top.get_or_null("pools"), "pools", {"kv", "mamba", "aux"});
  if (auto kv = pools.find("kv")) cfg.pools.kv = parse_kv(*kv);
  if (auto mamba = pools.find("mamba")) cfg.pools.mamba = parse_mamba(*mamba);
  if (auto aux = pools.find("aux")) cfg.pools.aux = parse_aux(*aux);
  return cfg;
}

config_result parse_text(const std::string& text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    std::string what = source + ": YAML syntax error";
    if (!e.mark.is_null()) {
      what += " at line " + std::to_string(e.mark.line + 1) + ", column " +
              std::to_string(e.mark.column + 1);
    }
    return {std::nullopt, config_error{what + ": " + e.msg}};
  }
  try {
    return {parse_root(root), std::nullopt};
  } catch (const config_failure& f) {
    return {std::nullopt, config_error{f.what}};
  } catch (const YAML::Exception& e) {
    // Not expected (every access is type-checked first), but never let yaml-cpp escape.
    return {std::nullopt, config_error{source + ": " + e.msg}};
  }
}

// ---------------------------------------------------------------------------------------------
// Validation: meaning, ranges, consistency
// ---------------------------------------------------------------------------------------------

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

void check_range(uint64_t v, uint64_t lo, uint64_t hi, const std::string& path) {
  if (v < lo || v > hi) {
    fail(path, "expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi) +
                   ", got " + std::to_string(v));
  }
}

void check_dtype(uint32_t v, const std::string& path) {
  if (v != 1 && v != 2 && v != 4 && v != 8) {
    fail(path, "expected 1, 2, 4 or 8, got " + std::to_string(v));
  }
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

void validate_tensor(const state_tensor_config& t, const std::string& path, uint32_t tp_size) {
  if (t.name.empty()) fail(path + ".name", "expected a non-empty name, got \"\"");
  if (t.shape.empty()) fail(path + ".shape", "expected a non-empty list, got []");
  for (size_t j = 0; j < t.shape.size(); ++j) {
    check_positive(t.shape[j], path + ".shape[" + std::to_string(j) + "]");
  }
  check_dtype(t.dtype_bytes, path + ".dtype_bytes");
  if (t.slice_axis && *t.slice_axis >= t.shape.size()) {
    const size_t dims = t.shape.size();
    fail(path + ".slice_axis", "expected an axis index below " + std::to_string(dims) +
                                   " (shape has " + std::to_string(dims) +
                                   (dims == 1 ? " dim" : " dims") + "), got " +
                                   std::to_string(*t.slice_axis));
  }
  if (!t.shard_groups.empty() && !t.slice_axis)
    fail(path + ".shard_groups", "expected slice_axis to be given with shard_groups");
  if (!t.shard_groups.empty()) {
    uint64_t sum = 0;
    for (size_t j = 0; j < t.shard_groups.size(); ++j) {
      check_positive(t.shard_groups[j], path + ".shard_groups[" + std::to_string(j) + "]");
      sum = sat_add(sum, t.shard_groups[j]);
    }
    for (size_t j = 0; j < t.shard_groups.size(); ++j)
      if (t.shard_groups[j] % tp_size != 0)
        fail(path + ".shard_groups[" + std::to_string(j) + "]",
             "expected a multiple of tp.size " + std::to_string(tp_size) +
                 " (each rank holds an equal share of every group), got " +
                 std::to_string(t.shard_groups[j]));
    // Groups are unsharded sizes while shape is per rank, so they must cover the sliced axis of
    // all ranks together.
    const uint64_t sliced = t.shape[*t.slice_axis];
    const uint64_t expected = sat_mul(sliced, tp_size);
    if (sum != expected) {
      fail(path + ".shard_groups",
           "expected entries summing to shape[" + std::to_string(*t.slice_axis) +
               "] x tp.size = " + std::to_string(sliced) + " x " + std::to_string(tp_size) + " = " +
               bytes_text(expected) + ", got a sum of " + bytes_text(sum));
    }
  }
}

void validate_pools(const ferry_config& cfg) {
  const pools_config& pools = cfg.pools;
  if (!pools.kv && !pools.mamba && !pools.aux) {
    fail("pools", std::string("expected at least one of kv, mamba or aux for role ") +
                      to_string(cfg.role) + ", got none");
  }

  if (pools.kv) {
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
    uint64_t page =
        sat_mul(sat_mul(kv.page_tokens, kv.kv_heads), sat_mul(kv.head_dim, kv.dtype_bytes));
    check_pool_total(sat_mul(sat_mul(page, kv.pages), kv.buffer_count()), "pools.kv");
  }

  if (pools.mamba) {
    const mamba_pool_config& mamba = *pools.mamba;
    check_positive(mamba.slots, "pools.mamba.slots");
    check_layer_ids(mamba.layer_ids, "pools.mamba.layer_ids");
    if (pools.kv) {
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
  }

  if (pools.aux) {
    const aux_pool_config& aux = *pools.aux;
    check_positive(aux.rows, "pools.aux.rows");
    if (aux.row_bytes < 64 || aux.row_bytes % 8 != 0) {
      fail("pools.aux.row_bytes",
           "expected a multiple of 8 that is at least 64, got " + std::to_string(aux.row_bytes));
    }
    check_pool_total(sat_mul(aux.rows, aux.row_bytes), "pools.aux");
  }
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
  check_range(cfg.fabric.write_piece_bytes, 4096, uint64_t{1} << 30, "fabric.write_piece_bytes");
  if (cfg.fabric.staging_bytes != 0)
    check_range(cfg.fabric.staging_bytes, 1 << 20, uint64_t{1} << 40, "fabric.staging_bytes");

  check_range(cfg.timeouts.handshake_ms, 1, 3600000, "timeouts.handshake_ms");
  check_range(cfg.timeouts.bootstrapping_ms, 1, 3600000, "timeouts.bootstrapping_ms");
  check_range(cfg.timeouts.waiting_for_input_ms, 1, 3600000, "timeouts.waiting_for_input_ms");
  check_range(cfg.timeouts.transferring_ms, 1, 3600000, "timeouts.transferring_ms");
  check_range(cfg.timeouts.transfer_ms, 1, 3600000, "timeouts.transfer_ms");
  check_range(cfg.timeouts.drain_ms, 1, 600000, "timeouts.drain_ms");
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

  const std::string& level = cfg.log.level;
  if (level != "trace" && level != "debug" && level != "info" && level != "warn" &&
      level != "error") {
    fail("log.level", "expected trace, debug, info, warn or error, got " + level);
  }

  validate_pools(cfg);
}

void emit_ids(YAML::Emitter& out, const std::vector<uint32_t>& ids) {
  out << YAML::Flow << YAML::BeginSeq;
  for (uint32_t id : ids) out << id;
  out << YAML::EndSeq;
}

void emit_dims(YAML::Emitter& out, const std::vector<uint64_t>& dims) {
  out << YAML::Flow << YAML::BeginSeq;
  for (uint64_t d : dims) out << d;
  out << YAML::EndSeq;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

bool valid_host_port(std::string_view address) { return is_host_port(address); }

void fill_derived(ferry_config&) {
  // Nothing is derived into the config itself any more: pools.kv.total_heads stays 0 when it was
  // not set (the effective config says what is assumed in a comment), so a peer's message about
  // it can say whether it was set.
}

config_result parse_config_text(const std::string& yaml_text) {
  return parse_text(yaml_text, "config");
}

config_result parse_config_file(const std::string& path) {
  // POSIX I/O rather than ifstream so the reported reason is the real errno (ENOENT, EACCES,
  // EISDIR on read of a directory).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return {std::nullopt,
            config_error{"cannot read config file '" + path + "': " + std::strerror(errno)}};
  }
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      return {std::nullopt,
              config_error{"cannot read config file '" + path + "': " + std::strerror(saved)}};
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return parse_text(text, path);
}

std::optional<config_error> validate_config(const ferry_config& cfg) {
  try {
    validate_all(cfg);
  } catch (const config_failure& f) {
    return config_error{f.what};
  }
  return std::nullopt;
}

config_result load_config_file(const std::string& path) {
  config_result result = parse_config_file(path);
  if (!result) return result;
  if (auto error = validate_config(*result.config)) return {std::nullopt, std::move(error)};
  return result;
}

std::string to_yaml(const ferry_config& cfg) {
  YAML::Emitter out;
  out << YAML::BeginMap;

  out << YAML::Key << "node" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << cfg.node_name;
  out << YAML::Key << "instance" << YAML::Value << cfg.instance;
  out << YAML::EndMap;

  out << YAML::Key << "role" << YAML::Value << to_string(cfg.role);
  if (!cfg.instance_ranks.empty()) {
    out << YAML::Key << "discovery" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "instance_ranks" << YAML::Value << YAML::Flow << cfg.instance_ranks;
    out << YAML::EndMap;
  }

  out << YAML::Key << "listen" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "control" << YAML::Value << cfg.control_listen;
  out << YAML::Key << "client" << YAML::Value << cfg.client_listen;
  out << YAML::EndMap;

  out << YAML::Key << "fabric" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "provider" << YAML::Value << cfg.fabric.provider;
  out << YAML::Key << "address" << YAML::Value << cfg.fabric.address;
  out << YAML::Key << "max_inflight_writes" << YAML::Value << cfg.fabric.max_inflight_writes;
  out << YAML::Key << "write_piece_bytes" << YAML::Value << cfg.fabric.write_piece_bytes;
  out << YAML::Key << "staging_bytes" << YAML::Value << cfg.fabric.staging_bytes;
  out << YAML::EndMap;

  out << YAML::Key << "timeouts" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "handshake_ms" << YAML::Value << cfg.timeouts.handshake_ms;
  out << YAML::Key << "bootstrapping_ms" << YAML::Value << cfg.timeouts.bootstrapping_ms;
  out << YAML::Key << "waiting_for_input_ms" << YAML::Value << cfg.timeouts.waiting_for_input_ms;
  out << YAML::Key << "transferring_ms" << YAML::Value << cfg.timeouts.transferring_ms;
  out << YAML::Key << "transfer_ms" << YAML::Value << cfg.timeouts.transfer_ms;
  out << YAML::Key << "drain_ms" << YAML::Value << cfg.timeouts.drain_ms;
  out << YAML::Key << "heartbeat_ms" << YAML::Value << cfg.timeouts.heartbeat_ms;
  out << YAML::Key << "heartbeat_misses" << YAML::Value << cfg.timeouts.heartbeat_misses;
  out << YAML::EndMap;

  if (!cfg.security.cluster_secret_file.empty()) {
    out << YAML::Key << "security" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "cluster_secret_file" << YAML::Value << cfg.security.cluster_secret_file;
    out << YAML::EndMap;
  }

  out << YAML::Key << "limits" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "max_active_rooms" << YAML::Value << cfg.limits.max_active_rooms;
  out << YAML::Key << "max_clients" << YAML::Value << cfg.limits.max_clients;
  out << YAML::Key << "client_frame_ms" << YAML::Value << cfg.limits.client_frame_ms;
  out << YAML::Key << "peer_preamble_ms" << YAML::Value << cfg.limits.peer_preamble_ms;
  out << YAML::Key << "max_pending_peers" << YAML::Value << cfg.limits.max_pending_peers;
  out << YAML::Key << "max_pending_peers_per_source" << YAML::Value
      << cfg.limits.max_pending_peers_per_source;
  out << YAML::EndMap;

  out << YAML::Key << "tp" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "size" << YAML::Value << cfg.tp.size;
  out << YAML::Key << "rank" << YAML::Value << cfg.tp.rank;
  out << YAML::EndMap;

  out << YAML::Key << "pp" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "size" << YAML::Value << cfg.pp.size;
  out << YAML::Key << "rank" << YAML::Value << cfg.pp.rank;
  out << YAML::EndMap;

  out << YAML::Key << "dp" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "size" << YAML::Value << cfg.dp.size;
  out << YAML::Key << "rank" << YAML::Value << cfg.dp.rank;
  out << YAML::EndMap;

  out << YAML::Key << "runtime" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "workers" << YAML::Value << cfg.runtime.workers;
  out << YAML::EndMap;

  out << YAML::Key << "log" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "level" << YAML::Value << cfg.log.level;
  out << YAML::EndMap;

  out << YAML::Key << "pools" << YAML::Value << YAML::BeginMap;
  if (cfg.pools.kv) {
    const kv_pool_config& kv = *cfg.pools.kv;
    out << YAML::Key << "kv" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "layer_ids" << YAML::Value;
    emit_ids(out, kv.layer_ids);
    out << YAML::Key << "page_tokens" << YAML::Value << kv.page_tokens;
    out << YAML::Key << "kv_heads" << YAML::Value << kv.kv_heads;
    if (kv.total_heads)
      out << YAML::Key << "total_heads" << YAML::Value << kv.total_heads;
    else if (!kv.mla)
      out << YAML::Comment("total_heads not set: kv_heads x tp.size = " +
                           std::to_string(kv.model_heads(cfg.tp.size)) + " assumed");
    out << YAML::Key << "head_dim" << YAML::Value << kv.head_dim;
    out << YAML::Key << "dtype_bytes" << YAML::Value << kv.dtype_bytes;
    out << YAML::Key << "mla" << YAML::Value << kv.mla;
    out << YAML::Key << "pages" << YAML::Value << kv.pages;
    if (kv.memory != pool_memory::daemon)
      out << YAML::Key << "memory" << YAML::Value << to_string(kv.memory);
    out << YAML::EndMap;
  }
  if (cfg.pools.mamba) {
    const mamba_pool_config& mamba = *cfg.pools.mamba;
    out << YAML::Key << "mamba" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "slots" << YAML::Value << mamba.slots;
    out << YAML::Key << "layer_ids" << YAML::Value;
    emit_ids(out, mamba.layer_ids);
    out << YAML::Key << "tensors" << YAML::Value << YAML::BeginSeq;
    for (const state_tensor_config& t : mamba.tensors) {
      out << YAML::BeginMap;
      out << YAML::Key << "name" << YAML::Value << t.name;
      out << YAML::Key << "shape" << YAML::Value;
      emit_dims(out, t.shape);
      out << YAML::Key << "dtype_bytes" << YAML::Value << t.dtype_bytes;
      if (t.slice_axis) out << YAML::Key << "slice_axis" << YAML::Value << *t.slice_axis;
      if (!t.shard_groups.empty()) {
        out << YAML::Key << "shard_groups" << YAML::Value;
        emit_dims(out, t.shard_groups);
      }
      out << YAML::EndMap;
    }
    out << YAML::EndSeq;
    if (mamba.memory != pool_memory::daemon)
      out << YAML::Key << "memory" << YAML::Value << to_string(mamba.memory);
    out << YAML::EndMap;
  }
  if (cfg.pools.aux) {
    out << YAML::Key << "aux" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "rows" << YAML::Value << cfg.pools.aux->rows;
    out << YAML::Key << "row_bytes" << YAML::Value << cfg.pools.aux->row_bytes;
    if (cfg.pools.aux->memory != pool_memory::daemon)
      out << YAML::Key << "memory" << YAML::Value << to_string(cfg.pools.aux->memory);
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ferry
