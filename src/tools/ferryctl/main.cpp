// ferryctl: inspect a ferryd and drive its client operations from the shell. With --json
// (before or after the command's name) every command prints one JSON document, its errors
// included ({"error": {"code", "message"}}); without it, text rendered from the same document.
// Exit codes (core/exit_codes.hpp, docs/cli.md): 0 ok, 1 the operation failed or ferryd refused
// it, 2 usage, 3 ferryd cannot be reached or the connection to it was lost, 4 timed out.

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstring>
#include <iostream>
#include <thread>
#include <tuple>

#include "cli/common.hpp"
#include "ferry/client.hpp"
#include "tools/ferryctl/render.hpp"
#include "tools/ferryctl/top.hpp"
#include "tools/workload/workload.hpp"

using namespace ferry;
using ctl::json;

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

/// Where a command's outcome goes: with --json its document on stdout, errors included;
/// otherwise its text on stdout and errors on stderr ("ferryctl: ..."). Each failure returns
/// its exit code.
struct output {
  bool json = false;
  /// The connection the command uses, once made: whether it was lost decides the exit code.
  const client::client* conn = nullptr;

  int done(const ctl::json& doc, const std::string& text, int rc = exit_code::ok) const {
    if (json)
      std::cout << doc.dump() << "\n";
    else
      std::cout << text;
    return rc;
  }
  int fail_with(int rc, errc code, const std::string& message, const std::string& text) const {
    if (json)
      std::cout << ctl::error_doc(code, message).dump() << "\n";
    else
      std::cerr << "ferryctl: " << text << "\n";
    return rc;
  }
  /// An operation that failed with `code`: unreachable when the connection to ferryd is gone
  /// (or never was made), timed_out for a timeout, failed for ferryd's refusals.
  int fail(errc code, const std::string& message, const std::string& text) const {
    return fail_with(exit_code::for_error(code, !conn || conn->lost()), code, message, text);
  }
  int fail(errc code, const std::string& message) const { return fail(code, message, message); }
  int usage(const std::string& message) const {
    return fail_with(exit_code::usage, errc::invalid_request, message, message);
  }

  /// The outcome of a request answered `ok` or `error`.
  int report(const ferry::result<>& r, const std::string& what, uint64_t room) const {
    if (!r)
      return fail(r.code, r.message,
                  fmt::format("{} failed [{}]: {}", what, to_string(r.code), r.message));
    return done({{"room", room}, {"room_id", std::to_string(room)}, {"ok", true}}, what + ": ok\n");
  }
};

/// An index the command named, or null.
json index_or_null(uint32_t i) { return i == no_index ? json(nullptr) : json(i); }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ferryctl: talk to a ferryd over its client socket"};
  cli::add_version(app, "ferryctl");
  app.require_subcommand(1);
  // Inherited by the commands: an option of ferryctl itself (--json, -s) may follow the
  // command's name too.
  app.fallthrough();
  output out;
  std::string socket = "/tmp/ferry-decode.sock";
  app.add_option("-s,--socket", socket, "ferryd client socket")->capture_default_str();
  app.add_flag("--json", out.json,
               "print one JSON document: the daemon's own for status, rooms, peers and pools, "
               "the outcome for the others, and errors as {\"error\": {\"code\", \"message\"}}");
  uint64_t room = 0;
  std::string pages_text, state_pages_text, address;
  std::vector<std::string> peer_args, prefill_peers;
  uint32_t slot = no_index, row = no_index, first_position = 0, prefix_tokens = 0;
  uint32_t first_layer = 0, layer_count = 0;
  bool last = false, checksum = false;
  int timeout_ms = 30000;

  auto* status = app.add_subcommand("status", "daemon status and counters");
  auto* rooms = app.add_subcommand("rooms", "active rooms");
  auto* peers = app.add_subcommand("peers", "connected peers");
  auto* pools = app.add_subcommand(
      "pools", "the pools: shm names, sizes, memory owner, items in use and free, layouts");
  auto* top = app.add_subcommand(
      "top", "a live view: rooms by side and status, outcomes and bytes per second, peers");
  ctl::top_options top_opts;
  top->add_option("--interval-ms", top_opts.interval_ms, "time between frames")
      ->capture_default_str()
      ->check(CLI::Range(10, 3600000));
  top->add_option("--count", top_opts.count, "stop after this many frames (0: until killed)")
      ->capture_default_str();
  auto* discover = app.add_subcommand(
      "discover", "every rank of an engine instance, from the address of one of its ferryds");
  discover->add_option("address", address, "host:port (control address of one rank)")->required();
  auto* drain = app.add_subcommand(
      "drain",
      "start the daemon's drain, as SIGTERM does: no new rooms, the accepted ones run to their "
      "end (bounded by timeouts.stop_ms), then ferryd exits 0");
  bool drain_wait = false;
  drain->add_flag("--wait", drain_wait, "return once ferryd has exited (bounded by --timeout-ms)");
  drain->add_option("--timeout-ms", timeout_ms, "with --wait: give up after this long")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  auto* log_level = app.add_subcommand(
      "log-level", "show the daemon's log levels, or set one logger's or every logger's level");
  std::string level;
  std::vector<std::string> loggers;
  log_level->add_option("level", level, "trace, debug, info, warn, error or off (none: show)");
  log_level
      ->add_option("--logger", loggers,
                   "only this logger: ferryd, scheduler, room, peer, client, transport "
                   "(repeatable; none: every logger)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  auto* ready =
      app.add_subcommand("wait-ready", "wait until the daemon accepts clients (for scripts)");
  ready->add_option("--timeout-ms", timeout_ms, "give up after this long")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
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
  for (auto* c : {prepare, send})
    c->add_option("--state-pages", state_pages_text,
                  "a paged state pool's pages (pools.mamba.type swa, dsa or minimax_index_k), "
                  "e.g. 30,31,2; with --last on a send");
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
  prepare->add_flag("--checksum", checksum,
                    "check the room end to end: Success only once what landed digests as the "
                    "prefill's did (protocol v10)");
  send->add_flag("--last", last, "this is the last chunk (carries state slot and aux row)");
  send->add_option("--first-layer", first_layer,
                   "layer-wise send: the first global layer id of the range (protocol v6)");
  send->add_option("--layer-count", layer_count,
                   "layer-wise send: layers in the range (0, the default: every layer of the "
                   "daemon's rank)");
  fill->add_option("--first-position", first_position, "request position of the first page");
  wait->add_option("--timeout-ms", timeout_ms, "give up after this long")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.footer(
      "Examples:\n"
      "  ferryctl -s /tmp/ferry-decode.sock prepare -r 7 --peer 127.0.0.1:7401 -p 100-163 "
      "--state-slot 2 --aux-row 2\n"
      "  ferryctl -s /tmp/ferry-prefill.sock fill -r 7 -p 0-63 --state-slot 1 --aux-row 1\n"
      "  ferryctl -s /tmp/ferry-prefill.sock send -r 7 -p 0-63 --last --state-slot 1 --aux-row 1\n"
      "  ferryctl -s /tmp/ferry-prefill.sock send -r 8 -p 0-63 --last --state-slot 2 --aux-row 2 "
      "--first-layer 0 --layer-count 24\n"
      "  ferryctl -s /tmp/ferry-decode.sock wait -r 7 && ferryctl -s /tmp/ferry-decode.sock verify "
      "-r 7 -p 100-163 "
      "--state-slot 2 --aux-row 2\n"
      "  ferryctl status -s /tmp/ferry-decode.sock --json\n"
      "  ferryctl -s /tmp/ferry-decode.sock top --interval-ms 500\n"
      "  ferryctl -s /tmp/ferry-prefill.sock log-level debug --logger peer\n"
      "  ferryctl -s /tmp/ferry-prefill.sock drain --wait --timeout-ms 60000\n"
      "Exit codes: 0 ok, 1 failed or refused, 2 usage, 3 ferryd unreachable or lost, 4 timed "
      "out (docs/cli.md)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A command line that does not parse is an error like any other under --json (help and
    // --version are not).
    const bool json_asked = std::any_of(
        argv + 1, argv + argc, [](const char* a) { return std::strcmp(a, "--json") == 0; });
    if (!json_asked || e.get_exit_code() == 0) return cli::exit_for(app, e);
    out.json = true;
    return out.usage(e.what());
  }

  std::vector<uint32_t> pages, state_pages;
  for (auto [text, list, name] : {std::tuple{&pages_text, &pages, "--pages"},
                                  std::tuple{&state_pages_text, &state_pages, "--state-pages"}}) {
    try {
      if (!text->empty()) *list = parse_pages(*text);
    } catch (const std::exception& e) {
      return out.usage(fmt::format("bad {} '{}': {}", name, *text, e.what()));
    }
  }
  if (*ready) {
    // Retry until the daemon has created its pools and socket and says it is ready as /readyz
    // does (the status document's `ready`: a client pool not registered is not), bounded.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    std::unique_ptr<client::client> c;
    for (;;) {
      std::string why;
      if (!c) {
        auto made = client::client::connect(socket, "ferryctl", std::chrono::seconds(10), false);
        if (made)
          c = std::move(made.value);
        else
          why = made.message;
      }
      if (c) {
        const auto& d = c->daemon();
        auto status = c->info(proto::info_topic::status);
        json doc = status ? json::parse(status.value, nullptr, false) : json();
        if (!status) {
          why = status.message;
          c.reset();  // lost: connect again
        } else if (doc.is_object() && doc.value("ready", true)) {
          return out.done(
              {{"ready", true}, {"node", d.node}, {"instance", d.instance}, {"role", d.role}},
              fmt::format("{} ({}) is ready\n", d.node, d.role));
        } else {
          why = doc.is_object() ? doc.value("not_ready", std::string("not ready"))
                                : std::string("ferryd's status is not a JSON document");
        }
      }
      if (std::chrono::steady_clock::now() >= deadline)
        return out.fail_with(exit_code::timed_out, errc::timed_out,
                             fmt::format("not ready after {} ms: {}", timeout_ms, why),
                             fmt::format("not ready after {} ms: {}", timeout_ms, why));
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // Each ferryctl command is its own connection: its rooms must outlive it.
  auto conn = client::client::connect(socket, "ferryctl", std::chrono::seconds(10), false);
  if (!conn) return out.fail_with(exit_code::unreachable, conn.code, conn.message, conn.message);
  auto& c = *conn.value;
  out.conn = &c;
  auto print_info = [&](proto::info_topic t) {
    auto r = c.info(t);
    if (!r) return out.fail(r.code, r.message);
    if (out.json) return std::cout << r.value << "\n", 0;  // the daemon's document, as is
    try {
      std::cout << ctl::render_info(t, json::parse(r.value));
    } catch (const json::exception& e) {
      return out.fail(
          errc::malformed_frame,
          fmt::format("ferryd's info answer is not the document expected: {}", e.what()));
    }
    return 0;
  };
  if (*status) return print_info(proto::info_topic::status);
  if (*rooms) return print_info(proto::info_topic::rooms);
  if (*peers) return print_info(proto::info_topic::peers);
  if (*pools) return print_info(proto::info_topic::pools);
  if (*top) {
    auto r = ctl::run_top(c, top_opts, out.json);
    return r ? exit_code::ok : out.fail(r.code, r.message);
  }
  if (*log_level) {
    if (!level.empty()) {
      if (loggers.empty()) loggers.emplace_back();  // every logger
      for (const auto& l : loggers)
        if (auto r = c.set_log_level(l, level); !r)
          return out.fail(r.code, r.message,
                          fmt::format("log-level failed [{}]: {}", to_string(r.code), r.message));
    }
    auto r = c.info(proto::info_topic::status);
    if (!r) return out.fail(r.code, r.message);
    json doc;
    try {
      doc = json::parse(r.value).at("log");
    } catch (const json::exception& e) {
      return out.fail(errc::malformed_frame,
                      fmt::format("ferryd's status has no log levels: {}", e.what()));
    }
    std::string text;
    for (const auto& [logger, lv] : doc.at("levels").items())
      text += fmt::format("{:<10} {}\n", logger, lv.get<std::string>());
    return out.done(doc, text);
  }
  if (*drain) {
    if (auto r = c.drain(); !r)
      return out.fail(r.code, r.message,
                      fmt::format("drain failed [{}]: {}", to_string(r.code), r.message));
    if (!drain_wait) return out.done({{"draining", true}}, "draining\n");
    // ferryd closes this connection as it exits: wait for that, bounded.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    while (!c.lost()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0)
        return out.fail_with(
            exit_code::timed_out, errc::timed_out,
            fmt::format("ferryd still runs {} ms after the drain began", timeout_ms),
            fmt::format("ferryd still runs {} ms after the drain began", timeout_ms));
      (void)c.next_event(left);
    }
    return out.done({{"draining", true}, {"stopped", true}}, "drained; ferryd stopped\n");
  }
  if (*discover) {
    auto r = c.discover(address);
    if (!r)
      return out.fail(r.code, r.message,
                      fmt::format("discover failed [{}]: {}", to_string(r.code), r.message));
    // A rank that nothing answers at is unreachable, as a daemon is (exit 3); the answer is
    // still printed, naming each rank and why it is down.
    auto doc = ctl::discover_doc(address, r.value);
    const bool all_up =
        std::all_of(r.value.ranks.begin(), r.value.ranks.end(), [](const auto& k) { return k.up; });
    return out.done(doc, ctl::render_discover(doc),
                    all_up && !r.value.ranks.empty() ? exit_code::ok : exit_code::unreachable);
  }
  for (const auto& arg : peer_args) {
    size_t start = 0;
    for (size_t comma; (comma = arg.find(',', start)) != std::string::npos; start = comma + 1)
      prefill_peers.push_back(arg.substr(start, comma - start));
    prefill_peers.push_back(arg.substr(start));
  }
  if (*prepare)
    return out.report(
        c.prepare({room, prefill_peers, pages, slot, row, prefix_tokens, state_pages, checksum}),
        fmt::format("prepare room {}", room), room);
  if (*send)
    return out.report(c.send({room, pages, last, slot, row, first_layer, layer_count, state_pages}),
                      fmt::format("send room {}", room), room);
  if (*cancel) return out.report(c.cancel(room), fmt::format("cancel room {}", room), room);
  if (*poll) {
    auto r = c.poll(room);
    if (!r)
      return out.fail(r.code, r.message,
                      fmt::format("poll failed [{}]: {}", to_string(r.code), r.message));
    const auto& p = r.value;
    return out.done(
        ctl::room_status_doc(room, p.status, p.code, p.reason, p.prefix_tokens),
        fmt::format(
            "room {}: {} ({}){}{}{}\n", room, to_string(p.status), static_cast<int>(p.status),
            p.reason.empty() ? "" : ": ", p.reason,
            p.prefix_tokens ? fmt::format(" (decode prefix {} tokens)", p.prefix_tokens) : ""));
  }
  if (*wait) {
    if (auto s = c.subscribe(room); !s)
      return out.report(s, fmt::format("subscribe room {}", room), room);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    json events = json::array();
    for (;;) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      auto e = c.next_event(std::max(left, std::chrono::milliseconds(1)));
      // A timeout exits timed_out, a lost daemon unreachable (out.fail tells them apart).
      if (!e)
        return out.fail(e.code,
                        e.code == errc::timed_out && !c.lost()
                            ? fmt::format("room {}: not terminal after {} ms", room, timeout_ms)
                            : e.message);
      const auto& ev = e.value;
      if (ev.room != room) continue;
      auto doc = ctl::room_status_doc(room, ev.status, ev.code, ev.reason, ev.prefix_tokens);
      events.push_back(doc);
      // Text: each status change as it comes. JSON: one document at the end, with them all.
      if (!out.json)
        std::cout << fmt::format("room {}: {}{}{}\n", room, to_string(ev.status),
                                 ev.reason.empty() ? "" : ": ", ev.reason)
                  << std::flush;
      if (!is_terminal(ev.status)) continue;
      doc["events"] = std::move(events);
      return out.done(doc, "",
                      ev.status == room_status::success ? exit_code::ok : exit_code::failed);
    }
  }
  if (auto m = c.map_pools(); !m) return out.fail(m.code, m.message);
  if (*fill) {
    auto filled = client::fill_kv(c, room, pages, first_position);
    if (filled) filled = client::fill_state_and_aux(c, room, slot, row);
    if (!filled) return out.fail(filled.code, "fill failed: " + filled.message);
    return out.done({{"room", room},
                     {"room_id", std::to_string(room)},
                     {"filled", true},
                     {"pages", pages.size()},
                     {"state_slot", index_or_null(slot)},
                     {"aux_row", index_or_null(row)}},
                    fmt::format("room {}: pattern written to {} pages{}\n", room, pages.size(),
                                slot != no_index ? ", state slot and aux row" : ""));
  }
  if (*verify) {
    auto verified = client::verify_room(c, room, pages, slot, row);
    if (!verified) {
      // A mismatch is the command's answer, not a failure to ask: a document, exit status 1.
      if (out.json)
        return out.done({{"room", room},
                         {"room_id", std::to_string(room)},
                         {"verified", false},
                         {"reason", verified.message}},
                        "", exit_code::failed);
      return std::cerr << "ferryctl: verify failed: " << verified.message << "\n",
             exit_code::failed;
    }
    return out.done({{"room", room}, {"room_id", std::to_string(room)}, {"verified", true}},
                    fmt::format("room {}: all destination bytes verified\n", room));
  }
  return 0;
}
