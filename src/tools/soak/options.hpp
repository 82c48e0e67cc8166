#pragma once
/// ferry-soak's command line: what a run is asked to do, and how the defaults are chosen.

#include <cstdint>
#include <optional>
#include <string>

namespace ferry::soak {

struct options {
  std::string prefill_socket = "/tmp/ferry-prefill.sock";
  std::string decode_socket = "/tmp/ferry-decode.sock";
  std::string prefill_control;  // empty: the prefill's listen.control, from its hello
  double seconds = 60;
  double rate = 1000;
  uint32_t concurrency = 64;
  double cancel_percent = 10;
  uint32_t max_pages = 8;
  uint32_t max_chunks = 3;
  uint64_t seed = 0;
  double progress_seconds = 10;
  uint32_t room_ids = 0;  // 0: 2 x concurrency
  uint64_t room_base = 0x50ac'0000'0000ull;
  uint32_t margin_ms = 5000;
  double reconnect_seconds = 60;
  uint32_t request_timeout_ms = 20000;
};

/// Fill `o` from the command line. An exit code when the program must stop there (--help, or a
/// command line CLI11 has already reported as wrong); nothing when the soak should run.
std::optional<int> parse_options(int argc, char** argv, options& o);

}  // namespace ferry::soak
