#pragma once
// Internal to src/core, not part of the config API (config.hpp is): what the files that read,
// check and write a config share, so that each step has a file of its own:
// - config.cpp: the struct helpers, the helpers declared here, the public entry points;
// - config_parse.cpp: YAML to structs, types only;
// - config_validate.cpp: meaning: ranges and consistency;
// - config_emit.cpp: structs to YAML (to_yaml);
// - config_override.cpp: `ferryd --set key=value` applied to the YAML tree.

#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"

namespace YAML {
class Node;
}

namespace ferry::detail {

/// Internal to the config sources: parsing and validation stop at the first problem, and unwinding
/// out of nested sections is simpler than threading optionals through every reader. It never leaves
/// them: each public entry point turns it into an error (`errc::config_invalid`).
struct config_failure {
  std::string what;
};

/// Throws the config_failure `path: expected_and_got`.
[[noreturn]] void fail(const std::string& path, const std::string& expected_and_got);

/// `s` in double quotes, with quotes, backslashes and control characters escaped.
std::string quote(std::string_view s);

/// Whether `s` is non-empty and only ASCII digits.
bool all_digits(std::string_view s);

/// config_parse.cpp: `text` as a config (types only), `source` naming it in errors, with
/// `overrides` applied to its YAML tree first.
result<ferry_config> parse_text(const std::string& text, const std::string& source,
                                const std::vector<config_override>& overrides = {});

/// config_override.cpp: each override written into `root` (a map, or null for an empty file),
/// creating the maps on its path; throws naming the key when its path cannot be followed.
void apply_overrides(YAML::Node& root, const std::vector<config_override>& overrides);

/// config_catalogue.cpp: looks up cfg.catalogue's model (tp and pp read), keeps the layouts it
/// generates there, fills model.architecture and model.fields, and writes into `root`'s pools
/// the layout fields their text leaves out; throws naming what is wrong.
void apply_catalogue(ferry_config& cfg, YAML::Node& root);
/// config_catalogue.cpp: throws at the first layout field the pools' text gives otherwise than
/// the catalogue.
void check_catalogue(const ferry_config& cfg);

/// config_validate.cpp: host:port, host being a name, an IPv4 address or a bracketed IPv6 address.
bool is_host_port(std::string_view s);

/// config_validate.cpp: every range and consistency rule; throws at the first problem.
void validate_all(const ferry_config& cfg);

}  // namespace ferry::detail
