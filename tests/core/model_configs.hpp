#pragma once
/// config.json texts of the catalogued models, written from their published values (nothing is
/// downloaded), and the same structures scaled down for the geometry property tests.

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace ferry::test {

// ---- published values ------------------------------------------------------------------------

inline const std::string qwen3_next_80b = R"({
  "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "torch_dtype": "bfloat16",
  "hidden_size": 2048, "num_hidden_layers": 48, "full_attention_interval": 4,
  "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256,
  "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
  "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4})";

inline const std::string kimi_linear_48b = R"({
  "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "torch_dtype": "bfloat16",
  "hidden_size": 2304, "num_hidden_layers": 27, "num_attention_heads": 32,
  "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128,
  "linear_attn_config": {"full_attn_layers": [4, 8, 12, 16, 20, 24, 27],
    "kda_layers": [1, 2, 3, 5, 6, 7, 9, 10, 11, 13, 14, 15, 17, 18, 19, 21, 22, 23, 25, 26],
    "num_heads": 32, "head_dim": 128, "short_conv_kernel_size": 4}})";

// 52 blocks: 24 Mamba2 (M), 4 attention (*), 24 MLP (-).
inline const std::string nemotron_h_8b = R"({
  "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "torch_dtype": "bfloat16",
  "hidden_size": 4096, "num_hidden_layers": 52,
  "hybrid_override_pattern": "M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-M-M-M-M-",
  "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
  "mamba_num_heads": 128, "mamba_head_dim": 64, "n_groups": 8, "ssm_state_size": 128,
  "conv_kernel": 4, "expand": 2})";

inline const std::string falcon_h1_05b = R"({
  "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "torch_dtype": "bfloat16",
  "hidden_size": 1024, "num_hidden_layers": 36, "num_attention_heads": 8,
  "num_key_value_heads": 2, "head_dim": 64, "mamba_d_ssm": 1536, "mamba_n_heads": 24,
  "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128, "mamba_d_conv": 4,
  "mamba_expand": 2})";

inline const std::string granite_4_h_small = R"({
  "architectures": ["GraniteMoeHybridForCausalLM"], "model_type": "granitemoehybrid",
  "torch_dtype": "bfloat16", "hidden_size": 4096, "num_hidden_layers": 8,
  "num_attention_heads": 32, "num_key_value_heads": 8,
  "layer_types": ["mamba", "mamba", "mamba", "attention", "mamba", "mamba", "mamba", "attention"],
  "mamba_n_heads": 128, "mamba_d_head": 64, "mamba_n_groups": 1, "mamba_d_state": 128,
  "mamba_d_conv": 4, "mamba_expand": 2})";

inline const std::string jamba_v01 = R"({
  "architectures": ["JambaForCausalLM"], "model_type": "jamba", "torch_dtype": "bfloat16",
  "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
  "num_key_value_heads": 8, "attn_layer_period": 8, "attn_layer_offset": 4,
  "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_expand": 2})";

inline std::string minimax_text_01() {
  std::string types;
  for (int i = 0; i < 80; ++i) types += std::string(i ? ", " : "") + ((i % 8 == 7) ? "1" : "0");
  return R"({"architectures": ["MiniMaxText01ForCausalLM"], "model_type": "minimax_text_01",
  "torch_dtype": "bfloat16", "hidden_size": 6144, "num_hidden_layers": 80,
  "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
  "attn_type_list": [)" +
         types + "]}";
}

inline const std::string deepseek_v3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
  "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
  "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128})";

/// A file holding `text` in a directory of this process's own, removed when it exits.
inline std::string write_json(const std::string& name, const std::string& text) {
  struct dir_t {
    std::string path;
    dir_t() {
      char tmpl[] = "/tmp/ferry-catalogue-XXXXXX";
      const char* d = ::mkdtemp(tmpl);
      REQUIRE(d != nullptr);
      path = d;
    }
    ~dir_t() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  };
  static const dir_t dir;
  const std::string path = dir.path + "/" + name + ".json";
  std::ofstream(path) << text;
  return path;
}

}  // namespace ferry::test
