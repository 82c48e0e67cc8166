#pragma once
/// ferryd's loggers (docs/operations.md, "Logs"): one spdlog logger per part of the daemon
/// (`logger_names`: ferryd, scheduler, room, peer, client, transport), all writing to stderr
/// through one sink, in the format and at the levels of the config's `log` section. A level can
/// change while the daemon runs (the client protocol's set_log_level, `ferryctl log-level`).

#include <spdlog/spdlog.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config_types.hpp"
#include "core/errors.hpp"

namespace ferry::logging {

/// Set the format and the levels of every named logger (creating those not yet registered).
/// Called once at the start of a daemon; calling it again (daemons run in a test process, one
/// after the other) reconfigures the same loggers.
void configure(const log_config& cfg);

/// The named logger (one of logger_names, or another name: it then shares the sink and takes
/// the `log.level` of the last configure). Thread-safe; never null.
std::shared_ptr<spdlog::logger> get(const std::string& name);

/// Set `level` (one of log_level_names) on the logger `name`, or on every named logger when
/// `name` is empty. An unknown name or level is an invalid_request error that lists the known
/// ones; nothing changes then.
result<> set_level(std::string_view name, std::string_view level);

/// Every named logger and its level now, in logger_names order.
std::vector<std::pair<std::string, std::string>> levels();

/// The format in force: "text" or "json".
std::string format();

}  // namespace ferry::logging
