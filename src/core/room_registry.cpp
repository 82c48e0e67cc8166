#include "core/room_registry.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace ferry {

result<> admit(size_t active, uint32_t limit, const char* side) {
  if (active < limit) return {};
  return error{errc::invalid_request,
               fmt::format("admission refused: {} rooms already active on the {} side "
                           "(limits.max_active_rooms = {})",
                           active, side, limit)};
}

result<> send_still_open(const bounded_map<uint64_t, finished_room>& finished, uint64_t room) {
  const auto* done = finished.find(room);
  if (!done) return {};
  const auto* status = to_string(done->status);
  return error{errc::room_finished,
               fmt::format("room {} already finished ({}); send after {} is rejected", room, status,
                           status)};
}

result<> late_prepare(const bounded_map<uint64_t, finished_room>& finished, uint64_t room) {
  const auto* f = finished.find(room);
  if (!f || !f->without_decode || f->status != room_status::failed) return {};
  return error{f->code == errc::ok ? errc::internal : f->code,
               fmt::format("room {} failed on the prefill before this decode prepared it: {}", room,
                           f->reason)};
}

error ended_before_prepare(uint64_t room, room_status s, const std::string& reason, errc code) {
  if (s == room_status::success)
    return error{
        errc::room_finished,
        fmt::format("room {} succeeded on the prefill before it took this decode's prepare "
                    "(every decode rank it feeds had prepared it)",
                    room)};
  return error{code == errc::ok ? errc::internal : code,
               fmt::format("room {} failed on the prefill before it took this decode's prepare: {}",
                           room, reason)};
}

result<> cancelled_rooms::prepare_allowed(uint64_t room, clock::time_point now) {
  const auto* until = until_.find(room);
  if (!until) return {};
  if (now >= *until) {
    until_.erase(room);
    return {};
  }
  return error{
      errc::cancelled,
      fmt::format("room {} was cancelled on the prefill before this decode prepared it", room)};
}

uint32_t longest_room_deadline_ms(const timeouts_config& t) {
  return std::max({t.bootstrapping_ms, t.waiting_for_input_ms, t.transferring_ms, t.transfer_ms});
}

proto::poll_reply unknown_polls::poll(uint64_t room, clock::time_point now,
                                      uint32_t bootstrapping_ms) {
  const auto first = first_.get_or_put(room, now);
  if (now - first < std::chrono::milliseconds(bootstrapping_ms))
    return proto::poll_reply{room, room_status::bootstrapping, {}, errc::ok};
  return proto::poll_reply{
      room, room_status::failed,
      fmt::format("timed out in Bootstrapping after {} ms: no prepare from a decode and no send "
                  "arrived (timeouts.bootstrapping_ms)",
                  bootstrapping_ms),
      errc::timed_out};
}

void unresponsive_peers::mark(const std::string& address, std::string why,
                              clock::time_point until) {
  down_.put(address, {std::move(why), until});
}

std::optional<std::string> unresponsive_peers::known_down(const std::string& address,
                                                          clock::time_point now) {
  const auto* d = down_.find(address);
  if (!d) return std::nullopt;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(d->second - now).count();
  if (left <= 0) {
    down_.erase(address);
    return std::nullopt;
  }
  return fmt::format("{} (not retried for another {} ms)", d->first, left);
}

}  // namespace ferry
