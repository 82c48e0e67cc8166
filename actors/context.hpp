#pragma once
/// What every actor of a daemon shares, read-only after start-up: the config, the local layout,
/// the fabric engine and region ids, the client gateway, and named loggers.

#include <spdlog/spdlog.h>

#include <array>
#include <memory>
#include <string>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/shm_region.hpp"
#include "transport/engine.hpp"

namespace ferry {

class client_gateway;

struct daemon_context {
  ferry_config config;
  std::string instance;     ///< resolved instance id
  std::string config_yaml;  ///< effective config, sent to peers
  node_layout layout;
  std::array<shm_region, pool_kind_count> pools;  ///< mapped pools (empty when absent)
  std::array<transport::region_id, pool_kind_count> regions{};
  std::unique_ptr<transport::engine> engine;
  std::shared_ptr<client_gateway> gateway;
  std::shared_ptr<spdlog::logger> log_sched, log_room, log_peer;

  bool serves_decode() const { return config.role != node_role::prefill; }
  bool serves_prefill() const { return config.role != node_role::decode; }
};

using context_ptr = std::shared_ptr<daemon_context>;

/// A named logger sharing the default sink and level.
std::shared_ptr<spdlog::logger> make_logger(const std::string& name);

}  // namespace ferry
