#pragma once
/// ferry-bench's scale modes (issue 13, item 7), in their own files so the rest of the bench
/// changes without them:
///
/// - `--hold N` (scale.cpp): N rooms prepared and waiting at once on one prefill/decode pair,
///   then sent together; each daemon's resident memory before, with the N rooms open and after
///   (read from /proc through the client socket's SO_PEERCRED pid), and the committed rate
///   against waves of `--hold-reference` rooms (100) of the same size in the same run. With
///   `--sustain-s S` it then keeps N rooms open for S seconds, `--sustain-window` of them
///   flowing at a time, and samples the memory again, to catch growth.
/// - `--fan-in-socket A,B,...` (scale_fan_in.cpp): several independent prefill instances (each its
///   own node, control address and client socket, unlike `--prefill-socket`, whose sockets are
///   the ranks of one TP/PP instance) feed the decode together; the rate (rooms/s, GB/s) against
///   the first of them alone feeding it, in the same run.
///
/// Single-threaded, like the rest of ferry-bench.

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry::bench::scale {

/// The scale modes' own options.
struct options {
  uint32_t hold = 0;             ///< --hold: rooms prepared and waiting at once (0: off)
  uint32_t reference = 100;      ///< --hold-reference: rooms per wave of the reference rate
  double sustain_s = 0;          ///< --sustain-s: then N rooms open for this long (0: skip)
  uint32_t sustain_window = 64;  ///< --sustain-window: of them, sent and not ended at most
  double sample_s = 5;           ///< --sample-s: memory sampled this often while sustaining
  std::vector<std::string> fan_in_sockets;  ///< --fan-in-socket: one per prefill instance
};

/// What the rest of the command line says, as the scale modes read it.
struct common {
  std::vector<std::string> prefill_sockets, decode_sockets;
  uint32_t prompt_tokens = 16;
  uint32_t requests = 0;
  uint32_t concurrency = 0;
  uint32_t repeat = 1;
  bool verify = false;
  uint64_t room_base = 0;
  std::string json;  ///< "-": the document on stdout, the text on stderr; a file; or none
};

/// Register the options on `app`.
void add_options(CLI::App& app, options& o);
/// Whether a scale mode was asked for.
inline bool wanted(const options& o) { return o.hold > 0 || !o.fan_in_sockets.empty(); }
/// Run the mode asked for; the process's exit code (core/exit_codes.hpp).
int run(const options& o, const common& c);

}  // namespace ferry::bench::scale
