// The model catalogue (core/model_catalogue.hpp) and its use in the config: each family's
// layout from its published config.json, under TP and PP, against the values the engines' own
// formulas give (docs/configuration.md, Model catalogue); refusals by name; a config that
// repeats a layout field otherwise; and the shipped Qwen3-Next configs, written by hand, equal
// to what the catalogue generates.
#include <catch2/catch.hpp>

#include "config_yaml.hpp"
#include "core/config.hpp"
#include "core/model_catalogue.hpp"
#include "model_configs.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

catalogue_layout lookup(const std::string& text, uint32_t tp = 1, std::string engine = "sglang",
                        uint32_t pp = 1, uint32_t pp_rank = 0, std::string conv_layout = "") {
  catalogue_request req;
  req.config_text = text;
  req.source = "config.json";
  req.engine = std::move(engine);
  req.conv_layout = std::move(conv_layout);
  req.tp_size = tp;
  req.pp_size = pp;
  req.pp_rank = pp_rank;
  auto r = catalogue_lookup(req);
  INFO(r.message);
  REQUIRE(r);
  return r.value;
}

std::string lookup_error(const std::string& text, uint32_t tp = 1, std::string engine = "sglang",
                         std::string conv_layout = "") {
  catalogue_request req;
  req.config_text = text;
  req.source = "config.json";
  req.engine = std::move(engine);
  req.conv_layout = std::move(conv_layout);
  req.tp_size = tp;
  auto r = catalogue_lookup(req);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::config_invalid);
  return r.message;
}

using dims = std::vector<uint64_t>;
using ids = std::vector<uint32_t>;

const state_tensor_config& tensor(const catalogue_layout& l, size_t i) {
  REQUIRE(l.mamba);
  REQUIRE(l.mamba->tensors.size() > i);
  return l.mamba->tensors[i];
}

/// A config whose pools the catalogue fills: only sizes are written.
std::string catalogue_yaml(const std::string& json_path, uint32_t tp = 1,
                           const std::string& extra_model = "", const std::string& kv_extra = "",
                           const std::string& mamba = "  mamba:\n    slots: 4\n") {
  return "node:\n  name: n0\nlisten:\n  client: /tmp/ferry-test.sock\ntp:\n  size: " +
         std::to_string(tp) + "\nmodel:\n  config_json: " + json_path + "\n" + extra_model +
         "pools:\n  kv:\n    page_tokens: 1\n    pages: 16\n" + kv_extra + mamba +
         "  aux:\n    rows: 8\n    row_bytes: 5632\n";
}

}  // namespace

TEST_CASE("catalogue: Qwen3-Next at TP 1, 2 and 4 gives SGLang's GDN layout", "[unit][catalogue]") {
  const auto l1 = lookup(qwen3_next_80b);
  CHECK(l1.architecture == "Qwen3NextForCausalLM");
  REQUIRE(l1.kv);
  CHECK(l1.kv->layer_ids == ids{3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47});
  CHECK(l1.kv->kv_heads == 2);
  CHECK(l1.kv->head_dim == 256);
  CHECK(l1.kv->dtype_bytes == 2);
  CHECK(l1.mamba->layer_ids.size() == 36);
  CHECK(tensor(l1, 0).shape == dims{8192, 3});
  CHECK(tensor(l1, 0).shard_groups == dims{2048, 2048, 4096});
  CHECK(tensor(l1, 0).dtype == "bf16");
  CHECK(tensor(l1, 1).shape == dims{32, 128, 128});
  CHECK(tensor(l1, 1).dtype == "fp32");
  CHECK(tensor(l1, 1).dtype_bytes == 4);
  const auto l4 = lookup(qwen3_next_80b, 4);
  CHECK(l4.kv->kv_heads == 1);  // 2 heads over TP 4: replicated
  CHECK(l4.kv->total_heads == 2);
  CHECK(tensor(l4, 0).shape == dims{2048, 3});
  CHECK(tensor(l4, 1).shape == dims{8, 128, 128});
  // The per-request state the domain primer lists: 73.7 MiB at TP 1, 18.4 MiB at TP 4.
  auto per_request = [](const catalogue_layout& l) {
    uint64_t b = 0;
    for (const auto& t : l.mamba->tensors) b += t.slot_bytes();
    return b * l.mamba->layer_ids.size();
  };
  CHECK(per_request(l1) == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4));
  CHECK(per_request(l4) * 4 == per_request(l1));
  // mamba_ssm_dtype in config.json (SGLang passes it for Qwen3-Next) changes the temporal
  // state's dtype; for Falcon-H1 SGLang builds the state without it: fp32 still.
  auto bf16 = qwen3_next_80b;
  bf16.insert(bf16.rfind('}'), R"(, "mamba_ssm_dtype": "bfloat16")");
  CHECK(tensor(lookup(bf16), 1).dtype == "bf16");
  auto falcon = falcon_h1_05b;
  falcon.insert(falcon.rfind('}'), R"(, "mamba_ssm_dtype": "bfloat16")");
  CHECK(tensor(lookup(falcon), 1).dtype == "fp32");
  // The temporal state is [value heads, value dim, key dim] (Mamba2's [heads, head_dim, state]).
  auto narrow_v = qwen3_next_80b;
  narrow_v.replace(narrow_v.find("\"linear_value_head_dim\": 128"), 28,
                   "\"linear_value_head_dim\": 64");
  CHECK(tensor(lookup(narrow_v), 1).shape == dims{32, 64, 128});
  CHECK(tensor(lookup(narrow_v), 0).shard_groups == dims{2048, 2048, 2048});
}

TEST_CASE(
    "catalogue: Kimi-Linear numbers its layers from 1, fuses q, k and v into one [K-1, dim] "
    "conv, and keeps MLA KV",
    "[unit][catalogue]") {
  const auto l = lookup(kimi_linear_48b, 2);
  REQUIRE(l.kv);
  CHECK(l.kv->mla);
  CHECK(l.kv->head_dim == 576);
  CHECK(l.kv->layer_ids == ids{3, 7, 11, 15, 19, 23, 26});
  CHECK(l.mamba->layer_ids.front() == 0);
  CHECK(l.mamba->layer_ids.size() == 20);
  CHECK(tensor(l, 0).shape == dims{3, 3 * 4096 / 2});
  CHECK(tensor(l, 0).slice_axis == 1u);
  CHECK(tensor(l, 0).shard_groups == dims{4096, 4096, 4096});
  CHECK(tensor(l, 1).shape == dims{16, 128, 128});
  CHECK(tensor(l, 1).dtype == "fp32");
  CHECK_THAT(lookup_error(kimi_linear_48b, 64),
             Catch::Equals("KDA num_heads 32 cannot be split over TP 64: TP must divide them"));
}

TEST_CASE("catalogue: Mamba2 families slice x by heads and hold B and C whole below n_groups",
          "[unit][catalogue]") {
  SECTION("Nemotron-H 8B: n_groups 8") {
    const auto l = lookup(nemotron_h_8b);
    CHECK(l.kv->layer_ids.size() == 4);
    CHECK(l.mamba->layer_ids.size() == 24);
    CHECK(tensor(l, 0).shape == dims{10240, 3});  // 8192 + 2 x 8 x 128
    CHECK(tensor(l, 0).shard_groups == dims{8192, 1024, 1024});
    CHECK(tensor(l, 0).shard_units == dims{128, 8, 8});
    CHECK(tensor(l, 1).shape == dims{128, 64, 128});
    CHECK(tensor(l, 1).slot_bytes() == 4u << 20);  // 4 MiB per slot per layer at TP 1
    CHECK(tensor(lookup(nemotron_h_8b, 4), 0).shape == dims{2560, 3});
    CHECK(tensor(lookup(nemotron_h_8b, 16), 0).shape == dims{512 + 256, 3});  // a group per rank
    // A newer config names each layer in layers_block_type, which SGLang reads first.
    auto named = nemotron_h_8b;
    const auto at = named.find("\"hybrid_override_pattern\"");
    named.replace(at, named.find(',', at) - at,
                  R"("layers_block_type": ["mamba", "mlp", "attention", "moe"])");
    const auto n = lookup(named);
    CHECK(n.kv->layer_ids == ids{2});
    CHECK(n.mamba->layer_ids == ids{0});
  }
  SECTION("Granite-4.0-H: n_groups 1, so every rank holds the one B and C group") {
    const auto l2 = lookup(granite_4_h_small, 2);
    CHECK(l2.kv->layer_ids == ids{3, 7});
    CHECK(l2.kv->head_dim == 128);  // hidden 4096 / 32 heads
    CHECK(l2.kv->kv_heads == 4);
    CHECK(tensor(l2, 0).shape == dims{4096 + 256, 3});
    CHECK(tensor(l2, 0).shard_units == dims{128, 1, 1});
    CHECK(tensor(lookup(granite_4_h_small, 4), 0).shape == dims{2048 + 256, 3});
  }
  SECTION("Falcon-H1: attention and Mamba2 in every layer") {
    const auto l = lookup(falcon_h1_05b, 2);
    CHECK(catalogue_shared_layers(l.architecture));
    CHECK(l.kv->layer_ids.size() == 36);
    CHECK(l.mamba->layer_ids == l.kv->layer_ids);
    CHECK(tensor(l, 0).shape == dims{768 + 256, 3});
    CHECK(tensor(l, 1).shape == dims{12, 64, 128});
  }
  SECTION("vLLM keeps conv as [K-1, dim] in the model's dtype") {
    const auto l = lookup(nemotron_h_8b, 2, "vllm");
    CHECK(tensor(l, 0).shape == dims{3, 5120});
    CHECK(tensor(l, 0).slice_axis == 1u);
    CHECK(tensor(l, 0).dtype == "bf16");
    // Nemotron-H's temporal state: config.json's mamba_ssm_cache_dtype, float32 without it
    // (vLLM's NemotronHForCausalLMConfig).
    CHECK(tensor(l, 1).dtype == "fp32");
    auto half = nemotron_h_8b;
    half.replace(half.find("\"n_groups\""), 0, "\"mamba_ssm_cache_dtype\": \"float16\", ");
    CHECK(tensor(lookup(half, 2, "vllm"), 1).dtype == "fp16");
    CHECK(tensor(lookup(half, 2), 1).dtype == "fp32");  // SGLang reads mamba_ssm_dtype only
    // Other families' temporal state takes the conv state's dtype.
    CHECK(tensor(lookup(granite_4_h_small, 2, "vllm"), 1).dtype == "bf16");
  }
  SECTION("vLLM's state follows the weights' dtype, not an fp8 KV cache's") {
    catalogue_request req;
    req.config_text = granite_4_h_small;
    req.source = "config.json";
    req.engine = "vllm";
    req.kv_dtype = "fp8_e4m3";
    req.tp_size = 2;
    auto r = catalogue_lookup(req);
    REQUIRE(r);
    CHECK(r.value.kv->dtype_bytes == 1);
    CHECK(tensor(r.value, 0).dtype == "bf16");
    CHECK(tensor(r.value, 1).dtype == "bf16");
    // SGLang's state does not follow the weights: with kv_dtype set, torch_dtype is not read,
    // so it stays out of the state contract as before.
    req.engine = "sglang";
    const auto s = catalogue_lookup(req);
    REQUIRE(s);
    for (const auto& [k, v] : s.value.fields) CHECK(k != "torch_dtype");
  }
  CHECK_THAT(lookup_error(nemotron_h_8b, 3),
             Catch::Equals("num_key_value_heads 8 cannot be split over TP 3: neither divides the "
                           "other"));
  CHECK_THAT(lookup_error(nemotron_h_8b, 256),
             Catch::Equals("Mamba2 heads 128 cannot be split over TP 256: TP must divide them"));
  auto three_groups = nemotron_h_8b;
  three_groups.replace(three_groups.find("\"n_groups\": 8"), 13, "\"n_groups\": 3");
  CHECK_THAT(
      lookup_error(three_groups, 2),
      Catch::Equals("Mamba2 n_groups 3 cannot be split over TP 2: neither divides the other"));
}

TEST_CASE("catalogue: Jamba's Mamba1, MiniMax-Text-01's lightning state and DeepSeek's MLA",
          "[unit][catalogue]") {
  const auto j = lookup(jamba_v01, 2);
  CHECK(j.kv->layer_ids == ids{4, 12, 20, 28});
  CHECK(tensor(j, 0).shape == dims{4096, 3});
  CHECK(tensor(j, 1).shape == dims{4096, 16});
  CHECK(tensor(j, 1).dtype == "fp32");
  // vLLM's jamba.py: conv [K-1, channels] by default, both in the model's dtype.
  const auto jv = lookup(jamba_v01, 2, "vllm");
  CHECK(tensor(jv, 0).shape == dims{3, 4096});
  CHECK(tensor(jv, 0).slice_axis == 1u);
  CHECK(tensor(jv, 1).shape == dims{4096, 16});
  CHECK(tensor(jv, 1).dtype == "bf16");
  CHECK(tensor(lookup(jamba_v01, 2, "vllm", 1, 0, "DS"), 0).shape == dims{4096, 3});

  const auto m = lookup(minimax_text_01(), 8, "vllm");
  CHECK(m.kv->layer_ids.size() == 10);
  CHECK(m.kv->layer_ids.front() == 7);
  CHECK(m.kv->kv_heads == 1);
  REQUIRE(m.mamba->tensors.size() == 1);
  CHECK(tensor(m, 0).shape == dims{8, 128, 128});
  CHECK(tensor(m, 0).dtype == "bf16");  // vLLM: the model's dtype
  CHECK(lookup_error(minimax_text_01()) ==
        "the catalogue has no sglang layout for MiniMaxText01ForCausalLM (it has: vllm): SGLang "
        "has no transfer path for lightning attention state");

  const auto d = lookup(deepseek_v3, 8);
  CHECK(d.kv->mla);
  CHECK(d.kv->head_dim == 576);
  CHECK(d.kv->layer_ids.size() == 61);
  CHECK_FALSE(d.mamba);
}

TEST_CASE("catalogue: PP stages split the layers as SGLang's get_pp_indices", "[unit][catalogue]") {
  // 48 layers over 2 stages: 0..23 and 24..47.
  const auto s0 = lookup(qwen3_next_80b, 1, "sglang", 2, 0);
  const auto s1 = lookup(qwen3_next_80b, 1, "sglang", 2, 1);
  CHECK(s0.kv->layer_ids == ids{3, 7, 11, 15, 19, 23});
  CHECK(s1.kv->layer_ids == ids{27, 31, 35, 39, 43, 47});
  CHECK(s0.mamba->layer_ids.size() + s1.mamba->layer_ids.size() == 36);
  // 27 layers over 4 stages: 6, 7, 7, 7 (the remainder goes to the stages before the last).
  const auto k3 = lookup(kimi_linear_48b, 1, "sglang", 4, 3);
  CHECK(k3.kv->layer_ids == ids{23, 26});
}

TEST_CASE("catalogue: an unknown architecture, a missing field and bad JSON are refused by name",
          "[unit][catalogue]") {
  CHECK_THAT(lookup_error(R"({"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"})"),
             Catch::StartsWith("architecture LlamaForCausalLM is not in the catalogue (it knows "
                               "Qwen3NextForCausalLM, KimiLinearForCausalLM") &&
                 Catch::EndsWith("describe its pools by hand in pools.kv and pools.mamba, without "
                                 "model.config_json"));
  auto missing = qwen3_next_80b;
  missing.replace(missing.find("\"linear_num_key_heads\": 16, "), 28, "");
  CHECK(lookup_error(missing) ==
        "config.json has no linear_num_key_heads (the Qwen3NextForCausalLM layout needs it)");
  CHECK_THAT(lookup_error("{\"architectures\": [}"),
             Catch::StartsWith("config.json is not valid JSON: "));
  CHECK(lookup_error(R"({"model_type": "qwen3_next"})") ==
        "config.json has no architectures list (e.g. [\"Qwen3NextForCausalLM\"])");
  CHECK(lookup_error(qwen3_next_80b, 1, "trt") ==
        "model.engine: expected sglang or vllm (optionally with the revision of its convention, "
        "e.g. sglang@2026-12), got \"trt\"");
}

TEST_CASE(
    "catalogue: engine conventions carry their revision, and vLLM's conv layout is its "
    "VLLM_SSM_CONV_STATE_LAYOUT",
    "[unit][catalogue]") {
  auto field = [](const catalogue_layout& l, const std::string& key) {
    for (const auto& [k, v] : l.fields)
      if (k == key) return v;
    return std::string("(absent)");
  };
  SECTION("a bare engine is its newest revision; a pinned one is the same layout") {
    const auto bare = lookup(nemotron_h_8b, 2);
    const auto pinned = lookup(nemotron_h_8b, 2, "sglang@2026-12");
    CHECK(bare.convention == "sglang@2026-12");
    // The state contract names the first revision by the engine alone, as daemons before
    // revisions did, so the two still pair.
    CHECK(field(bare, "engine") == "sglang");
    CHECK(tensor(pinned, 0).shape == tensor(bare, 0).shape);
    CHECK(tensor(pinned, 1).shape == tensor(bare, 1).shape);
    CHECK(field(bare, "conv_layout") == "(absent)");  // SGLang has one layout per family
    CHECK(lookup(nemotron_h_8b, 2, "vllm@2026-12").convention == "vllm@2026-12");
  }
  SECTION("a revision the catalogue does not have is refused, naming those it has") {
    CHECK(lookup_error(nemotron_h_8b, 1, "sglang@") ==
          "model.engine: sglang@ is not a catalogued convention: the catalogue has sglang as of "
          "2026-12. An engine whose layout differs from those: describe its pools by hand, or let "
          "its registration describe them");
    CHECK(lookup_error(nemotron_h_8b, 1, "sglang@2025-06") ==
          "model.engine: sglang@2025-06 is not a catalogued convention: the catalogue has sglang "
          "as of 2026-12. An engine whose layout differs from those: describe its pools by hand, "
          "or let its registration describe them");
  }
  SECTION("vLLM: SD by default, DS turns the conv state to [channels, K-1]") {
    const auto sd = lookup(nemotron_h_8b, 2, "vllm");
    const auto ds = lookup(nemotron_h_8b, 2, "vllm", 1, 0, "DS");
    CHECK(tensor(sd, 0).shape == dims{3, 5120});
    CHECK(tensor(sd, 0).slice_axis == 1u);
    CHECK(tensor(ds, 0).shape == dims{5120, 3});
    CHECK(tensor(ds, 0).slice_axis == 0u);
    CHECK(tensor(ds, 0).shard_groups == tensor(sd, 0).shard_groups);
    CHECK(tensor(ds, 0).shard_units == tensor(sd, 0).shard_units);
    CHECK(tensor(ds, 1).shape == tensor(sd, 1).shape);  // the temporal state is the same
    CHECK(tensor(ds, 1).dtype == tensor(sd, 1).dtype);
    CHECK(field(sd, "conv_layout") == "(absent)");  // vLLM's default, as before conv_layout
    CHECK(field(ds, "conv_layout") == "DS");        // peers that differ are refused at handshake
    CHECK(tensor(lookup(nemotron_h_8b, 2, "vllm", 1, 0, "SD"), 0).shape == tensor(sd, 0).shape);
  }
  SECTION("a conv layout for SGLang, or one vLLM does not have, is refused") {
    CHECK(lookup_error(nemotron_h_8b, 1, "sglang", "DS") ==
          "model.conv_layout: only vLLM chooses its conv state layout "
          "(VLLM_SSM_CONV_STATE_LAYOUT); sglang's is fixed per family");
    CHECK(lookup_error(nemotron_h_8b, 1, "vllm", "ds") ==
          "model.conv_layout: expected SD ([K-1, channels], vLLM's default) or DS ([channels, "
          "K-1]), as VLLM_SSM_CONV_STATE_LAYOUT says, got \"ds\"");
  }
  SECTION("ferryd --catalogue lists every architecture and every convention") {
    const auto text = catalogue_listing();
    CHECK_THAT(text, Catch::Contains("NemotronHForCausalLM") &&
                         Catch::Contains("sglang@2026-12  read from SGLang") &&
                         Catch::Contains("vllm@2026-12  read from vLLM"));
  }
}

TEST_CASE(
    "catalogue in the config: the pools need only their sizes, and the result is what "
    "--check-config prints",
    "[unit][catalogue][config]") {
  const auto path = write_json("qwen3-next", qwen3_next_80b);
  const auto cfg = parse_ok(catalogue_yaml(path, 2));
  REQUIRE(validate_config(cfg));
  REQUIRE(cfg.model);
  CHECK(cfg.model->architecture == "Qwen3NextForCausalLM");
  CHECK(cfg.pools.kv->kv_heads == 1);
  CHECK(cfg.pools.kv->total_heads == 2);
  CHECK(cfg.pools.kv->pages == 16);
  CHECK(cfg.pools.mamba->slots == 4);
  CHECK(cfg.pools.mamba->tensors[0].shape == dims{4096, 3});
  // The model's fields are the state contract: the peers compare them.
  auto field = [&](const std::string& key) {
    for (const auto& [k, v] : cfg.model->fields)
      if (k == key) return v;
    return std::string("(absent)");
  };
  CHECK(field("linear_num_value_heads") == "32");
  CHECK(field("engine") == "sglang");
  CHECK(field("temporal_dtype") == "fp32");
  // The effective config carries the layout, not the file: parsed again it is the same config.
  const auto text = to_yaml(cfg);
  CHECK_THAT(text, Catch::Contains("# from model.config_json " + path +
                                   " (engine sglang@2026-12: Gated "
                                   "DeltaNet + attention (Qwen3-Next))"));
  CHECK(text.find("config_json:") == std::string::npos);
  const auto again = parse_ok(text);
  CHECK(again.pools.mamba->tensors[0].shape == cfg.pools.mamba->tensors[0].shape);
  CHECK(again.pools.kv->layer_ids == cfg.pools.kv->layer_ids);
  CHECK(again.model->fields == cfg.model->fields);

  // A vLLM rank with VLLM_SSM_CONV_STATE_LAYOUT=DS says so, and pins the convention's revision.
  const auto nemotron = write_json("nemotron-h", nemotron_h_8b);
  const auto ds = parse_ok(catalogue_yaml(nemotron, 2,
                                          "  engine: vllm@2026-12\n  conv_layout: DS\n"
                                          "  state_dtype: fp32\n"));
  CHECK(ds.pools.mamba->tensors[0].shape == dims{5120, 3});
  CHECK(to_yaml(ds).find("(engine vllm@2026-12: Mamba2 + attention (Nemotron-H))") !=
        std::string::npos);
  CHECK(parse_error(catalogue_yaml(nemotron, 2, "  engine: vllm@2099-01\n")) ==
        "model.config_json: model.engine: vllm@2099-01 is not a catalogued convention: the "
        "catalogue has vllm as of 2026-12. An engine whose layout differs from those: describe "
        "its pools by hand, or let its registration describe them");
}

TEST_CASE(
    "catalogue in the config: a layout field written otherwise, a missing pool and an "
    "unreadable file are named",
    "[unit][catalogue][config]") {
  const auto path = write_json("qwen3-next", qwen3_next_80b);
  CHECK(parse_error(catalogue_yaml(path, 1, "", "    kv_heads: 4\n")) ==
        "pools.kv.kv_heads: 4 written here, but model.config_json's Qwen3NextForCausalLM (sglang) "
        "at TP 1 rank 0 gives 2");
  // Repeating the generated value is fine.
  CHECK(parse_ok(catalogue_yaml(path, 1, "", "    kv_heads: 2\n")).pools.kv->kv_heads == 2);
  CHECK(parse_error(
            catalogue_yaml(path, 1, "", "", "  mamba:\n    slots: 4\n    layer_ids: [0, 1]\n")) ==
        "pools.mamba.layer_ids: [0, 1] written here, but model.config_json's "
        "Qwen3NextForCausalLM (sglang) at TP 1 rank 0 gives [0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, "
        "14, 16, 17, 18, 20, 21, 22, 24, 25, 26, 28, 29, 30, 32, 33, 34, 36, 37, 38, 40, 41, 42, "
        "44, 45, 46]");
  CHECK(parse_error(catalogue_yaml(path, 1, "", "", "")) ==
        "pools.mamba: expected a state pool (at least its slots): Qwen3NextForCausalLM has 36 "
        "state layer(s) at this rank");
  CHECK(parse_error(catalogue_yaml(path, 1, "  architecture: JambaForCausalLM\n")) ==
        "model.architecture: JambaForCausalLM written here, but " + path +
            " says Qwen3NextForCausalLM");
  CHECK(parse_error(catalogue_yaml(path, 3)) ==
        "model.config_json: num_key_value_heads 2 cannot be split over TP 3: neither divides the "
        "other");
  CHECK(parse_error(catalogue_yaml("/nonexistent/config.json")) ==
        "model.config_json: cannot read \"/nonexistent/config.json\": No such file or directory");
  CHECK(parse_error(catalogue_yaml("/dev/zero")) ==
        "model.config_json: \"/dev/zero\" is not a regular file");
  const auto deepseek = write_json("deepseek", deepseek_v3);
  CHECK(parse_error(catalogue_yaml(deepseek)) ==
        "pools.mamba: DeepseekV3ForCausalLM has no recurrent state (a state pool of type mamba)");
  CHECK(parse_error("node:\n  name: n0\nlisten:\n  client: /tmp/x.sock\nmodel:\n  architecture: "
                    "X\n  engine: vllm\npools:\n  aux:\n    rows: 8\n    row_bytes: 64\n") ==
        "model.engine: expected model.config_json beside it (it says how to read the model's "
        "config)");
}

TEST_CASE("catalogue in the config: Falcon-H1's state and KV share their layers",
          "[unit][catalogue][config]") {
  const auto path = write_json("falcon-h1", falcon_h1_05b);
  const auto cfg = parse_ok(catalogue_yaml(path, 2));
  INFO(validate_config(cfg).message);
  CHECK(validate_config(cfg));
  // Without the catalogue's architecture, the same ids in both pools are a mistake.
  auto hand = cfg;
  hand.model.reset();
  hand.catalogue.reset();
  CHECK_THAT(validate_config(hand).message,
             Catch::StartsWith("pools.mamba.layer_ids: expected ids disjoint from pools.kv."));
}

TEST_CASE("catalogue: the shipped Qwen3-Next configs equal what the catalogue generates",
          "[unit][catalogue][config]") {
  // configs/ describes Qwen3-Next-80B-A3B by hand; the catalogue must agree with it field for
  // field, or one of them is wrong.
  const auto path = write_json("qwen3-next", qwen3_next_80b);
  ::setenv("RUNTIME_DIRECTORY", "/tmp", 0);  // what systemd gives sglang-prefill.yaml
  for (const char* name : {"prefill.yaml", "decode.yaml", "sglang-prefill.yaml"}) {
    INFO(name);
    const auto hand = load_config_file(source_dir() + "/configs/" + name);
    INFO(hand.message);
    REQUIRE(hand);
    if (!hand.value.pools.kv || hand.value.pools.kv->layer_ids.empty()) continue;  // registered
    ferry_config cfg = hand.value;
    catalogue_config cat;
    cat.config_json = path;
    catalogue_request req;
    req.config_text = qwen3_next_80b;
    req.tp_size = cfg.tp.size;
    auto generated = catalogue_lookup(req);
    REQUIRE(generated);
    cat.kv = generated.value.kv;
    cat.mamba = generated.value.mamba;
    cfg.catalogue = cat;
    cfg.model = model_contract{"Qwen3NextForCausalLM", "", {}};
    CHECK(catalogue_difference(cfg, cfg.pools, "kv").value_or("same") == "same");
    CHECK(catalogue_difference(cfg, cfg.pools, "mamba").value_or("same") == "same");
  }
}
