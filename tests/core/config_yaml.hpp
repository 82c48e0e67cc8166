#pragma once
/// The text the config tests (test_config*.cpp) parse: a small valid config to derive broken
/// variants from, the examples' directory, and helpers that parse a text and return its value
/// or its error.

#include <catch2/catch.hpp>
#include <cstdlib>
#include <string>

#include "core/config.hpp"

namespace ferry::test {

inline std::string source_dir() {
  const char* dir = std::getenv("FERRY_SOURCE_DIR");
  return dir ? dir : FERRY_DEFAULT_SOURCE_DIR;
}

/// A small valid config; tests derive broken variants from it with `replace`.
inline const std::string base_yaml = R"(node:
  name: n0
listen:
  client: /tmp/ferry-test.sock
tp:
  size: 1
pools:
  kv:
    layer_ids: [3, 7]
    page_tokens: 1
    kv_heads: 2
    head_dim: 256
    dtype_bytes: 2
    pages: 16
  mamba:
    slots: 4
    layer_ids: [0, 1, 2]
    tensors:
      - name: conv
        shape: [8192, 3]
        dtype_bytes: 2
        slice_axis: 0
        shard_groups: [2048, 2048, 4096]
      - name: temporal
        shape: [32, 128, 128]
        dtype_bytes: 4
        slice_axis: 0
  aux:
    rows: 8
    row_bytes: 5632
)";

/// `text` with the single occurrence of `from` replaced by `to`.
inline std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  REQUIRE(text.find(from, at + 1) == std::string::npos);
  return text.replace(at, from.size(), to);
}

/// The parse error for `yaml`, which must fail to parse.
inline std::string parse_error(const std::string& yaml) {
  const auto r = parse_config_text(yaml);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::config_invalid);
  return r.message;
}

/// The validation error for `yaml`, which must parse but fail validation.
inline std::string validate_error(const std::string& yaml) {
  const auto r = parse_config_text(yaml);
  INFO(r.message);
  REQUIRE(r);
  const auto valid = validate_config(r.value);
  REQUIRE_FALSE(valid);
  CHECK(valid.code == errc::config_invalid);
  return valid.message;
}

inline ferry_config parse_ok(const std::string& yaml) {
  const auto r = parse_config_text(yaml);
  INFO(r.message);
  REQUIRE(r);
  return r.value;
}

}  // namespace ferry::test
