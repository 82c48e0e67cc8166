#include "transport/log.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

namespace ferry::transport {

std::shared_ptr<spdlog::logger> transport_log() {
  // The mutex only orders our own creation attempts; the daemon may also register "transport"
  // concurrently, in which case creation throws and we take the registered one.
  static std::mutex create_mutex;
  std::lock_guard<std::mutex> lock(create_mutex);
  if (auto existing = spdlog::get("transport")) return existing;
  try {
    return spdlog::stderr_color_mt("transport");
  } catch (const spdlog::spdlog_ex&) {
    return spdlog::get("transport");
  }
}

}  // namespace ferry::transport
