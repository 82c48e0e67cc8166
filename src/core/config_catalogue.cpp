// The model catalogue in the config: `model.config_json` (with `model.engine` and the dtype
// overrides) generates the pools' layout fields; the text may leave them out or repeat them, and
// a field it gives otherwise is an error naming both values (docs/configuration.md, Model
// catalogue).
#include <fmt/format.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "core/config.hpp"
#include "core/config_detail.hpp"
#include "core/model_catalogue.hpp"

namespace ferry {
namespace {

using detail::fail;

std::string ids_text(const std::vector<uint32_t>& ids) {
  return fmt::format("[{}]", fmt::join(ids, ", "));
}
std::string dims_text(const std::vector<uint64_t>& dims) {
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

/// The first layout field of a pool unlike the catalogue's: its name, its value, the catalogue's.
struct difference {
  std::string field, got, want;
};

template <class T>
std::optional<difference> differ(std::string field, const T& got, const T& want) {
  return difference{std::move(field), fmt::format("{}", got), fmt::format("{}", want)};
}

std::optional<difference> kv_difference(const kv_pool_config& want, const kv_pool_config& got) {
  if (got.layer_ids != want.layer_ids)
    return differ("layer_ids", ids_text(got.layer_ids), ids_text(want.layer_ids));
  if (got.mla != want.mla) return differ("mla", got.mla, want.mla);
  if (got.kv_heads != want.kv_heads) return differ("kv_heads", got.kv_heads, want.kv_heads);
  // A registration knows a head's bytes, not its dtype (SGLang's KVArgs give item sizes).
  if (got.head_dim * got.dtype_bytes != want.head_dim * want.dtype_bytes)
    return differ("head_dim x dtype_bytes", fmt::format("{} x {}", got.head_dim, got.dtype_bytes),
                  fmt::format("{} x {}", want.head_dim, want.dtype_bytes));
  if (!want.mla && got.total_heads != 0 && got.total_heads != want.total_heads)
    return differ("total_heads", got.total_heads, want.total_heads);
  return std::nullopt;
}

std::optional<difference> mamba_difference(const mamba_pool_config& want,
                                           const mamba_pool_config& got) {
  if (got.type != want.type)
    return differ("type", std::string(to_string(got.type)), std::string(to_string(want.type)));
  if (got.layer_ids != want.layer_ids)
    return differ("layer_ids", ids_text(got.layer_ids), ids_text(want.layer_ids));
  if (got.tensors.size() != want.tensors.size())
    return differ("tensors", fmt::format("{} tensors", got.tensors.size()),
                  fmt::format("{} tensors", want.tensors.size()));
  for (size_t i = 0; i < want.tensors.size(); ++i) {
    const auto& w = want.tensors[i];
    const auto& g = got.tensors[i];
    const std::string at = fmt::format("tensors[{}]", i);
    auto axis = [](const std::optional<uint32_t>& a) {
      return a ? std::to_string(*a) : std::string("none");
    };
    // Names are labels (a registration numbers its tensors): the layout is what must agree.
    // The same bytes in the same places: a registration describes what follows the sliced
    // axis in bytes (its KVArgs give item sizes), a config in elements of dtype_bytes.
    auto facts = [](const state_tensor_config& t) {
      return std::array<uint64_t, 4>{t.slot_bytes(), t.outer_count(), t.sliced_dim(),
                                     t.unit_bytes()};
    };
    const bool same_bytes =
        g.slice_axis.has_value() == w.slice_axis.has_value() &&
        (g.slice_axis ? facts(g) == facts(w) : g.slot_bytes() == w.slot_bytes());
    if (!same_bytes || (g.dtype_bytes == w.dtype_bytes && g.shape != w.shape))
      return differ(at + ".shape (" + w.name + ")",
                    fmt::format("{} of {} byte(s)", dims_text(g.shape), g.dtype_bytes),
                    fmt::format("{} of {} byte(s)", dims_text(w.shape), w.dtype_bytes));
    if (!g.dtype.empty() && g.dtype != w.dtype) return differ(at + ".dtype", g.dtype, w.dtype);
    if (g.dtype_bytes == w.dtype_bytes && g.slice_axis != w.slice_axis)
      return differ(at + ".slice_axis", axis(g.slice_axis), axis(w.slice_axis));
    if (g.shard_groups != w.shard_groups)
      return differ(at + ".shard_groups", dims_text(g.shard_groups), dims_text(w.shard_groups));
    if (g.shard_units != w.shard_units)
      return differ(at + ".shard_units", dims_text(g.shard_units), dims_text(w.shard_units));
  }
  return std::nullopt;
}

std::optional<difference> first_difference(const ferry_config& cfg, const pools_config& pools,
                                           std::string_view which) {
  if (!cfg.catalogue) return std::nullopt;
  // A pool its engine describes has no layout before its registration.
  if (which == "kv" && cfg.catalogue->kv && pools.kv && !pools.kv->layer_ids.empty())
    return kv_difference(*cfg.catalogue->kv, *pools.kv);
  if (which == "mamba" && cfg.catalogue->mamba && pools.mamba && !pools.mamba->tensors.empty())
    return mamba_difference(*cfg.catalogue->mamba, *pools.mamba);
  return std::nullopt;
}

/// What the catalogue said, for messages: "Qwen3NextForCausalLM (sglang) at TP 2 rank 0".
std::string provenance(const ferry_config& cfg) {
  return fmt::format("model.config_json's {} ({}) at TP {} rank {}",
                     cfg.model ? cfg.model->architecture : "?", cfg.catalogue->engine, cfg.tp.size,
                     cfg.tp.rank);
}

/// config.json files are kilobytes; a larger or special file (a FIFO, /dev/zero) is a mistake
/// that would otherwise hang or exhaust the daemon at start.
constexpr uint64_t max_config_json_bytes = 16u << 20;

std::string read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    fail("model.config_json",
         fmt::format("cannot read {}: {}", detail::quote(path), std::strerror(errno)));
  if (!S_ISREG(st.st_mode))
    fail("model.config_json", fmt::format("{} is not a regular file", detail::quote(path)));
  if (static_cast<uint64_t>(st.st_size) > max_config_json_bytes)
    fail("model.config_json", fmt::format("{} has {} bytes, more than a config.json's {}",
                                          detail::quote(path), st.st_size, max_config_json_bytes));
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("model.config_json", fmt::format("cannot read {}", detail::quote(path)));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

/// `text` as YAML, as the config's own text would give it (plain scalars: the typed readers
/// tell a number from a quoted string by that).
YAML::Node yaml(const std::string& text) { return YAML::Load(text); }

/// The YAML of `t`'s layout fields.
YAML::Node tensor_node(const state_tensor_config& t) {
  std::string text = fmt::format("{{name: {}, shape: {}, dtype_bytes: {}, dtype: {}", t.name,
                                 dims_text(t.shape), t.dtype_bytes, t.dtype);
  if (t.slice_axis) text += fmt::format(", slice_axis: {}", *t.slice_axis);
  if (!t.shard_groups.empty()) text += ", shard_groups: " + dims_text(t.shard_groups);
  if (!t.shard_units.empty()) text += ", shard_units: " + dims_text(t.shard_units);
  return yaml(text + "}");
}

/// A pool the engine's registration describes (`{memory: client}` alone): nothing is written
/// into it; its registration is checked instead (client_memory.cpp).
bool described_by_engine(const YAML::Node& pool) {
  return pool.IsMap() && pool.size() == 1 && pool["memory"] && pool["memory"].IsScalar() &&
         pool["memory"].Scalar() == "client";
}

}  // namespace

namespace detail {

void apply_catalogue(ferry_config& cfg, YAML::Node& root) {
  auto& cat = *cfg.catalogue;
  catalogue_request req;
  req.config_text = read_file(cat.config_json);
  req.source = cat.config_json;
  req.engine = cat.engine;
  req.conv_layout = cat.conv_layout;
  req.tp_size = std::max<uint32_t>(cfg.tp.size, 1);
  req.tp_rank = cfg.tp.rank;
  req.pp_size = std::max<uint32_t>(cfg.pp.size, 1);
  req.pp_rank = std::min(cfg.pp.rank, req.pp_size - 1);
  req.kv_dtype = cat.kv_dtype;
  req.conv_dtype = cat.conv_dtype;
  req.state_dtype = cat.state_dtype;
  auto found = catalogue_lookup(req);
  if (!found) fail("model.config_json", found.message);
  auto& layout = found.value;
  cat.family = layout.family;
  cat.convention = layout.convention;
  cat.kv = layout.kv;
  cat.mamba = layout.mamba;

  auto& model = *cfg.model;
  if (model.architecture.empty()) model.architecture = layout.architecture;
  if (model.architecture != layout.architecture)
    fail("model.architecture", fmt::format("{} written here, but {} says {}", model.architecture,
                                           cat.config_json, layout.architecture));
  for (const auto& field : layout.fields) {
    const std::string& key = field.first;
    const std::string& value = field.second;
    auto it = std::find_if(model.fields.begin(), model.fields.end(),
                           [&](const auto& f) { return f.first == key; });
    if (it == model.fields.end())
      model.fields.emplace_back(key, value);
    else if (it->second != value)
      fail("model.fields." + key,
           fmt::format("{} written here, but {} gives {}", it->second, cat.config_json, value));
  }
  std::sort(model.fields.begin(), model.fields.end());

  if (!root["pools"]) root["pools"] = YAML::Node(YAML::NodeType::Map);
  YAML::Node pools = root["pools"];
  if (layout.kv) {
    if (!pools["kv"])
      fail("pools.kv", fmt::format("expected a kv pool (at least its pages): {} has {} attention "
                                   "layer(s) at this rank",
                                   layout.architecture, layout.kv->layer_ids.size()));
    YAML::Node kv = pools["kv"];
    if (!described_by_engine(kv)) {
      const auto& g = *layout.kv;
      if (!kv["layer_ids"]) kv["layer_ids"] = yaml(ids_text(g.layer_ids));
      if (!kv["kv_heads"]) kv["kv_heads"] = yaml(std::to_string(g.kv_heads));
      if (!kv["head_dim"]) kv["head_dim"] = yaml(std::to_string(g.head_dim));
      if (!kv["dtype_bytes"]) kv["dtype_bytes"] = yaml(std::to_string(g.dtype_bytes));
      if (!kv["mla"]) kv["mla"] = yaml(g.mla ? "true" : "false");
      if (!kv["total_heads"] && !g.mla) kv["total_heads"] = yaml(std::to_string(g.total_heads));
    }
  } else if (pools["kv"]) {
    fail("pools.kv", fmt::format("{} has no attention layer at this rank (PP stage {} of {})",
                                 layout.architecture, cfg.pp.rank, cfg.pp.size));
  }
  if (layout.mamba) {
    if (!pools["mamba"])
      fail("pools.mamba",
           fmt::format("expected a state pool (at least its slots): {} has {} state layer(s) at "
                       "this rank",
                       layout.architecture, layout.mamba->layer_ids.size()));
    YAML::Node mamba = pools["mamba"];
    if (!described_by_engine(mamba)) {
      if (!mamba["layer_ids"]) mamba["layer_ids"] = yaml(ids_text(layout.mamba->layer_ids));
      if (!mamba["tensors"]) {
        YAML::Node tensors(YAML::NodeType::Sequence);
        for (const auto& t : layout.mamba->tensors) tensors.push_back(tensor_node(t));
        mamba["tensors"] = tensors;
      }
    }
  } else if (pools["mamba"]) {
    // A paged component (an MLA model's DSA indexer cache) is the text's own.
    const YAML::Node mamba = pools["mamba"];
    if (!mamba["type"] || mamba["type"].Scalar() == "mamba")
      fail("pools.mamba", fmt::format("{} has no recurrent state (a state pool of type mamba)",
                                      layout.architecture));
  }
}

void check_catalogue(const ferry_config& cfg) {
  for (const char* which : {"kv", "mamba"})
    if (auto d = first_difference(cfg, cfg.pools, which))
      fail(std::string("pools.") + which + "." + d->field,
           fmt::format("{} written here, but {} gives {}", d->got, provenance(cfg), d->want));
}

}  // namespace detail

std::optional<std::string> catalogue_difference(const ferry_config& cfg, const pools_config& pools,
                                                std::string_view which) {
  auto d = first_difference(cfg, pools, which);
  if (!d) return std::nullopt;
  return fmt::format("{} {}, but {} gives {}", d->field, d->got, provenance(cfg), d->want);
}

}  // namespace ferry
