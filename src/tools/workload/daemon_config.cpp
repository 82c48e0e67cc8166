// The daemon's config from its hello reply, parsed once per distinct text and thread.
#include "tools/workload/daemon_config.hpp"

#include <string>
#include <utility>
#include <vector>

namespace ferry::client {

std::shared_ptr<const ferry_config> daemon_config(const client& c) {
  // A tool talks to a few daemons at most; a restarted daemon of the same config sends the
  // same text. The bound only keeps a pathological caller from growing it without end.
  constexpr size_t max_cached = 16;
  thread_local std::vector<std::pair<std::string, std::shared_ptr<const ferry_config>>> cache;
  const std::string& text = c.daemon().config_yaml;
  for (const auto& [t, cfg] : cache)
    if (t == text) return cfg;
  std::shared_ptr<const ferry_config> cfg;
  if (auto parsed = parse_config_text(text))
    cfg = std::make_shared<const ferry_config>(std::move(parsed.value));
  if (cache.size() == max_cached) cache.erase(cache.begin());
  cache.emplace_back(text, cfg);
  return cfg;
}

}  // namespace ferry::client
