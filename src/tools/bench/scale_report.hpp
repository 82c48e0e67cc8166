#pragma once
/// What the scale modes share beyond the rooms: the text report and the JSON document, the pools
/// every daemon of a run has, and the dispatch (scale.cpp) to each mode's file.

#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "tools/bench/scale.hpp"
#include "tools/bench/scale_rooms.hpp"

namespace ferry::bench::scale {

/// The report of a run: prose on `text`, figures in `out`, printed once by `finish`.
struct report {
  const common& c;
  std::ostream& text;
  nlohmann::json out = nlohmann::json::object();

  /// A run that stopped early: its reason on stderr (and as the one document under `--json -`).
  int fail(const stop& s);
  /// Emit the document (stdout or the --json file); `ok` decides the exit code.
  int finish(bool ok);
};

/// The smallest item counts of a pool over the ranks of some instances (~0: a rank lacks it).
uint64_t min_items(const std::vector<const instance*>& of, pool_kind k);
/// Pages per room, or 0 when the instances disagree on page_tokens.
uint32_t pages_per_room(const std::vector<const instance*>& of, uint32_t tokens);
/// Whether `conc` rooms of `ppr` pages fit: kv pages on the decode and on each source, state
/// slots and aux rows on every daemon of `all`; a usage error naming what is short.
maybe_stop check_fit(uint32_t conc, uint32_t ppr, const instance& decode,
                     const std::vector<const instance*>& sources,
                     const std::vector<const instance*>& all);
/// The daemons' provider as their status says (the first rank of `i`).
std::string provider_of(instance& i);
/// `fabric.write_piece_bytes` of the first rank of `i`.
uint64_t piece_bytes_of(const instance& i);
/// {rss_kib, anon_kib, shmem_kib} (null when unread).
nlohmann::json to_json(const std::optional<daemon_memory>& m);
/// Each committed room's latency summary: {p50, p99, samples}.
nlohmann::json latency_json(const std::vector<double>& ms);

/// A daemon (one rank) whose CPU and memory a run reads, and which side it is.
struct daemon_ref {
  std::string side;
  client::client* c;
};
/// CPU seconds of each daemon and, last, of this process.
std::vector<double> cpu(const std::vector<daemon_ref>& ds);
/// Milliseconds of CPU per room between two `cpu` readings, summed by side, and of the bench.
nlohmann::json cpu_per_room(const std::vector<daemon_ref>& ds, const std::vector<double>& a,
                            const std::vector<double>& b, uint64_t rooms);
/// "side 0.123 ms, ..." of a `cpu_per_room` document.
std::string cpu_text(const nlohmann::json& c);

int run_hold(const options& o, report& rep);
int run_fan_in(const options& o, report& rep);

}  // namespace ferry::bench::scale
