// libFuzzer target: the YAML config parser and validator, which also read every peer's config
// at handshake. Properties: no crash; a config that parses and validates prints (to_yaml) to
// text that parses and validates again to the same effective config.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/config.hpp"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 64 * 1024) return 0;
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto parsed = parse_config_text(text);
  if (!parsed) {
    if (parsed.message.empty()) std::abort();
    return 0;
  }
  if (!validate_config(parsed.value)) return 0;
  fill_derived(parsed.value);
  const auto yaml = to_yaml(parsed.value);
  auto again = parse_config_text(yaml);
  if (!again || !validate_config(again.value)) std::abort();
  if (to_yaml(again.value) != yaml) std::abort();
  return 0;
}
