#pragma once
/// The transport module's named spdlog logger.

#include <spdlog/spdlog.h>

#include <memory>

namespace ferry::transport {

/// The "transport" logger: the registered one if the daemon set it up, else a stderr logger
/// created (and registered) on first use. Thread-safe; never returns null.
std::shared_ptr<spdlog::logger> transport_log();

}  // namespace ferry::transport
