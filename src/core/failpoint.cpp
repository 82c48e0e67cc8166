#include "core/failpoint.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace ferry::core {
namespace {

struct failpoints {
  std::string text;
  std::mutex mutex;
  std::unordered_map<std::string, int64_t> left;  ///< -1: unlimited
  std::atomic<bool> any{false};

  failpoints() {
    const char* v = std::getenv("FERRY_FAILPOINTS");
    if (v == nullptr) return;
    text = v;
    std::string_view rest = text;
    while (!rest.empty()) {
      const auto comma = rest.find(',');
      std::string_view item = rest.substr(0, comma);
      rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
      if (item.empty()) continue;
      int64_t count = -1;
      if (const auto eq = item.find('='); eq != std::string_view::npos) {
        count = std::strtoll(std::string(item.substr(eq + 1)).c_str(), nullptr, 10);
        item = item.substr(0, eq);
      }
      left[std::string(item)] = count;
    }
    any.store(!left.empty(), std::memory_order_relaxed);
  }
};

failpoints& registry() {
  static failpoints f;
  return f;
}

}  // namespace

bool failpoint(std::string_view name) {
  auto& f = registry();
  if (!f.any.load(std::memory_order_relaxed)) return false;
  std::lock_guard<std::mutex> lock(f.mutex);
  auto it = f.left.find(std::string(name));
  if (it == f.left.end() || it->second == 0) return false;
  if (it->second > 0) --it->second;
  return true;
}

std::string active_failpoints() { return registry().text; }

}  // namespace ferry::core
