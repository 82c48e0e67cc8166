#include "os/failpoint.hpp"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

namespace ferry::os {
namespace {

struct failpoints {
  std::string text;
  std::mutex mutex;
  std::unordered_map<std::string, int64_t> left;  ///< -1: unlimited
  std::atomic<bool> any{false};

  std::string invalid;  ///< why FERRY_FAILPOINTS is refused ("" when it is well formed)

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
      std::string_view name = item;
      if (const auto eq = item.find('='); eq != std::string_view::npos) {
        name = item.substr(0, eq);
        const auto digits = item.substr(eq + 1);
        const bool numeric = !digits.empty() && digits.size() <= 9 &&
                             digits.find_first_not_of("0123456789") == std::string_view::npos;
        if (!numeric) {
          refuse(item, "the count after '=' must be a whole number of firings (0..999999999)");
          return;
        }
        count = std::stoll(std::string(digits));
      }
      if (name.empty() || name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") !=
                              std::string_view::npos) {
        refuse(item, "a failpoint name is lower-case letters, digits and '_'");
        return;
      }
      left[std::string(name)] = count;
    }
    any.store(!left.empty(), std::memory_order_relaxed);
  }

  /// A malformed setting sets no failpoint: a test hook that fires differently from what was
  /// asked would prove nothing.
  void refuse(std::string_view item, const char* why) {
    left.clear();
    invalid = "FERRY_FAILPOINTS='" + text + "': item '" + std::string(item) + "': " + why;
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

std::string failpoints_invalid() { return registry().invalid; }

}  // namespace ferry::os
