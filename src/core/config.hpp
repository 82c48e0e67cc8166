#pragma once
/// Ferry daemon configuration: the plain structs (config_types.hpp), a YAML parser, and a
/// separate pure validation step.
///
/// Contract: `parse_config_*` only turns YAML into structs (rejecting unknown keys and values of
/// the wrong type); `validate_config` checks meaning (ranges, consistency). Both report the first
/// problem as an error (`errc::config_invalid`) whose message names the full key path and the
/// value seen, e.g. `pools.kv.page_tokens: expected a positive integer, got 0`.

#include <optional>
#include <string>
#include <string_view>

#include "core/config_types.hpp"
#include "core/errors.hpp"

namespace ferry {

/// One `ferryd --set key=value`: a key path as the config's errors name it (`fabric.provider`,
/// `tp.rank`, `pools.mamba.tensors[1].slice_axis`) and a value in YAML (`shm`, `4`, `[0, 4]`).
struct config_override {
  std::string key, value;
};
/// "key=value" split at its first '='; an error naming the text when there is none, the key is
/// empty or a part of its path is (`tp..rank`).
result<config_override> parse_override(std::string_view text);

/// Parse YAML text into a config (structure and types only). Unknown keys are errors. Each
/// override replaces (or adds) its key in the YAML tree before the typed parse, so it meets the
/// same checks and error texts as the text's own keys (an unknown key: `tp.rnak: unknown key`).
result<ferry_config> parse_config_text(const std::string& yaml_text,
                                       const std::vector<config_override>& overrides = {});
/// Read and parse a YAML file, with overrides as parse_config_text; a missing or unreadable file
/// is an error naming the path.
result<ferry_config> parse_config_file(const std::string& path,
                                       const std::vector<config_override>& overrides = {});
/// Check meaning: ranges, consistency between sections, role needs.
result<> validate_config(const ferry_config& cfg);
/// False while a pool the engine's registration describes (`memory: client` and nothing else,
/// pool_placement::registered) has not been described yet.
bool described_yet(const pools_config& pools);
/// The first layout field in which pool `which` ("kv" or "mamba") of `pools` differs from what
/// cfg.catalogue generated, as "kv_heads: 4, the catalogue's 1"; none when equal, or when the
/// config has no catalogue or the catalogue no such pool.
std::optional<std::string> catalogue_difference(const ferry_config& cfg, const pools_config& pools,
                                                std::string_view which);
/// Parse then validate.
result<ferry_config> load_config_file(const std::string& path);
/// Fill values derived from others. Call after a successful validation. (It derives nothing
/// today: an unset pools.kv.total_heads stays 0, and to_yaml states what is assumed.)
void fill_derived(ferry_config& cfg);
/// Who reads an emitted config.
enum class yaml_for : uint8_t {
  /// `--check-config`, the log, clients: every key.
  self,
  /// A peer's hello (peer_hello::config_yaml): without the keys that only this daemon acts on
  /// and that a peer of an older protocol version would refuse as unknown (`fabric.rails`,
  /// `fabric.express_bytes`: a peer learns our rails from `peer_rails`).
  peers,
};
/// The effective config (with defaults filled in) as YAML.
std::string to_yaml(const ferry_config& cfg, yaml_for reader = yaml_for::self);

/// True for "host:port" with a port in 1..65535 (host a name, IPv4, or bracketed IPv6).
bool valid_host_port(std::string_view address);

}  // namespace ferry
