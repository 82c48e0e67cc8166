#pragma once
/// ferryd's part of systemd's readiness protocol (Type=notify,
/// configs/systemd/ferryd@.service.in): READY=1 once it serves peers and clients, STOPPING=1 when
/// it starts to shut down, each with a STATUS= line for `systemctl status`. Without
/// NOTIFY_SOCKET (not started by systemd, or by a supervisor that does not listen) every call
/// does nothing.

#include <spdlog/spdlog.h>

#include <string>

namespace ferry {

/// READY=1 and STATUS=`status`. Called where --ready-fd is written. A failed send is logged to
/// `log` as a warning; the daemon keeps serving.
void notify_ready(spdlog::logger& log, const std::string& status);
/// STOPPING=1 and STATUS=`status`. Called once, when the daemon is told to stop.
void notify_stopping(spdlog::logger& log, const std::string& status);

}  // namespace ferry
