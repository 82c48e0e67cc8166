#include "actors/log_digest.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

namespace ferry::logging {
namespace {

/// How the line of the counts left out names each kind (flood's order).
constexpr const char* kind_names[flood_kinds] = {
    "rooms ended Failed", "room failures", "requests refused",
    "rooms cancelled as their client disconnected", "rooms short of staging"};

std::string side_text(const char* name, const char* moved, uint64_t ok, uint64_t failed,
                      const std::map<errc, uint64_t>& by_code, uint64_t bytes) {
  std::string codes;
  for (const auto& [code, n] : by_code)
    codes += fmt::format("{}{} {}", codes.empty() ? " (" : ", ", to_string(code), n);
  if (!codes.empty()) codes += ')';
  return fmt::format("{} {} succeeded, {} failed{}, {} bytes {}", name, ok, failed, codes, bytes,
                     moved);
}

}  // namespace

digest::~digest() { stop(); }

void digest::configure(const log_config& cfg) {
  std::lock_guard lock(mutex_);
  interval_ = std::chrono::milliseconds(cfg.summary_ms);
  burst_ = cfg.burst;
}

void digest::start(std::shared_ptr<spdlog::logger> log) {
  std::lock_guard lock(mutex_);
  log_ = std::move(log);
  if (thread_.joinable()) return;
  stopping_ = false;
  since_ = std::chrono::steady_clock::now();
  // The thread is made with every signal blocked, which it keeps: ferryd waits for its stop
  // signals in one thread (sigwaitinfo), and a signal delivered here would end the process.
  sigset_t all, before;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &before);
  thread_ = std::thread([this] { run(); });
  pthread_sigmask(SIG_SETMASK, &before, nullptr);
}

void digest::stop() {
  {
    std::lock_guard lock(mutex_);
    if (!thread_.joinable()) return;
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
  flush();
}

void digest::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (changed_.wait_until(lock, since_ + interval_, [&] { return stopping_; })) break;
    lock.unlock();
    flush();
    lock.lock();
  }
}

bool digest::allow(flood kind, const std::shared_ptr<spdlog::logger>& log,
                   spdlog::level::level_enum level) {
  if (!log->should_log(level)) return false;
  std::lock_guard lock(mutex_);
  auto& k = kinds_[static_cast<size_t>(kind)];
  if (burst_ == 0 || k.logged < burst_) {
    ++k.logged;
    return true;
  }
  ++k.suppressed;
  k.log = log;
  k.level = level;
  return false;
}

void digest::room_ended(bool decode, bool succeeded, errc code, uint64_t bytes) {
  std::lock_guard lock(mutex_);
  auto& s = sides_[decode];
  if (succeeded) {
    ++s.succeeded;
    s.bytes += bytes;
  } else {
    ++s.failed;
    ++s.by_code[code];
  }
}

void digest::flush() {
  // Taken under the lock, written after it: a sink may be slow, and allow() must not wait.
  std::vector<std::pair<kind_tally, size_t>> left_out;
  std::array<side_tally, 2> sides;
  std::shared_ptr<spdlog::logger> log;
  double seconds = 0;
  {
    std::lock_guard lock(mutex_);
    const auto now = std::chrono::steady_clock::now();
    seconds = std::chrono::duration<double>(now - since_).count();
    since_ = now;
    for (size_t i = 0; i < flood_kinds; ++i) {
      if (kinds_[i].suppressed) left_out.emplace_back(kinds_[i], i);
      kinds_[i].logged = kinds_[i].suppressed = 0;
    }
    sides = std::move(sides_);
    sides_ = {};
    log = log_;
  }
  for (const auto& [k, i] : left_out)
    if (k.log)
      k.log->log(k.level, "suppressed {} similar lines ({}) in the last {:.1f} s", k.suppressed,
                 kind_names[i], seconds);
  const auto& p = sides[0];
  const auto& d = sides[1];
  if (!log || p.succeeded + p.failed + d.succeeded + d.failed == 0) return;
  log->info("rooms in the last {:.1f} s: {}; {}", seconds,
            side_text("prefill", "sent", p.succeeded, p.failed, p.by_code, p.bytes),
            side_text("decode", "received", d.succeeded, d.failed, d.by_code, d.bytes));
}

}  // namespace ferry::logging
