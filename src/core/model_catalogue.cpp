// The model catalogue: per (architecture, engine), the rules that turn a config.json and a
// TP/PP rank into the pools' layout fields. Each rule says where its shapes come from; the
// engines' conventions are those of SGLang's python/sglang/srt/configs/mamba_utils.py and of
// vLLM's MambaStateShapeCalculator as read in December 2026 (docs/configuration.md).
#include "core/model_catalogue.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <memory>

#include "core/model_json.hpp"

namespace ferry {
namespace {

using namespace catalogue_detail;

/// What every rule is given.
struct rule_input {
  model_json& cfg;
  const catalogue_request& req;
  dtype_info model_dtype;  ///< the KV's dtype: model.kv_dtype, else config.json's torch_dtype
  catalogue_layout& out;
  std::string engine;        ///< the convention's engine, "sglang" or "vllm" (without its revision)
  dtype_info weights_dtype;  ///< config.json's torch_dtype (else model.kv_dtype): vLLM's state
  /// SGLang passes config.json's mamba_ssm_dtype to the state of this family (Qwen3-Next,
  /// Nemotron-H, Jamba), or builds it without (Falcon-H1, Granite, Kimi-Linear: fp32).
  bool reads_ssm_dtype = true;
  /// vLLM sets this family's temporal dtype from config.json's mamba_ssm_cache_dtype, float32
  /// when absent (Nemotron-H: NemotronHForCausalLMConfig, since vLLM PR #39032); otherwise its
  /// temporal state takes the conv state's dtype.
  bool vllm_reads_ssm_cache_dtype = false;
};

/// Layers [first, end) of PP stage `rank` of `size` over `layers`: SGLang's and vLLM's
/// get_pp_indices (an even split; the remainder goes one layer each to the stages before the
/// last).
std::pair<uint32_t, uint32_t> pp_layers(uint32_t layers, uint32_t size, uint32_t rank) {
  std::vector<uint32_t> parts(size, layers / size);
  for (uint32_t i = 2; i < layers % size + 2; ++i) ++parts[size - i];
  uint32_t first = 0;
  for (uint32_t i = 0; i < rank; ++i) first += parts[i];
  return {first, first + parts[rank]};
}

/// Of `ids` (global layer ids), those of this PP stage.
std::vector<uint32_t> stage_ids(const std::vector<uint32_t>& ids, uint32_t layers,
                                const catalogue_request& req) {
  const auto [first, end] = pp_layers(layers, req.pp_size, req.pp_rank);
  std::vector<uint32_t> out;
  for (uint32_t id : ids)
    if (id >= first && id < end) out.push_back(id);
  return out;
}

/// `total` heads of a kind over TP: sliced evenly, or (`may_replicate`: KV heads) one per rank
/// when TP is a multiple of them.
uint64_t per_rank(uint64_t total, uint32_t tp, const std::string& what, bool may_replicate) {
  if (total % tp == 0) return total / tp;
  if (may_replicate && tp % total == 0) return 1;
  fail(fmt::format("{} {} cannot be split over TP {}: {}", what, total, tp,
                   may_replicate ? "neither divides the other" : "TP must divide them"));
}

/// A GQA KV pool (heads replicated when TP exceeds them).
kv_pool_config gqa_kv(rule_input& in, std::vector<uint32_t> ids, uint64_t kv_heads,
                      uint64_t head_dim) {
  kv_pool_config kv;
  kv.layer_ids = std::move(ids);
  kv.kv_heads =
      static_cast<uint32_t>(per_rank(kv_heads, in.req.tp_size, "num_key_value_heads", true));
  kv.total_heads = static_cast<uint32_t>(kv_heads);
  kv.head_dim = static_cast<uint32_t>(head_dim);
  kv.dtype_bytes = in.model_dtype.bytes;
  return kv;
}

/// An MLA KV pool: one latent vector per token, the same on every TP rank.
kv_pool_config mla_kv(rule_input& in, std::vector<uint32_t> ids) {
  kv_pool_config kv;
  kv.layer_ids = std::move(ids);
  kv.kv_heads = 1;
  kv.head_dim =
      static_cast<uint32_t>(in.cfg.count("kv_lora_rank") + in.cfg.count("qk_rope_head_dim"));
  kv.dtype_bytes = in.model_dtype.bytes;
  kv.mla = true;
  return kv;
}

state_tensor_config tensor(std::string name, std::vector<uint64_t> shape, const dtype_info& t,
                           uint32_t slice_axis, std::vector<uint64_t> groups = {},
                           std::vector<uint64_t> units = {}) {
  state_tensor_config s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.dtype_bytes = t.bytes;
  s.dtype = t.name;
  s.slice_axis = slice_axis;
  s.shard_groups = std::move(groups);
  s.shard_units = std::move(units);
  return s;
}

bool vllm(const rule_input& in) { return in.engine == "vllm"; }

/// The conv state's dtype: SGLang keeps bf16 (SGLANG_MAMBA_CONV_DTYPE), vLLM the model's
/// weights' (its --dtype, not --kv-cache-dtype: an fp8 KV cache leaves the state alone).
dtype_info conv_dtype(const rule_input& in) {
  if (!in.req.conv_dtype.empty()) return dtype_of(in.req.conv_dtype, "model.conv_dtype");
  return vllm(in) ? in.weights_dtype : dtype_info{"bf16", 2};
}

/// The temporal (SSM) state's dtype: fp32 on SGLang unless config.json's mamba_ssm_dtype says
/// otherwise (for the families whose config SGLang passes it); on vLLM the conv state's, or
/// for Nemotron-H config.json's mamba_ssm_cache_dtype (float32 when absent).
dtype_info state_dtype(rule_input& in) {
  if (!in.req.state_dtype.empty()) return dtype_of(in.req.state_dtype, "model.state_dtype");
  if (vllm(in) && in.vllm_reads_ssm_cache_dtype)
    return in.cfg.has("mamba_ssm_cache_dtype")
               ? dtype_of(in.cfg.text("mamba_ssm_cache_dtype"),
                          in.cfg.source() + ": mamba_ssm_cache_dtype")
               : dtype_info{"fp32", 4};
  if (vllm(in)) return conv_dtype(in);
  if (in.reads_ssm_dtype && in.cfg.has("mamba_ssm_dtype"))
    return dtype_of(in.cfg.text("mamba_ssm_dtype"), in.cfg.source() + ": mamba_ssm_dtype");
  return {"fp32", 4};
}

/// A Mamba2 layer's state: conv over [x | B | C] (intermediate, then n_groups x state twice)
/// and temporal [heads, head_dim, state]. With n_groups below TP the engines give every rank
/// whole B and C groups (TP / n_groups ranks hold each): shard_units keep a group unsplit.
mamba_pool_config mamba2_state(rule_input& in, std::vector<uint32_t> ids, uint64_t heads,
                               uint64_t head_dim, uint64_t groups, uint64_t state, uint64_t kernel,
                               uint64_t intermediate) {
  const uint32_t tp = in.req.tp_size;
  per_rank(heads, tp, "Mamba2 heads", false);
  if (intermediate % heads != 0)
    fail(fmt::format("{}: the Mamba2 intermediate size {} is not a multiple of its {} heads",
                     in.cfg.source(), intermediate, heads));
  const uint64_t rank_groups = per_rank(groups, tp, "Mamba2 n_groups", true);
  const uint64_t conv_dim = intermediate / tp + 2 * rank_groups * state;
  mamba_pool_config m;
  m.layer_ids = std::move(ids);
  const auto conv_t = conv_dtype(in);
  std::vector<uint64_t> shard{intermediate, groups * state, groups * state};
  std::vector<uint64_t> units{heads, groups, groups};
  if (vllm(in) && in.req.conv_layout != "DS")  // vLLM's default SD: [K-1, channels]
    m.tensors.push_back(tensor("conv", {kernel - 1, conv_dim}, conv_t, 1, shard, units));
  else
    m.tensors.push_back(tensor("conv", {conv_dim, kernel - 1}, conv_t, 0, shard, units));
  m.tensors.push_back(tensor("temporal", {heads / tp, head_dim, state}, state_dtype(in), 0));
  return m;
}

// ---- the families ------------------------------------------------------------------------

/// Qwen3-Next: full attention every full_attention_interval-th layer (or as layer_types says),
/// Gated DeltaNet elsewhere. SGLang: conv [2 key_dim + value_dim, K-1] with q, k and v sliced
/// each on its own; temporal [v_heads, v_dim, k_dim] in fp32.
void qwen3_next(rule_input& in) {
  auto& c = in.cfg;
  const auto layers = static_cast<uint32_t>(c.count("num_hidden_layers"));
  const uint64_t interval = c.count("full_attention_interval");
  std::vector<uint32_t> attn, linear;
  for (uint32_t i = 0; i < layers; ++i) ((i + 1) % interval == 0 ? attn : linear).push_back(i);
  in.out.kv = gqa_kv(in, stage_ids(attn, layers, in.req), c.count("num_key_value_heads"),
                     c.count("head_dim"));
  const uint64_t nk = c.count("linear_num_key_heads"), nv = c.count("linear_num_value_heads");
  const uint64_t dk = c.count("linear_key_head_dim"), dv = c.count("linear_value_head_dim");
  const uint64_t kernel = c.count("linear_conv_kernel_dim");
  const uint32_t tp = in.req.tp_size;
  per_rank(nk, tp, "linear_num_key_heads", false);
  per_rank(nv, tp, "linear_num_value_heads", false);
  const uint64_t key_dim = nk * dk, value_dim = nv * dv;
  mamba_pool_config m;
  m.layer_ids = stage_ids(linear, layers, in.req);
  m.tensors.push_back(tensor("conv", {(2 * key_dim + value_dim) / tp, kernel - 1}, conv_dtype(in),
                             0, {key_dim, key_dim, value_dim}));
  // SGLang and vLLM build it as Mamba2's [heads, head_dim, state] with the value heads, the
  // value dim as head_dim and the key dim as state: [v_heads, v_dim, k_dim].
  m.tensors.push_back(tensor("temporal", {nv / tp, dv, dk}, state_dtype(in), 0));
  in.out.mamba = std::move(m);
}

/// Kimi-Linear: KDA layers and MLA layers, both numbered from 1 in linear_attn_config. SGLang
/// fuses the q, k and v short convs into one [K-1, q + k + v] conv (sliced on its second axis,
/// each block on its own); temporal [heads, head_dim, head_dim] in fp32.
void kimi_linear(rule_input& in) {
  auto& c = in.cfg;
  const auto layers = static_cast<uint32_t>(c.count("num_hidden_layers"));
  std::vector<uint32_t> attn, kda;
  uint64_t heads = 0, head_dim = 0, kernel = 0;
  {
    auto lin = c.object("linear_attn_config");
    auto ids = [&](const char* key, std::vector<uint32_t>& into) {
      for (const auto& v : lin.list(key)) {
        if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > layers)
          fail(fmt::format("{}: {} must list layers 1..{} (numbered from 1), got {}", lin.source(),
                           key, layers, v.dump()));
        into.push_back(v.get<uint32_t>() - 1);
      }
    };
    ids("kda_layers", kda);
    // As SGLang: every layer that is not KDA is an MLA attention layer (full_attn_layers, which
    // lists them too, is not read).
    for (uint32_t i = 0; i < layers; ++i)
      if (std::find(kda.begin(), kda.end(), i) == kda.end()) attn.push_back(i);
    heads = lin.count("num_heads");
    head_dim = lin.count("head_dim");
    kernel = lin.count("short_conv_kernel_size");
  }
  in.out.kv = mla_kv(in, stage_ids(attn, layers, in.req));
  const uint32_t tp = in.req.tp_size;
  per_rank(heads, tp, "KDA num_heads", false);
  const uint64_t proj = heads * head_dim;
  mamba_pool_config m;
  m.layer_ids = stage_ids(kda, layers, in.req);
  m.tensors.push_back(
      tensor("conv", {kernel - 1, 3 * proj / tp}, conv_dtype(in), 1, {proj, proj, proj}));
  in.reads_ssm_dtype = false;
  m.tensors.push_back(tensor("temporal", {heads / tp, head_dim, head_dim}, state_dtype(in), 0));
  in.out.mamba = std::move(m);
}

/// The attention head size where a config may give it under several names.
uint64_t attention_head_dim(model_json& c) {
  if (c.has("head_dim")) return c.count("head_dim");
  if (c.has("attention_head_dim")) return c.count("attention_head_dim");
  const uint64_t hidden = c.count("hidden_size"), heads = c.count("num_attention_heads");
  if (hidden % heads != 0)
    fail(fmt::format("{}: hidden_size {} is not a multiple of num_attention_heads {}", c.source(),
                     hidden, heads));
  return hidden / heads;
}

/// Nemotron-H: layers_block_type names each layer "mamba", "attention", "mlp" or "moe" (what
/// SGLang reads first); older configs give hybrid_override_pattern, a character per layer: M for
/// Mamba2, * for attention, - for an MLP, E for an MoE.
void nemotron_h(rule_input& in) {
  auto& c = in.cfg;
  in.vllm_reads_ssm_cache_dtype = true;
  std::vector<std::string> kinds;
  if (c.has("layers_block_type")) {
    for (const auto& v : c.list("layers_block_type"))
      kinds.push_back(v.is_string() ? v.get<std::string>() : v.dump());
  } else {
    for (char ch : c.text("hybrid_override_pattern"))
      kinds.push_back(ch == 'M'   ? "mamba"
                      : ch == '*' ? "attention"
                      : ch == '-' ? "mlp"
                      : ch == 'E' ? "moe"
                                  : std::string(1, ch));
  }
  const auto layers = static_cast<uint32_t>(kinds.size());
  std::vector<uint32_t> attn, mamba;
  for (uint32_t i = 0; i < layers; ++i) {
    if (kinds[i] == "attention")
      attn.push_back(i);
    else if (kinds[i] == "mamba")
      mamba.push_back(i);
    else if (kinds[i] != "mlp" && kinds[i] != "moe")
      fail(
          fmt::format("{}: layer {} is \"{}\" (expected mamba, attention, mlp or moe; in "
                      "hybrid_override_pattern M, *, - or E)",
                      c.source(), i, kinds[i]));
  }
  in.out.kv = gqa_kv(in, stage_ids(attn, layers, in.req), c.count("num_key_value_heads"),
                     attention_head_dim(c));
  const uint64_t heads = c.count("mamba_num_heads"), head_dim = c.count("mamba_head_dim");
  in.out.mamba =
      mamba2_state(in, stage_ids(mamba, layers, in.req), heads, head_dim, c.count("n_groups"),
                   c.count("ssm_state_size"), c.count("conv_kernel"), heads * head_dim);
}

/// Falcon-H1: every layer runs attention and a Mamba2 mixer side by side.
void falcon_h1(rule_input& in) {
  auto& c = in.cfg;
  const auto layers = static_cast<uint32_t>(c.count("num_hidden_layers"));
  std::vector<uint32_t> all(layers);
  for (uint32_t i = 0; i < layers; ++i) all[i] = i;
  in.out.kv = gqa_kv(in, stage_ids(all, layers, in.req), c.count("num_key_value_heads"),
                     attention_head_dim(c));
  const uint64_t heads = c.count("mamba_n_heads"), head_dim = c.count("mamba_d_head");
  const uint64_t intermediate = c.has("mamba_d_ssm")
                                    ? c.count("mamba_d_ssm")
                                    : c.count("mamba_expand") * c.count("hidden_size");
  in.reads_ssm_dtype = false;
  in.out.mamba =
      mamba2_state(in, stage_ids(all, layers, in.req), heads, head_dim, c.count("mamba_n_groups"),
                   c.count("mamba_d_state"), c.count("mamba_d_conv"), intermediate);
}

/// Granite-4.0-H: layer_types names each layer "mamba" or "attention".
void granite_hybrid(rule_input& in) {
  auto& c = in.cfg;
  const auto& types = c.list("layer_types");
  const auto layers = static_cast<uint32_t>(types.size());
  std::vector<uint32_t> attn, mamba;
  for (uint32_t i = 0; i < layers; ++i) {
    const std::string t = types[i].is_string() ? types[i].get<std::string>() : types[i].dump();
    if (t == "attention")
      attn.push_back(i);
    else if (t == "mamba")
      mamba.push_back(i);
    else
      fail(fmt::format("{}: layer_types[{}] is \"{}\" (expected mamba or attention)", c.source(), i,
                       t));
  }
  in.out.kv = gqa_kv(in, stage_ids(attn, layers, in.req), c.count("num_key_value_heads"),
                     attention_head_dim(c));
  const uint64_t heads = c.count("mamba_n_heads");
  const uint64_t head_dim = c.has("mamba_d_head")
                                ? c.count("mamba_d_head")
                                : c.count("mamba_expand") * c.count("hidden_size") / heads;
  in.reads_ssm_dtype = false;
  in.out.mamba =
      mamba2_state(in, stage_ids(mamba, layers, in.req), heads, head_dim, c.count("mamba_n_groups"),
                   c.count("mamba_d_state"), c.count("mamba_d_conv"), heads * head_dim);
}

/// Jamba: attention where (layer - attn_layer_offset) % attn_layer_period == 0, Mamba1
/// elsewhere.
/// Mamba1's state: conv [intermediate, K-1] (vLLM's default SD: [K-1, intermediate]) and
/// temporal [intermediate, state], both sliced on the channels. SGLang's rule is that of its
/// Jamba pull request (#20141, not merged upstream as of 2026-12); vLLM's is its jamba.py.
void jamba(rule_input& in) {
  auto& c = in.cfg;
  const auto layers = static_cast<uint32_t>(c.count("num_hidden_layers"));
  const uint64_t period = c.count("attn_layer_period");
  const uint64_t offset = c.has("attn_layer_offset") ? c.count("attn_layer_offset", true) : 0;
  std::vector<uint32_t> attn, mamba;
  for (uint32_t i = 0; i < layers; ++i) (i % period == offset % period ? attn : mamba).push_back(i);
  in.out.kv = gqa_kv(in, stage_ids(attn, layers, in.req), c.count("num_key_value_heads"),
                     attention_head_dim(c));
  const uint64_t intermediate = c.count("mamba_expand") * c.count("hidden_size");
  const uint32_t tp = in.req.tp_size;
  per_rank(intermediate, tp, "Mamba1 intermediate size", false);
  mamba_pool_config m;
  m.layer_ids = stage_ids(mamba, layers, in.req);
  const uint64_t kernel = c.count("mamba_d_conv");
  if (vllm(in) && in.req.conv_layout != "DS")  // vLLM's default SD: [K-1, channels]
    m.tensors.push_back(tensor("conv", {kernel - 1, intermediate / tp}, conv_dtype(in), 1));
  else
    m.tensors.push_back(tensor("conv", {intermediate / tp, kernel - 1}, conv_dtype(in), 0));
  m.tensors.push_back(
      tensor("temporal", {intermediate / tp, c.count("mamba_d_state")}, state_dtype(in), 0));
  in.out.mamba = std::move(m);
}

/// MiniMax-Text-01: attn_type_list has 1 for softmax attention, 0 for lightning attention,
/// whose state is one [heads, head_dim, head_dim] fp32 matrix per layer (vLLM's convention).
void minimax_text_01(rule_input& in) {
  auto& c = in.cfg;
  const auto& types = c.list("attn_type_list");
  const auto layers = static_cast<uint32_t>(types.size());
  std::vector<uint32_t> attn, linear;
  for (uint32_t i = 0; i < layers; ++i) {
    if (!types[i].is_number_integer() || (types[i] != 0 && types[i] != 1))
      fail(fmt::format("{}: attn_type_list[{}] is {} (expected 0 or 1)", c.source(), i,
                       types[i].dump()));
    (types[i] == 1 ? attn : linear).push_back(i);
  }
  const uint64_t head_dim = attention_head_dim(c);
  in.out.kv = gqa_kv(in, stage_ids(attn, layers, in.req), c.count("num_key_value_heads"), head_dim);
  const uint64_t heads = c.count("num_attention_heads");
  per_rank(heads, in.req.tp_size, "num_attention_heads", false);
  mamba_pool_config m;
  m.layer_ids = stage_ids(linear, layers, in.req);
  m.tensors.push_back(
      tensor("temporal", {heads / in.req.tp_size, head_dim, head_dim}, state_dtype(in), 0));
  in.out.mamba = std::move(m);
}

/// DeepSeek-V2/V3 (MLA): every layer's KV is one kv_lora_rank + qk_rope_head_dim latent.
void deepseek_mla(rule_input& in) {
  const auto layers = static_cast<uint32_t>(in.cfg.count("num_hidden_layers"));
  std::vector<uint32_t> all(layers);
  for (uint32_t i = 0; i < layers; ++i) all[i] = i;
  in.out.kv = mla_kv(in, stage_ids(all, layers, in.req));
}

/// An engine convention: the engine, a revision of the catalogue's rules for it (when they were
/// read from its source), and where they were read. A later revision is added beside the
/// earlier ones when an engine changes its layout, so a config that pins one keeps its layout.
/// The state contract names an engine's first revision by the engine alone ("sglang", as
/// daemons before revisions did, so they still pair) and a later one with it.
struct convention {
  const char* engine;
  const char* revision;
  const char* source;
  bool first = false;  ///< the engine's first catalogued revision
};

const std::vector<convention>& conventions() {
  static const std::vector<convention> all = {
      {"sglang", "2026-12",
       "SGLang python/sglang/srt/configs/mamba_utils.py and the models' state shapes", true},
      {"vllm", "2026-12",
       "vLLM vllm/model_executor/layers/mamba/mamba_utils.py (MambaStateShapeCalculator, "
       "MambaStateDtypeCalculator, get_conv_state_layout)",
       true},
  };
  return all;
}

/// The convention `spec` ("sglang", "vllm@2026-12") names: the newest revision of its engine
/// when it names none.
const convention& convention_of(const std::string& spec) {
  const auto at = spec.find('@');
  const std::string name = spec.substr(0, at);
  const std::string revision = at == std::string::npos ? "" : spec.substr(at + 1);
  const bool pinned = at != std::string::npos;
  const convention* found = nullptr;
  std::string revisions;
  for (const auto& c : conventions()) {
    if (name != c.engine) continue;
    revisions += (revisions.empty() ? "" : ", ") + std::string(c.revision);
    if (!pinned || revision == c.revision) found = &c;
  }
  if (revisions.empty())
    fail(
        fmt::format("model.engine: expected sglang or vllm (optionally with the revision of its "
                    "convention, e.g. sglang@2026-12), got \"{}\"",
                    spec));
  if (found == nullptr)
    fail(
        fmt::format("model.engine: {} is not a catalogued convention: the catalogue has {} as "
                    "of {}. An engine whose layout differs from those: describe its pools by "
                    "hand, or let its registration describe them",
                    spec, name, revisions));
  return *found;
}

/// One catalogue entry: the architecture, the engines it has a convention for ("sglang,
/// vllm"), what it is, and the rule that builds its layout.
struct family {
  struct {
    const char* architecture;
    const char* engines;
    const char* family;
  } entry;
  void (*rule)(rule_input&);
};

const std::vector<family>& families() {
  static const std::vector<family> all = {
      {{"Qwen3NextForCausalLM", "sglang", "Gated DeltaNet + attention (Qwen3-Next)"}, qwen3_next},
      {{"KimiLinearForCausalLM", "sglang", "KDA + MLA (Kimi-Linear)"}, kimi_linear},
      {{"NemotronHForCausalLM", "sglang, vllm", "Mamba2 + attention (Nemotron-H)"}, nemotron_h},
      {{"FalconH1ForCausalLM", "sglang, vllm",
        "Mamba2 beside attention in every layer (Falcon-H1)"},
       falcon_h1},
      {{"GraniteMoeHybridForCausalLM", "sglang, vllm", "Mamba2 + attention (Granite-4.0-H)"},
       granite_hybrid},
      {{"JambaForCausalLM", "sglang, vllm", "Mamba1 + attention (Jamba)"}, jamba},
      {{"MiniMaxText01ForCausalLM", "vllm", "lightning attention + attention (MiniMax-Text-01)"},
       minimax_text_01},
      {{"DeepseekV3ForCausalLM", "sglang, vllm", "MLA (DeepSeek-V3)"}, deepseek_mla},
      {{"DeepseekV2ForCausalLM", "sglang, vllm", "MLA (DeepSeek-V2)"}, deepseek_mla},
  };
  return all;
}

std::string known_architectures() {
  std::string out;
  for (const auto& f : families())
    out += (out.empty() ? "" : ", ") + std::string(f.entry.architecture);
  return out;
}

}  // namespace

std::string catalogue_listing() {
  std::string out = "Architectures (config.json's architectures[0]), their engines and family:\n";
  for (const auto& f : families())
    out +=
        fmt::format("  {:<28} {:<13} {}\n", f.entry.architecture, f.entry.engines, f.entry.family);
  out +=
      "Engine conventions (model.engine: NAME, or NAME@REVISION to pin one; bare: the "
      "newest):\n";
  for (const auto& c : conventions())
    out += fmt::format("  {}@{}  read from {}\n", c.engine, c.revision, c.source);
  out +=
      "vLLM's conv state layout: model.conv_layout SD ([K-1, channels], its default) or DS "
      "([channels, K-1]), as its VLLM_SSM_CONV_STATE_LAYOUT\n";
  return out;
}

bool catalogue_shared_layers(const std::string& architecture) {
  return architecture == "FalconH1ForCausalLM";
}

result<catalogue_layout> catalogue_lookup(const catalogue_request& req) {
  try {
    json j;
    try {
      j = json::parse(req.config_text);
    } catch (const json::parse_error& e) {
      fail(fmt::format("{} is not valid JSON: {}", req.source, e.what()));
    }
    if (!j.is_object()) fail(fmt::format("{} is not a JSON object", req.source));
    // A multimodal wrapper keeps the language model's fields in text_config.
    const json& root = j.contains("text_config") && j["text_config"].is_object() &&
                               !j.contains("num_hidden_layers")
                           ? j["text_config"]
                           : j;
    if (!j.contains("architectures") || !j["architectures"].is_array() ||
        j["architectures"].empty() || !j["architectures"][0].is_string())
      fail(fmt::format("{} has no architectures list (e.g. [\"Qwen3NextForCausalLM\"])",
                       req.source));
    const std::string arch = j["architectures"][0].get<std::string>();
    const family* found = nullptr;
    for (const auto& f : families())
      if (arch == f.entry.architecture) found = &f;
    if (found == nullptr)
      fail(
          fmt::format("architecture {} is not in the catalogue (it knows {}); describe its pools "
                      "by hand in pools.kv and pools.mamba, without model.config_json",
                      arch, known_architectures()));
    const convention& conv = convention_of(req.engine);
    const std::string engine = conv.engine;
    if (!req.conv_layout.empty() && engine != "vllm")
      fail(
          fmt::format("model.conv_layout: only vLLM chooses its conv state layout "
                      "(VLLM_SSM_CONV_STATE_LAYOUT); {}'s is fixed per family",
                      engine));
    if (!req.conv_layout.empty() && req.conv_layout != "SD" && req.conv_layout != "DS")
      fail(
          fmt::format("model.conv_layout: expected SD ([K-1, channels], vLLM's default) or DS "
                      "([channels, K-1]), as VLLM_SSM_CONV_STATE_LAYOUT says, got \"{}\"",
                      req.conv_layout));
    if (std::string(found->entry.engines).find(engine) == std::string::npos)
      fail(fmt::format("the catalogue has no {} layout for {} (it has: {}){}", engine, arch,
                       found->entry.engines,
                       arch == "MiniMaxText01ForCausalLM"
                           ? ": SGLang has no transfer path for lightning attention state"
                           : ""));

    catalogue_layout out;
    out.architecture = arch;
    out.family = found->entry.family;
    out.convention = fmt::format("{}@{}", conv.engine, conv.revision);
    model_json cfg(root, req.source, arch);
    // The KV's dtype: model.kv_dtype, else the weights'. The weights' dtype is read from the
    // config (and so enters the state contract) only where it is used: without kv_dtype, or on
    // vLLM, whose state follows the weights.
    std::optional<dtype_info> weights, kv;
    if (!req.kv_dtype.empty()) kv = dtype_of(req.kv_dtype, "model.kv_dtype");
    if (!kv || engine == "vllm") {
      if (cfg.has("torch_dtype"))
        weights = dtype_of(cfg.text("torch_dtype"), req.source + ": torch_dtype");
      else if (cfg.has("dtype"))
        weights = dtype_of(cfg.text("dtype"), req.source + ": dtype");
    }
    if (!weights && !kv) fail(fmt::format("{} has no torch_dtype: set model.kv_dtype", req.source));
    const dtype_info kv_dtype = kv ? *kv : *weights;
    const dtype_info weights_dtype = weights ? *weights : *kv;  // no torch_dtype: kv_dtype's
    rule_input in{cfg, req, kv_dtype, out, engine, weights_dtype};
    found->rule(in);
    out.fields = cfg.fields();
    out.fields.emplace_back("engine", conv.first ? engine : out.convention);
    if (out.mamba)
      for (const auto& t : out.mamba->tensors) {
        out.fields.emplace_back(t.name + "_dtype", t.dtype);
        // vLLM's default SD is what daemons before conv_layout had: only DS is named.
        if (t.name == "conv" && req.conv_layout == "DS")
          out.fields.emplace_back("conv_layout", "DS");
      }
    std::sort(out.fields.begin(), out.fields.end());
    out.fields.erase(std::unique(out.fields.begin(), out.fields.end()), out.fields.end());
    if (out.kv && out.kv->layer_ids.empty()) out.kv.reset();
    if (out.mamba && out.mamba->layer_ids.empty()) out.mamba.reset();
    return out;
  } catch (const catalogue_failure& f) {
    return error{errc::config_invalid, f.what};
  }
}

}  // namespace ferry
