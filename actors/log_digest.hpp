#pragma once
/// What ferryd's info log says of rooms (docs/operations.md, "Logs"). At 1000 rooms a second a
/// line per room and side is gigabytes a day, so a room that succeeds is logged at debug only;
/// at info a periodic summary (`log.summary_ms`) says how many rooms of each side succeeded and
/// failed, by code, and their bytes, and the per-room lines that stay at info (a failure, a
/// refusal) are limited to `log.burst` of each kind per interval: a peer that dies with
/// thousands of rooms writes the first few and then one line with the count of the rest.
///
/// Thread-safe: room actors, the Scheduler and the summary's own thread use it.

#include <spdlog/spdlog.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/config_types.hpp"
#include "core/errors.hpp"

namespace ferry::logging {

/// The per-room lines that can come in a flood, each limited on its own.
enum class flood : uint8_t {
  room_failed,    ///< the Scheduler's line of a room that ended Failed
  room_error,     ///< a room actor's line of its failure (a sender's, a receiver's)
  refused,        ///< a client request refused (every request of a client during a drain)
  disconnected,   ///< a room cancelled because its client disconnected
  staging_short,  ///< a room whose KV would need more staging than fabric.staging_bytes
};
inline constexpr size_t flood_kinds = 5;

class digest {
 public:
  digest() = default;
  ~digest();
  digest(const digest&) = delete;
  digest& operator=(const digest&) = delete;

  /// Take `log.summary_ms` and `log.burst`.
  void configure(const log_config& cfg);
  /// Write the summary and the counts of the lines left out on `log` (the Scheduler's) every
  /// interval, from a thread of its own.
  void start(std::shared_ptr<spdlog::logger> log);
  /// End that thread, writing what the last (partial) interval has to say. Idempotent.
  void stop();

  /// Whether a line of `kind` at `level` is to be written on `log` now: false when `log` would
  /// not write it anyway, or when this interval's burst of `kind` is spent (then it is counted,
  /// and the count written at the interval's end: "suppressed N similar lines (...)").
  bool allow(flood kind, const std::shared_ptr<spdlog::logger>& log,
             spdlog::level::level_enum level);

  /// A room of one side reached its terminal status (`bytes`: what it moved, when it succeeded).
  void room_ended(bool decode, bool succeeded, errc code, uint64_t bytes);

  /// Write this interval's lines now and begin the next: the counts of lines left out, and the
  /// summary when a room ended (nothing when nothing happened).
  void flush();

 private:
  struct side_tally {
    uint64_t succeeded = 0, failed = 0, bytes = 0;
    std::map<errc, uint64_t> by_code;  ///< failures
  };
  struct kind_tally {
    uint64_t logged = 0, suppressed = 0;
    std::shared_ptr<spdlog::logger> log;
    spdlog::level::level_enum level = spdlog::level::info;
  };
  void run();

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::chrono::milliseconds interval_{60000};
  uint64_t burst_ = 20;
  std::array<side_tally, 2> sides_{};  ///< prefill, decode
  std::array<kind_tally, flood_kinds> kinds_{};
  std::chrono::steady_clock::time_point since_ = std::chrono::steady_clock::now();
  std::shared_ptr<spdlog::logger> log_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ferry::logging
