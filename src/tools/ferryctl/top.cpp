// ferryctl top: frames from the info documents, their text, and the refresh loop.

#include "tools/ferryctl/top.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <thread>

namespace ferry::ctl {

namespace {

/// The statuses a room is active in, in the order a room goes through them.
constexpr const char* active_statuses[] = {"Bootstrapping", "WaitingForInput", "Transferring"};
constexpr const char* sides[] = {"prefill", "decode"};

/// (now - before) / elapsed_s, or null when there is no previous frame to compare with.
json rate(const json& now, const json& before, double elapsed_s) {
  if (before.is_null() || elapsed_s <= 0) return nullptr;
  const double d = now.get<double>() - before.get<double>();
  return d / elapsed_s;
}

std::string rate_text(const json& r) {
  return r.is_null() ? std::string("-") : fmt::format("{:.1f}", r.get<double>());
}

std::string bytes_rate_text(const json& r) {
  if (r.is_null()) return "-";
  const double v = r.get<double>();
  if (v >= 1e9) return fmt::format("{:.2f} GB/s", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.1f} MB/s", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f} kB/s", v / 1e3);
  return fmt::format("{:.0f} B/s", v);
}

}  // namespace

json top_frame(uint64_t frame, const json& status, const json& rooms, const json& peers,
               const json& previous, double elapsed_s) {
  json f = {{"frame", frame},
            {"node", status.at("node")},
            {"role", status.at("role")},
            {"elapsed_s", previous.is_null() ? json(nullptr) : json(elapsed_s)},
            {"clients", status.at("clients")}};
  json by_side = json::object();
  for (const char* side : sides) {
    const auto& s = status.at(side);
    json by_status = json::object();
    for (const char* st : active_statuses) by_status[st] = 0;
    for (const auto& r : rooms)
      if (r.at("side") == side) {
        const auto st = r.at("status").get<std::string>();
        by_status[st] = by_status.value(st, 0) + 1;
      }
    const json* before = previous.is_null() ? nullptr : &previous.at("rooms").at(side);
    auto was = [&](const char* key) { return before ? before->at(key) : json(nullptr); };
    by_side[side] = {{"active", s.at("active")},
                     {"by_status", by_status},
                     {"succeeded", s.at("succeeded")},
                     {"failed", s.at("failed")},
                     {"bytes", s.at("bytes")},
                     {"succeeded_per_s", rate(s.at("succeeded"), was("succeeded"), elapsed_s)},
                     {"failed_per_s", rate(s.at("failed"), was("failed"), elapsed_s)},
                     {"bytes_per_s", rate(s.at("bytes"), was("bytes"), elapsed_s)}};
  }
  f["rooms"] = by_side;
  json ps = json::array();
  for (const auto& p : peers) {
    json one = {{"address", p.at("address")}, {"state", p.at("state")}};
    if (p.contains("node")) one["node"] = p.at("node");
    ps.push_back(one);
  }
  f["peers"] = ps;
  return f;
}

std::string render_top(const json& f) {
  std::string o =
      fmt::format("{} ({})  clients {}  peers {}  frame {}{}\n", f.at("node").get<std::string>(),
                  f.at("role").get<std::string>(), f.at("clients").dump(), f.at("peers").size(),
                  f.at("frame").dump(),
                  f.at("elapsed_s").is_null()
                      ? std::string()
                      : fmt::format(", {:.2f} s since the last", f.at("elapsed_s").get<double>()));
  o += fmt::format("{:<8} {:>6} {:>13} {:>15} {:>12} {:>10} {:>7} {:>7} {:>7} {:>11}\n", "side",
                   "active", "Bootstrapping", "WaitingForInput", "Transferring", "succeeded", "/s",
                   "failed", "/s", "bytes/s");
  for (const char* side : sides) {
    const auto& s = f.at("rooms").at(side);
    const auto& b = s.at("by_status");
    o += fmt::format("{:<8} {:>6} {:>13} {:>15} {:>12} {:>10} {:>7} {:>7} {:>7} {:>11}\n", side,
                     s.at("active").dump(), b.at("Bootstrapping").dump(),
                     b.at("WaitingForInput").dump(), b.at("Transferring").dump(),
                     s.at("succeeded").dump(), rate_text(s.at("succeeded_per_s")),
                     s.at("failed").dump(), rate_text(s.at("failed_per_s")),
                     bytes_rate_text(s.at("bytes_per_s")));
  }
  if (f.at("peers").empty()) return o + "no peers\n";
  o += "peers:\n";
  for (const auto& p : f.at("peers"))
    o += fmt::format("  {} {}{}\n", p.at("address").get<std::string>(),
                     p.at("state").get<std::string>(),
                     p.contains("node") ? " node=" + p.at("node").get<std::string>() : "");
  return o;
}

result<> run_top(client::client& c, const top_options& o, bool json_lines) {
  using clock = std::chrono::steady_clock;
  const bool terminal = !json_lines && isatty(STDOUT_FILENO);
  json previous;
  clock::time_point previous_at{};
  auto next = clock::now();
  for (uint64_t frame = 1; o.count == 0 || frame <= o.count; ++frame) {
    if (frame > 1) {  // the refresh interval: this is what top is for, not a synchronisation
      next += std::chrono::milliseconds(o.interval_ms);
      std::this_thread::sleep_until(next);
    }
    json docs[3];
    const proto::info_topic topics[] = {proto::info_topic::status, proto::info_topic::rooms,
                                        proto::info_topic::peers};
    const char* names[] = {"status", "rooms", "peers"};
    const auto at = clock::now();
    for (int i = 0; i < 3; ++i) {
      auto r = c.info(topics[i]);
      if (!r) return r.error();
      docs[i] = json::parse(r.value, nullptr, false);
      if (docs[i].is_discarded())
        return error{errc::malformed_frame,
                     fmt::format("ferryd's {} answer is not JSON", names[i])};
    }
    json f;
    try {
      f = top_frame(frame, docs[0], docs[1], docs[2], previous,
                    std::chrono::duration<double>(at - previous_at).count());
    } catch (const json::exception& e) {
      return error{errc::malformed_frame,
                   fmt::format("ferryd's info answer is not the document expected: {}", e.what())};
    }
    if (json_lines)
      std::cout << f.dump() << "\n";
    else
      std::cout << (terminal ? "\x1b[H\x1b[2J" : (frame > 1 ? "\n" : "")) << render_top(f);
    std::cout << std::flush;
    previous = std::move(f);
    previous_at = at;
  }
  return {};
}

}  // namespace ferry::ctl
