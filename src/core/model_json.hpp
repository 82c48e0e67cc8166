#pragma once
/// The model catalogue's reading of a model's config.json (core/model_catalogue.cpp): a field
/// reader that names what is missing or mistyped and records every field it read (the state
/// contract's model.fields), and the dtype names configs use. Internal to the catalogue.

#include <fmt/format.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace ferry::catalogue_detail {

using json = nlohmann::json;

/// Why a lookup failed; catalogue_lookup turns it into config_invalid.
struct catalogue_failure {
  std::string what;
};

[[noreturn]] inline void fail(std::string what) { throw catalogue_failure{std::move(what)}; }

struct dtype_info {
  std::string name;  ///< as tensors[].dtype spells it
  uint32_t bytes = 0;
};

/// "bfloat16", "bf16", "float32", ... as a tensor dtype; `what` names the setting.
inline dtype_info dtype_of(const std::string& text, const std::string& what) {
  static const std::pair<const char*, dtype_info> names[] = {{"bfloat16", {"bf16", 2}},
                                                             {"bf16", {"bf16", 2}},
                                                             {"float16", {"fp16", 2}},
                                                             {"half", {"fp16", 2}},
                                                             {"fp16", {"fp16", 2}},
                                                             {"float32", {"fp32", 4}},
                                                             {"float", {"fp32", 4}},
                                                             {"fp32", {"fp32", 4}},
                                                             {"float8_e4m3fn", {"fp8_e4m3", 1}},
                                                             {"fp8_e4m3", {"fp8_e4m3", 1}},
                                                             {"float8_e5m2", {"fp8_e5m2", 1}},
                                                             {"fp8_e5m2", {"fp8_e5m2", 1}}};
  for (const auto& [n, info] : names)
    if (text == n) return info;
  fail(
      fmt::format("{}: expected bfloat16, float16, float32, float8_e4m3fn or float8_e5m2, got "
                  "\"{}\"",
                  what, text));
}

/// config.json, read field by field: a missing or mistyped field is named, and every field
/// read is recorded (the state contract's model.fields).
class model_json {
 public:
  using field_list = std::vector<std::pair<std::string, std::string>>;

  model_json(const json& j, std::string source, std::string architecture)
      : j_(j),
        source_(std::move(source)),
        architecture_(std::move(architecture)),
        fields_(std::make_shared<field_list>()) {}

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  /// A positive integer (`or_zero`: or 0).
  uint64_t count(const char* key, bool or_zero = false) {
    if (!has(key))
      fail(fmt::format("{} has no {} (the {} layout needs it)", source_, key, architecture_));
    const json& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < (or_zero ? 0 : 1))
      fail(fmt::format("{}: {} must be a {} integer, got {}", source_, key,
                       or_zero ? "non-negative" : "positive", v.dump()));
    record(key, v.dump());
    return v.get<uint64_t>();
  }
  std::string text(const char* key) {
    if (!has(key) || !j_[key].is_string())
      fail(fmt::format("{} has no text {} (the {} layout needs it)", source_, key, architecture_));
    record(key, j_[key].get<std::string>());
    return j_[key].get<std::string>();
  }
  const json& list(const char* key) const {
    if (!has(key) || !j_[key].is_array())
      fail(fmt::format("{} has no list {} (the {} layout needs it)", source_, key, architecture_));
    return j_[key];
  }
  /// A nested object (Kimi-Linear's linear_attn_config), read the same way; its fields are
  /// recorded as "object.field".
  model_json object(const char* key) const {
    if (!has(key) || !j_[key].is_object())
      fail(
          fmt::format("{} has no object {} (the {} layout needs it)", source_, key, architecture_));
    model_json inner(j_[key], fmt::format("{} ({})", source_, key), architecture_);
    inner.fields_ = fields_;
    inner.prefix_ = prefix_ + key + ".";
    return inner;
  }
  const std::string& source() const { return source_; }
  field_list fields() const { return *fields_; }

 private:
  void record(const char* key, std::string value) {
    fields_->emplace_back(prefix_ + key, std::move(value));
  }

  const json& j_;
  std::string source_, architecture_, prefix_;
  std::shared_ptr<field_list> fields_;  ///< shared with the nested objects read
};

}  // namespace ferry::catalogue_detail
