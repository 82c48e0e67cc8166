#include "tools/soak/options.hpp"

#include <CLI/CLI.hpp>
#include <chrono>

#include "cli/common.hpp"

namespace ferry::soak {

std::optional<int> parse_options(int argc, char** argv, options& o) {
  CLI::App app{
      "ferry-soak: a bounded soak of a prefill and a decode ferryd: rooms at a target rate with "
      "random pages, chunks, reused ids and cancels; every room must be terminal on both sides "
      "within a bound and every Success byte-exact. Survives daemon restarts (rooms in flight on "
      "a dead daemon count as failed by restart)"};
  cli::add_version(app, "ferry-soak");
  app.footer(
      "Exit codes: 0 nothing lost, corrupted or leaked; 1 something was, or the run stopped; 2 "
      "usage, or daemons that cannot carry the run asked; 3 a daemon cannot be reached "
      "(docs/cli.md)");
  app.add_option("--prefill-socket", o.prefill_socket, "client socket of the prefill ferryd")
      ->capture_default_str();
  app.add_option("--decode-socket", o.decode_socket, "client socket of the decode ferryd")
      ->capture_default_str();
  app.add_option("--prefill-control", o.prefill_control,
                 "control address (host:port) a decode prepare names (default: the prefill's "
                 "listen.control from its hello)");
  app.add_option("--seconds", o.seconds, "how long to start rooms; the rooms in flight then drain")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--rate", o.rate,
                 "target rooms started per second (the achieved rate is reported)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1e6));
  app.add_option("--concurrency", o.concurrency, "rooms in flight at most")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--cancel-percent", o.cancel_percent,
                 "rooms cancelled, from a random side at a random phase")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  app.add_option("--max-pages", o.max_pages, "KV pages per room: 1..this, at random")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  app.add_option("--max-chunks", o.max_chunks, "chunks per room: 1..this, at random")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  app.add_option("--seed", o.seed, "random seed (default: time-based; printed)");
  app.add_option("--progress-seconds", o.progress_seconds, "a progress line every this many s")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--room-ids", o.room_ids,
                 "size of the pool of room ids, reused after terminal (default: 2 x concurrency)")
      ->check(CLI::Range(1, 1 << 24));
  app.add_option("--room-base", o.room_base, "first room id of the pool")->capture_default_str();
  app.add_option("--margin-ms", o.margin_ms,
                 "a room is LOST when a side is not terminal within the daemon's "
                 "timeouts.transfer_ms + drain_ms + this")
      ->capture_default_str()
      ->check(CLI::Range(0, 3600000));
  app.add_option("--reconnect-seconds", o.reconnect_seconds,
                 "give up when a daemon's socket does not accept a client again within this")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 3600.0));
  app.add_option("--request-timeout-ms", o.request_timeout_ms,
                 "a request unanswered this long breaks the connection (a hung daemon)")
      ->capture_default_str()
      ->check(CLI::Range(100, 3600000));
  if (auto rc = cli::parse(app, argc, argv)) return rc;
  if (o.seed == 0)
    o.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) &
             0xffffff;
  return std::nullopt;
}

}  // namespace ferry::soak
