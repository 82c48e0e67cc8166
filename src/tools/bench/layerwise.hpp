#pragma once
/// The benchmark's layer-wise mode (`--layer-wise T_MS`, docs/performance.md): an engine whose
/// forward pass produces one layer (or group of layers) every T ms sends each as it is made
/// (protocol v6 layer ranges); the time from the last layer's send to Success is set against a
/// whole-room send issued when the last layer would be made, for the same room.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "ferry/client.hpp"

namespace ferry::bench {

struct layer_wise_options {
  double t_ms = 0;               ///< one step (a layer group) produced every t_ms
  uint32_t group = 1;            ///< global layers per step
  uint32_t requests = 1;         ///< pairs of rooms timed (one layer-wise, one whole each)
  std::vector<uint32_t> chunks;  ///< page counts of the room's chunks (the last carries state)
};

/// What the mode borrows from the benchmark's set-up (src/tools/bench/main.cpp).
struct layer_wise_env {
  std::vector<std::unique_ptr<client::client>>& prefills;
  std::vector<std::unique_ptr<client::client>>& decodes;
  const std::vector<uint32_t>& src_pages;  ///< the room's source pages (slot 0's)
  uint32_t slot = 0;                       ///< state slot and aux row (when present): slot 0
  bool has_state = false, has_aux = false;
  /// Prepare room `id` on every decode rank (its id in the source aux row first) and subscribe.
  std::function<std::optional<int>(uint64_t id)> open_room;
  /// With --verify: check the room's destination bytes (counted by the caller).
  std::function<void(uint64_t id)> verify;
  /// A client call failed: the exit code, after saying why.
  std::function<int(const client::client&, const ferry::error&, const std::string&)> fail_on;
  /// The run stops early: the exit code, after saying why.
  std::function<int(const std::string&)> fail;
  uint64_t& next_room;
  std::ostream& text;
  nlohmann::json& out;  ///< gets "layer_wise"
};

/// Run the mode; nullopt when every room committed (the caller reports and exits), else the
/// exit code.
std::optional<int> run_layer_wise(const layer_wise_options& o, layer_wise_env& env);

}  // namespace ferry::bench
