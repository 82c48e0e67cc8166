// ferryctl: inspect a ferryd and drive its client operations from the shell.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <thread>

#include "ferry/client.hpp"
#include "ferry/workload.hpp"

using namespace ferry;

namespace {

/// Parse "0-3,7,9-10" into [0,1,2,3,7,9,10].
std::vector<uint32_t> parse_pages(const std::string& text) {
  std::vector<uint32_t> out;
  size_t pos = 0;
  while (pos < text.size()) {
    auto end = text.find(',', pos);
    auto part = text.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    auto dash = part.find('-');
    if (part.empty())
      throw CLI::ValidationError("--pages", "empty entry in page list '" + text + "'");
    uint64_t a = std::stoull(part.substr(0, dash));
    uint64_t b = dash == std::string::npos ? a : std::stoull(part.substr(dash + 1));
    if (b < a || b - a > (1u << 24))
      throw CLI::ValidationError("--pages", "bad range '" + part + "'");
    for (uint64_t i = a; i <= b; ++i) out.push_back(static_cast<uint32_t>(i));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  return out;
}

int report(const ferry::result<ferry::none>& r, const std::string& what) {
  if (r) {
    std::cout << what << ": ok\n";
    return 0;
  }
  std::cerr << "ferryctl: " << what << " failed [" << to_string(r.code) << "]: " << r.message
            << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferryctl: talk to a ferryd over its client socket"};
  app.require_subcommand(1);
  std::string socket = "/tmp/ferry-decode.sock";
  app.add_option("-s,--socket", socket, "ferryd client socket")->capture_default_str();
  uint64_t room = 0;
  std::string pages_text;
  std::vector<std::string> peer_args, prefill_peers;
  uint32_t slot = no_index, row = no_index, first_position = 0, prefix_tokens = 0;
  bool last = false;
  int timeout_ms = 30000;

  auto* status = app.add_subcommand("status", "daemon status and counters");
  auto* rooms = app.add_subcommand("rooms", "active rooms");
  auto* peers = app.add_subcommand("peers", "connected peers");
  auto* hello = app.add_subcommand("pools", "pool names and layouts the daemon hands to clients");
  auto* ready =
      app.add_subcommand("wait-ready", "wait until the daemon accepts clients (for scripts)");
  ready->add_option("--timeout-ms", timeout_ms, "give up after this long")->capture_default_str();
  auto* prepare = app.add_subcommand("prepare", "decode side: where a room's bytes must land");
  auto* send = app.add_subcommand("send", "prefill side: send one chunk of a room");
  auto* poll = app.add_subcommand("poll", "status of a room");
  auto* cancel = app.add_subcommand("cancel", "cancel a room");
  auto* wait = app.add_subcommand("wait", "subscribe and print status events until the room ends");
  auto* fill = app.add_subcommand(
      "fill", "write the test pattern of a room into this daemon's source pools");
  auto* verify =
      app.add_subcommand("verify", "check a room's destination bytes against the test pattern");
  for (auto* c : {prepare, send, poll, cancel, wait, fill, verify})
    c->add_option("-r,--room", room, "room id")->required();
  for (auto* c : {prepare, send, fill, verify})
    c->add_option("-p,--pages", pages_text, "page list, e.g. 0-15,40,41");
  for (auto* c : {prepare, send, fill, verify}) {
    c->add_option("--state-slot", slot, "the one Mamba state slot");
    c->add_option("--aux-row", row, "the aux row");
  }
  // One value per occurrence, split on commas here so an empty entry reaches ferryd (which
  // names it) instead of CLI11 swallowing the next option as a peer.
  prepare
      ->add_option("--peer", peer_args,
                   "prefill ferryd control address host:port; repeat or comma-separate to name "
                   "every prefill rank (ferryd picks the ones this rank needs)")
      ->required()
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  prepare->add_option("--prefix-tokens", prefix_tokens,
                      "tokens of the prompt the decode already holds (a multiple of the page "
                      "size); the prefill's poll answers it");
  send->add_flag("--last", last, "this is the last chunk (carries state slot and aux row)");
  fill->add_option("--first-position", first_position, "request position of the first page");
  wait->add_option("--timeout-ms", timeout_ms, "give up after this long")->capture_default_str();
  app.footer(
      "Examples:\n"
      "  ferryctl -s /tmp/ferry-decode.sock prepare -r 7 --peer 127.0.0.1:7401 -p 100-163 "
      "--state-slot 2 --aux-row 2\n"
      "  ferryctl -s /tmp/ferry-prefill.sock fill -r 7 -p 0-63 --state-slot 1 --aux-row 1\n"
      "  ferryctl -s /tmp/ferry-prefill.sock send -r 7 -p 0-63 --last --state-slot 1 --aux-row 1\n"
      "  ferryctl -s /tmp/ferry-decode.sock wait -r 7 && ferryctl -s /tmp/ferry-decode.sock verify "
      "-r 7 -p 100-163 "
      "--state-slot 2 --aux-row 2");
  CLI11_PARSE(app, argc, argv);

  std::vector<uint32_t> pages;
  try {
    if (!pages_text.empty()) pages = parse_pages(pages_text);
  } catch (const std::exception& e) {
    std::cerr << "ferryctl: bad --pages '" << pages_text << "': " << e.what() << "\n";
    return 1;
  }
  if (*ready) {
    // Retry the connect until the daemon has created its pools and socket, bounded in time.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      auto c = client::client::connect(socket, "ferryctl", std::chrono::seconds(10), false);
      if (c) {
        std::cout << fmt::format("{} ({}) is ready\n", c.value->daemon().node,
                                 c.value->daemon().role);
        return 0;
      }
      if (std::chrono::steady_clock::now() >= deadline)
        return std::cerr << "ferryctl: not ready after " << timeout_ms << " ms: " << c.message
                         << "\n",
               1;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Each ferryctl command is its own connection: its rooms must outlive it.
  auto conn = client::client::connect(socket, "ferryctl", std::chrono::seconds(10), false);
  if (!conn) {
    std::cerr << "ferryctl: " << conn.message << "\n";
    return 1;
  }
  auto& c = *conn.value;
  auto print_info = [&](proto::info_topic t) {
    auto r = c.info(t);
    if (!r) return std::cerr << "ferryctl: " << r.message << "\n", 1;
    std::cout << r.value;
    return 0;
  };
  if (*status) return print_info(proto::info_topic::status);
  if (*rooms) return print_info(proto::info_topic::rooms);
  if (*peers) return print_info(proto::info_topic::peers);
  if (*hello) {
    const auto& d = c.daemon();
    std::cout << fmt::format("node {} instance {} role {} tp {}/{}\n", d.node, d.instance, d.role,
                             d.tp_rank, d.tp_size);
    for (int k = 0; k < pool_kind_count; ++k) {
      const auto& p = d.pools[k];
      if (!p.present) continue;
      std::cout << fmt::format("pool {}: {} ({} bytes)\n", to_string(static_cast<pool_kind>(k)),
                               p.shm_name, p.layout.total_bytes);
      // One line per run of buffers of the same shape (K, V, each state tensor, aux).
      const auto& b = p.layout.buffers;
      for (size_t i = 0; i < b.size();) {
        size_t j = i;
        while (j < b.size() && b[j].kind == b[i].kind && b[j].tensor == b[i].tensor &&
               b[j].item_bytes == b[i].item_bytes)
          ++j;
        static constexpr const char* kinds[] = {"K", "V", "KV", "state tensor", "aux"};
        auto what = b[i].kind == buffer_kind::state
                        ? fmt::format("state tensor {}", b[i].tensor)
                        : std::string(kinds[static_cast<int>(b[i].kind)]);
        std::cout << fmt::format("  {}: {} buffer(s) of {} x {} bytes\n", what, j - i, b[i].items,
                                 b[i].item_bytes);
        i = j;
      }
    }
    return 0;
  }
  for (const auto& arg : peer_args) {
    size_t start = 0;
    for (size_t comma; (comma = arg.find(',', start)) != std::string::npos; start = comma + 1)
      prefill_peers.push_back(arg.substr(start, comma - start));
    prefill_peers.push_back(arg.substr(start));
  }
  if (*prepare)
    return report(c.prepare({room, prefill_peers, pages, slot, row, prefix_tokens}),
                  fmt::format("prepare room {}", room));
  if (*send)
    return report(c.send({room, pages, last, slot, row}), fmt::format("send room {}", room));
  if (*cancel) return report(c.cancel(room), fmt::format("cancel room {}", room));
  if (*poll) {
    auto r = c.poll(room);
    if (!r)
      return std::cerr << "ferryctl: poll failed [" << to_string(r.code) << "]: " << r.message
                       << "\n",
             1;
    std::cout << fmt::format(
        "room {}: {} ({}){}{}{}\n", room, to_string(r.value.status),
        static_cast<int>(r.value.status), r.value.reason.empty() ? "" : ": ", r.value.reason,
        r.value.prefix_tokens ? fmt::format(" (decode prefix {} tokens)", r.value.prefix_tokens)
                              : "");
    return 0;
  }
  if (*wait) {
    if (auto s = c.subscribe(room); !s) return report(s, fmt::format("subscribe room {}", room));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      auto e = c.next_event(std::max(left, std::chrono::milliseconds(1)));
      if (!e) return std::cerr << "ferryctl: " << e.message << "\n", 1;
      if (e.value.room != room) continue;
      std::cout << fmt::format("room {}: {}{}{}\n", room, to_string(e.value.status),
                               e.value.reason.empty() ? "" : ": ", e.value.reason);
      if (is_terminal(e.value.status)) return e.value.status == room_status::success ? 0 : 1;
    }
  }
  if (auto m = c.map_pools(); !m) return std::cerr << "ferryctl: " << m.message << "\n", 1;
  if (*fill) {
    auto filled = client::fill_kv(c, room, pages, first_position);
    if (filled) filled = client::fill_state_and_aux(c, room, slot, row);
    if (!filled) return std::cerr << "ferryctl: fill failed: " << filled.message << "\n", 1;
    std::cout << fmt::format("room {}: pattern written to {} pages{}\n", room, pages.size(),
                             slot != no_index ? ", state slot and aux row" : "");
    return 0;
  }
  if (*verify) {
    auto verified = client::verify_room(c, room, pages, slot, row);
    if (!verified) return std::cerr << "ferryctl: verify failed: " << verified.message << "\n", 1;
    std::cout << fmt::format("room {}: all destination bytes verified\n", room);
    return 0;
  }
  return 0;
}
