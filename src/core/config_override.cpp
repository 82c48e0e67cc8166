// `ferryd --set key=value`: each override is written into the parsed YAML tree before the typed
// parse (config_parse.cpp), so an overridden value meets exactly the checks, and gets exactly
// the error texts, of one written in the file; a key that does not exist is created and then
// refused by the parse as unknown, naming it.
#include <yaml-cpp/yaml.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.hpp"
#include "core/config_detail.hpp"

namespace ferry {

using detail::all_digits;
using detail::fail;

namespace {

/// One part of a key path: a map key, then the list indices after it (`tensors[1]`).
struct step {
  std::string key;
  std::vector<size_t> indices;
};

/// `fabric.provider`, `pools.mamba.tensors[1].shape` as steps; nothing when malformed.
std::optional<std::vector<step>> parse_path(std::string_view path) {
  std::vector<step> steps;
  size_t pos = 0;
  for (;;) {
    const size_t dot = path.find('.', pos);
    std::string_view part = path.substr(pos, dot == std::string_view::npos ? dot : dot - pos);
    step s;
    const size_t bracket = part.find('[');
    s.key = std::string(part.substr(0, bracket));
    if (s.key.empty() || s.key.find(']') != std::string::npos) return std::nullopt;
    for (size_t at = bracket; at != std::string_view::npos;) {
      const size_t close = part.find(']', at);
      if (part[at] != '[' || close == std::string_view::npos) return std::nullopt;
      const auto digits = part.substr(at + 1, close - at - 1);
      if (!all_digits(digits) || digits.size() > 9) return std::nullopt;
      s.indices.push_back(std::stoul(std::string(digits)));
      at = close + 1 == part.size() ? std::string_view::npos : close + 1;
    }
    steps.push_back(std::move(s));
    if (dot == std::string_view::npos) return steps;
    pos = dot + 1;
  }
}

const char* kind(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      return "a scalar";
    default:
      return "nothing";
  }
}

void apply(YAML::Node& root, const config_override& o) {
  const auto steps = parse_path(o.key);
  if (!steps)
    fail(o.key,
         "--set: not a key path (e.g. fabric.provider, tp.rank, "
         "pools.mamba.tensors[0].shape)");
  YAML::Node value;
  try {
    value = YAML::Load(o.value);
  } catch (const YAML::Exception& e) {
    fail(o.key, "--set value '" + o.value + "' is not YAML: " + e.msg);
  }
  YAML::Node at;
  at.reset(root);
  std::string path;
  for (const auto& s : *steps) {
    // As in a file: a key under something that is not a map makes it a map, which the typed
    // parse then names (`role: expected a string, got a map`).
    if (!at.IsMap()) at = YAML::Node(YAML::NodeType::Map);
    path += (path.empty() ? "" : ".") + s.key;
    YAML::Node next = at[s.key];
    at.reset(next);
    for (size_t i : s.indices) {
      if (!at.IsSequence())
        fail(path, "--set " + o.key + ": expected a list to take entry " + std::to_string(i) +
                       " of, got " + kind(at));
      if (i >= at.size())
        fail(path, "--set " + o.key + ": no entry " + std::to_string(i) + " in a list of " +
                       std::to_string(at.size()));
      path += "[" + std::to_string(i) + "]";
      YAML::Node entry = at[i];
      at.reset(entry);
    }
  }
  at = value;  // bound into the tree: replaces (or adds) the value there
}

}  // namespace

result<config_override> parse_override(std::string_view text) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0)
    return error{errc::config_invalid,
                 "--set '" + std::string(text) + "': expected key=value, e.g. fabric.provider=shm"};
  config_override o{std::string(text.substr(0, eq)), std::string(text.substr(eq + 1))};
  if (!parse_path(o.key))
    return error{errc::config_invalid, "--set '" + std::string(text) + "': '" + o.key +
                                           "' is not a key path (e.g. fabric.provider, tp.rank, "
                                           "pools.mamba.tensors[0].shape)"};
  return o;
}

namespace detail {

void apply_overrides(YAML::Node& root, const std::vector<config_override>& overrides) {
  if (overrides.empty()) return;
  // A document that is not a map is refused by the typed parse as it is.
  if (root.IsDefined() && !root.IsNull() && !root.IsMap()) return;
  if (!root.IsMap()) root = YAML::Node(YAML::NodeType::Map);
  for (const auto& o : overrides) apply(root, o);
}

}  // namespace detail
}  // namespace ferry
