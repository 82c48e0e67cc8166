// The config structs' own helpers: sizes and names (config_types.hpp). Part of ferry_protocol,
// so it needs neither the YAML parser nor the validation.
#include "core/config_types.hpp"

namespace ferry {

// ---------------------------------------------------------------------------------------------
// Size helpers
// ---------------------------------------------------------------------------------------------

uint64_t fabric_config::pack_threshold() const {
  if (pack_threshold_bytes) return *pack_threshold_bytes;
  return provider == "tcp" || provider == "sockets" ? 65536 : 8192;
}

uint64_t state_tensor_config::slot_bytes() const {
  uint64_t bytes = dtype_bytes;
  for (uint64_t dim : shape) bytes *= dim;
  return bytes;
}

uint64_t state_tensor_config::sliced_dim() const {
  // An out-of-range axis is a validation error; return 0 rather than read past the vector so
  // callers holding an unvalidated config cannot crash here.
  return slice_axis && *slice_axis < shape.size() ? shape[*slice_axis] : 0;
}

uint64_t state_tensor_config::outer_count() const {
  uint64_t count = 1;
  if (!slice_axis) return count;
  for (size_t i = 0; i < *slice_axis && i < shape.size(); ++i) count *= shape[i];
  return count;
}

uint64_t state_tensor_config::unit_bytes() const {
  uint64_t bytes = dtype_bytes;
  if (!slice_axis) return bytes;
  for (size_t i = *slice_axis + 1; i < shape.size(); ++i) bytes *= shape[i];
  return bytes;
}

uint64_t kv_pool_config::page_bytes() const {
  return uint64_t{page_tokens} * kv_heads * head_dim * dtype_bytes;
}

uint32_t kv_pool_config::buffer_count() const {
  const auto layers = static_cast<uint32_t>(layer_ids.size());
  return mla ? layers : 2 * layers;
}

const char* to_string(pool_memory m) { return m == pool_memory::client ? "client" : "daemon"; }

const char* to_string(state_type t) {
  switch (t) {
    case state_type::mamba:
      return "mamba";
    case state_type::swa:
      return "swa";
    case state_type::dsa:
      return "dsa";
    case state_type::minimax_index_k:
      return "minimax_index_k";
  }
  return "?";
}

const char* to_string(node_role r) {
  switch (r) {
    case node_role::prefill:
      return "prefill";
    case node_role::decode:
      return "decode";
    case node_role::both:
      return "both";
  }
  return "both";
}

}  // namespace ferry
