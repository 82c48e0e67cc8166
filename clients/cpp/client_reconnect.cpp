// The C++ client's side of a lost connection (ferry/client.hpp, reconnect_policy): noticing the
// loss, attempting again with backoff, registering the engine's memory again, and telling the
// engine through on_connection. The requests themselves are in client.cpp.

#include <fmt/format.h>

#include <algorithm>
#include <string_view>
#include <thread>

#include "ferry/client.hpp"

namespace ferry::client {

namespace {

/// The wait after failed attempt number `attempt` (1, 2, ...).
std::chrono::milliseconds backoff(const reconnect_policy& p, uint32_t attempt) {
  double ms = static_cast<double>(p.initial_delay.count());
  for (uint32_t i = 1; i < attempt && ms < static_cast<double>(p.max_delay.count()); ++i)
    ms *= p.multiplier;
  return std::min(p.max_delay, std::chrono::milliseconds(static_cast<int64_t>(ms)));
}

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

result<none> client::enter() {
  if (attempting_) return {};
  if (in_callback_)
    return error{errc::invalid_request,
                 "a connection callback (on_connection) must not call its client; note what "
                 "happened and act after the call that gave the notice returns"};
  if (!policy_ || !lost_) return {};
  return ensure_connected(policy_->call_wait, false);
}

result<none> client::reconnect(std::chrono::milliseconds wait) {
  if (in_callback_)
    return error{errc::invalid_request,
                 "a connection callback (on_connection) must not call its client"};
  if (!policy_)
    return error{errc::invalid_request,
                 "reconnect: this client was connected without a reconnect_policy "
                 "(connect_options::reconnect); make a new client instead"};
  if (wait.count() < 0) wait = std::chrono::milliseconds(0);
  return ensure_connected(wait, true);
}

result<none> client::ensure_connected(std::chrono::milliseconds wait, bool now) {
  if (!lost_) return {};
  if (gave_up_) return unavailable();
  const auto deadline = std::chrono::steady_clock::now() + wait;
  // Within one call, attempts are at least this far apart even with a zero backoff.
  constexpr auto spacing = std::chrono::milliseconds(10);
  std::chrono::steady_clock::time_point earliest{};
  for (;;) {
    const auto t = std::chrono::steady_clock::now();
    if (now || (t >= next_attempt_ && t >= earliest)) {
      now = false;
      auto n = attempt_once(attempts_ + 1);
      if (n) {
        ++generation_;
        n.value.generation = generation_;
        n.value.downtime = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - down_since_);
        attempts_ = 0;
        attempt_error_ = {};
        notify(n.value);
        return {};
      }
      ++attempts_;
      attempt_error_ = std::move(n).error();
      if (policy_->max_attempts && attempts_ >= policy_->max_attempts) {
        gave_up_ = true;
        connection_notice g;
        g.what = connection_notice::kind::disconnected;
        g.error = unavailable();
        g.reconnecting = false;
        notify(g);
        return unavailable();
      }
      const auto after = std::chrono::steady_clock::now();
      next_attempt_ = after + backoff(*policy_, attempts_);
      earliest = after + spacing;
      if (after >= deadline) return unavailable();
      continue;
    }
    if (t >= deadline) return unavailable();
    // The backoff, within the bound the caller gave this call.
    std::this_thread::sleep_until(std::min(std::max(next_attempt_, earliest), deadline));
  }
}

result<connection_notice> client::attempt_once(uint32_t attempt) {
  struct attempting {
    bool& flag;
    explicit attempting(bool& f) : flag(f) { flag = true; }
    ~attempting() { flag = false; }
  } guard(attempting_);
  if (auto h = handshake(policy_->attempt_timeout); !h) return std::move(h).error();
  connection_notice n;
  n.what = connection_notice::kind::reconnected;
  n.attempts = attempt;
  n.instance = hello_.instance;
  n.previous_instance = lost_instance_;
  const auto saved_timeout = timeout_;
  timeout_ = policy_->attempt_timeout;
  for (const auto& reg : registrations_) {
    auto r = register_again(reg);
    if (r) {
      n.registered.push_back(reg.req.pool);
      continue;
    }
    if (lost_) {  // the new connection broke: this attempt failed
      timeout_ = saved_timeout;
      if (fd_ >= 0) close(fd_);
      fd_ = -1;
      return error{
          r.code, fmt::format("registering pool {} again: {}", to_string(reg.req.pool), r.message)};
    }
    n.not_registered.push_back({reg.req.pool, std::move(r).error()});
  }
  timeout_ = saved_timeout;
  // A restarted ferryd's shm objects are new (even under the same name): the old mappings
  // share nothing with it.
  for (int k = 0; k < pool_kind_count; ++k) {
    if (!was_mapped_[k]) continue;
    was_mapped_[k] = false;
    pools_[k] = shm_region{};
    const auto kind = static_cast<pool_kind>(k);
    const auto& p = hello_.pools[k];
    if (!p.present || p.shm_name.empty()) {
      n.not_remapped.push_back(
          {kind,
           {errc::invalid_request,
            fmt::format("pool {}: the daemon at {} has {} now", to_string(kind), socket_path_,
                        p.present ? "client memory there" : "no such pool")}});
      continue;
    }
    auto m = shm_region::open(p.shm_name, p.layout.total_bytes);
    if (!m) {
      n.not_remapped.push_back({kind, std::move(m).error()});
      continue;
    }
    pools_[k] = std::move(m.value);
    n.remapped.push_back(kind);
  }
  return n;
}

result<none> client::register_again(const registration& reg) {
  const auto deadline = std::chrono::steady_clock::now() + policy_->attempt_timeout;
  for (;;) {
    auto r = send_register(reg.req, reg.fds);
    // The same daemon, after a broken connection, may still be releasing the old registration.
    if (r || lost_ || r.message.find("is still being released") == std::string::npos ||
        std::chrono::steady_clock::now() >= deadline)
      return r;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

ferry::error client::unavailable() const {
  if (gave_up_)
    return {attempt_error_.code,
            fmt::format("gave up reconnecting to ferryd at {} after {} attempts: {}", socket_path_,
                        attempts_, attempt_error_.message)};
  const auto t = std::chrono::steady_clock::now();
  const std::string tried =
      attempts_ ? fmt::format("attempt {} failed: {}", attempts_, attempt_error_.message)
                : std::string("no attempt made yet");
  return {errc::peer_unreachable,
          fmt::format("not connected to ferryd at {}: the connection was lost {:.1f} s ago ({}); "
                      "reconnecting ({}; the next attempt is made by a call from {:.2f} s on)",
                      socket_path_, seconds(t - down_since_), loss_.message, tried,
                      std::max(0.0, seconds(next_attempt_ - t)))};
}

void client::note_lost(const ferry::error& e) {
  loss_ = e;
  down_since_ = next_attempt_ = std::chrono::steady_clock::now();  // the first attempt at once
  attempts_ = 0;
  attempt_error_ = {};
  lost_instance_ = hello_.instance;
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  for (int k = 0; k < pool_kind_count; ++k) was_mapped_[k] = was_mapped_[k] || bool(pools_[k]);
  const bool drained = draining_;
  const std::string reason = fmt::format(
      "ferryd at {} went away ({}) before the room ended; a room does not survive its ferryd: a "
      "restarted daemon does not know it",
      socket_path_, drained ? "it drained and stopped" : e.message);
  std::vector<uint64_t> rooms(subscribed_.begin(), subscribed_.end());
  subscribed_.clear();
  std::sort(rooms.begin(), rooms.end());
  for (uint64_t room : rooms) {
    events_.push(proto::event{room, room_status::failed, reason, errc::peer_lost, 0});
    lost_rooms_.insert(room);
  }
  connection_notice n;
  n.what = connection_notice::kind::disconnected;
  n.error = e;
  n.failed_rooms = std::move(rooms);
  n.reconnecting = true;
  n.drained = drained;
  notify(n);
}

void client::notify(const connection_notice& n) {
  if (!on_connection_) return;
  struct in_callback {
    bool& flag;
    explicit in_callback(bool& f) : flag(f) { flag = true; }
    ~in_callback() { flag = false; }
  } guard(in_callback_);
  on_connection_(n);
}

void client::note_event(const proto::event& ev) {
  if (is_terminal(ev.status)) subscribed_.erase(ev.room);
}

void client::note_draining(const ferry::error& e) {
  if (draining_) return;
  draining_ = true;
  if (!policy_) return;
  connection_notice n;
  n.what = connection_notice::kind::draining;
  n.message = e.message;
  notify(n);
}

void client::forget_lost(uint64_t room) {
  if (lost_rooms_.erase(room) == 0) return;
  events_.erase_room(room, [](const proto::event& e) {
    return e.status == room_status::failed && e.code == errc::peer_lost;
  });
}

}  // namespace ferry::client
