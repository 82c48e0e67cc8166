#include "actors/logging.hpp"

#include <fmt/format.h>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

#include "core/log_line.hpp"

namespace ferry::logging {
namespace {

/// Ferry's name of a level (spdlog says "warning" where the config says warn).
std::string_view level_name(spdlog::level::level_enum l) {
  switch (l) {
    case spdlog::level::trace:
      return "trace";
    case spdlog::level::debug:
      return "debug";
    case spdlog::level::info:
      return "info";
    case spdlog::level::warn:
      return "warn";
    case spdlog::level::err:
      return "error";
    case spdlog::level::critical:
      return "critical";
    default:
      return "off";
  }
}

/// One JSON object per record (core/log_line.hpp).
class json_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& m, spdlog::memory_buf_t& dest) override {
    auto line = json_log_line(m.time, level_name(m.level),
                              std::string_view(m.logger_name.data(), m.logger_name.size()),
                              std::string_view(m.payload.data(), m.payload.size()));
    line += '\n';
    dest.append(line.data(), line.data() + line.size());
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<json_formatter>();
  }
};

/// The text format: UTC, said so by the Z, to the microsecond, like the JSON one; one line per
/// record whatever its text. Every record's text passes through text_log_escape here, in the
/// sink, so no call site can forget it: a client's or a peer's string with a newline (a prefill
/// address, a reason) cannot start a line that reads as ferryd's own.
class text_formatter final : public spdlog::formatter {
 public:
  void format(const spdlog::details::log_msg& m, spdlog::memory_buf_t& dest) override {
    const std::string_view payload(m.payload.data(), m.payload.size());
    if (!needs_text_log_escape(payload)) return pattern_.format(m, dest);
    const std::string escaped = text_log_escape(payload);
    spdlog::details::log_msg copy = m;
    copy.payload = spdlog::string_view_t(escaped.data(), escaped.size());
    pattern_.format(copy, dest);
    // Where the level's colour goes (a colour sink reads it from the record it passed).
    m.color_range_start = copy.color_range_start;
    m.color_range_end = copy.color_range_end;
  }
  std::unique_ptr<spdlog::formatter> clone() const override {
    return std::make_unique<text_formatter>();
  }

 private:
  spdlog::pattern_formatter pattern_{"%Y-%m-%dT%H:%M:%S.%fZ %^%l%$ [%n] %v",
                                     spdlog::pattern_time_type::utc};
};

std::unique_ptr<spdlog::formatter> make_formatter(const std::string& format) {
  if (format == "json") return std::make_unique<json_formatter>();
  return std::make_unique<text_formatter>();
}

struct state {
  std::mutex mutex;  ///< orders configure, get and set_level among themselves
  std::string format = "text";
  spdlog::level::level_enum level = spdlog::level::info;
  spdlog::sink_ptr sink;
};

state& shared() {
  static state s;
  return s;
}

/// The registered logger `name`, or a new one on the shared sink. Called with the mutex held.
std::shared_ptr<spdlog::logger> get_locked(state& s, const std::string& name) {
  if (!s.sink) {
    s.sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    s.sink->set_formatter(make_formatter(s.format));
  }
  if (auto l = spdlog::get(name)) return l;
  auto l = std::make_shared<spdlog::logger>(name, s.sink);
  l->set_level(s.level);
  // A logger made elsewhere first under this name (transport/log.cpp, outside a daemon) wins
  // the registration; it is then taken and put on the shared sink.
  try {
    spdlog::register_logger(l);
  } catch (const spdlog::spdlog_ex&) {
    l = spdlog::get(name);
    l->sinks().assign(1, s.sink);
  }
  return l;
}

}  // namespace

void configure(const log_config& cfg) {
  auto& s = shared();
  std::lock_guard lock(s.mutex);
  s.format = cfg.format;
  s.level = spdlog::level::from_str(cfg.level);
  get_locked(s, "ferryd");  // makes the sink
  s.sink->set_formatter(make_formatter(s.format));
  for (std::string_view name : logger_names) {
    auto l = get_locked(s, std::string(name));
    l->sinks().assign(1, s.sink);
    auto level = s.level;
    for (const auto& [logger, text] : cfg.levels)
      if (logger == name) level = spdlog::level::from_str(text);
    l->set_level(level);
  }
  // Anything logged through spdlog's default logger (a library) lands on the same sink.
  auto def = std::make_shared<spdlog::logger>("", s.sink);
  def->set_level(s.level);
  spdlog::set_default_logger(def);
}

std::shared_ptr<spdlog::logger> get(const std::string& name) {
  auto& s = shared();
  std::lock_guard lock(s.mutex);
  return get_locked(s, name);
}

result<> set_level(std::string_view name, std::string_view level) {
  bool known_level = false;
  for (auto l : log_level_names) known_level = known_level || l == level;
  if (!known_level)
    return error{errc::invalid_request, fmt::format("unknown log level '{}': expected one of {}",
                                                    level, fmt::join(log_level_names, ", "))};
  bool known_name = name.empty();
  for (auto n : logger_names) known_name = known_name || n == name;
  if (!known_name)
    return error{errc::invalid_request, fmt::format("unknown logger '{}': ferryd's loggers are {}",
                                                    name, fmt::join(logger_names, ", "))};
  auto& s = shared();
  std::lock_guard lock(s.mutex);
  const auto value = spdlog::level::from_str(std::string(level));
  for (auto n : logger_names)
    if (name.empty() || n == name) get_locked(s, std::string(n))->set_level(value);
  return {};
}

std::vector<std::pair<std::string, std::string>> levels() {
  auto& s = shared();
  std::lock_guard lock(s.mutex);
  std::vector<std::pair<std::string, std::string>> out;
  for (auto n : logger_names) {
    out.emplace_back(n, level_name(get_locked(s, std::string(n))->level()));
  }
  return out;
}

std::string format() {
  auto& s = shared();
  std::lock_guard lock(s.mutex);
  return s.format;
}

}  // namespace ferry::logging
