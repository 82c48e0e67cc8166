#pragma once
/// The model catalogue: a model's KV and state layout at one TP/PP rank, from the model's own
/// `config.json` and the engine whose memory layout it follows (docs/configuration.md, Model
/// catalogue). config.json alone does not fix the layout: conv orientation, fused or separate
/// convs and the state dtypes are the engine's choices, so each entry is (architecture, engine).

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/config_types.hpp"
#include "core/errors.hpp"

namespace ferry {

struct catalogue_request {
  std::string config_text;  ///< the model's config.json
  std::string source;       ///< where it came from, for messages (its path)
  /// The engine convention: "sglang" or "vllm", optionally pinned to a revision of the
  /// catalogue's rules for it ("sglang@2026-12"); bare, the newest.
  std::string engine = "sglang";
  /// vLLM's conv state layout (its VLLM_SSM_CONV_STATE_LAYOUT): "SD" ([K-1, channels], vLLM's
  /// default) or "DS" ([channels, K-1]); empty: SD. Refused for SGLang, whose layout is fixed.
  std::string conv_layout;
  uint32_t tp_size = 1, tp_rank = 0;
  uint32_t pp_size = 1, pp_rank = 0;
  /// Overrides; empty: the model's dtype (KV; conv on vLLM) or the engine's default (state).
  std::string kv_dtype, conv_dtype, state_dtype;
};

/// The layout fields of the pools (sizes such as `pages` and `slots` stay the config's).
struct catalogue_layout {
  std::string architecture;  ///< config.json's architectures[0]
  std::string family;        ///< e.g. "Gated DeltaNet + attention (Qwen3-Next)"
  std::string convention;    ///< the engine convention used, with its revision: "sglang@2026-12"
  std::optional<kv_pool_config> kv;
  std::optional<mamba_pool_config> mamba;
  /// The config.json values the layout was built from (the state contract's `model.fields`).
  std::vector<std::pair<std::string, std::string>> fields;
};

/// The layout of `req`'s model at its rank; an unknown architecture, an engine the entry has
/// no convention for, a missing field or a TP size the heads cannot be split over is an error
/// that names it.
result<catalogue_layout> catalogue_lookup(const catalogue_request& req);

/// What the catalogue knows, for `ferryd --catalogue`: each architecture with its engines and
/// family, then each engine convention with its revision and where its rules were read.
std::string catalogue_listing();

/// Whether `architecture` runs attention and Mamba in the same layers (Falcon-H1's parallel
/// hybrid blocks), so a config's state layer ids may repeat its KV layer ids.
bool catalogue_shared_layers(const std::string& architecture);

}  // namespace ferry
