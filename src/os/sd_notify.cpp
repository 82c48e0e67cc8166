// systemd notifications through libsystemd's sd_notify (a no-op without NOTIFY_SOCKET).
#include "os/sd_notify.hpp"

#include <systemd/sd-daemon.h>

#include <algorithm>
#include <cstring>

namespace ferry {
namespace {

void notify(spdlog::logger& log, const std::string& state, std::string status) {
  // One assignment per line: a newline inside the status would start a bogus one.
  std::replace(status.begin(), status.end(), '\n', ' ');
  // unset_environment 0 keeps NOTIFY_SOCKET, so the later STOPPING=1 finds it.
  if (const int rc = sd_notify(0, (state + "\nSTATUS=" + status).c_str()); rc < 0)
    log.warn("sd_notify({}) to NOTIFY_SOCKET failed: {}", state, std::strerror(-rc));
}

}  // namespace

void notify_ready(spdlog::logger& log, const std::string& status) {
  notify(log, "READY=1", status);
}

void notify_stopping(spdlog::logger& log, const std::string& status) {
  notify(log, "STOPPING=1", status);
}

}  // namespace ferry
