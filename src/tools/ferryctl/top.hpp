#pragma once
/// `ferryctl top`: a live view of one ferryd, a frame every interval, built from its info
/// documents (status, rooms, peers; docs/protocol.md, "Info documents"): rooms active by side and
/// status, succeeded and failed rooms and bytes moved with their rates per second since the
/// previous frame, and the peers with their state. With --json each frame is one JSON line;
/// otherwise text, the screen cleared before each frame when stdout is a terminal.

#include <cstdint>

#include "core/errors.hpp"
#include "ferry/client.hpp"
#include "tools/ferryctl/render.hpp"

namespace ferry::ctl {

struct top_options {
  uint32_t interval_ms = 1000;
  uint64_t count = 0;  ///< frames to print, then exit 0; 0: until killed
};

/// Frame number `frame` (from 1) from the three documents. `previous` is the frame before (null
/// for the first, whose rates are then null) and `elapsed_s` the time since it.
json top_frame(uint64_t frame, const json& status, const json& rooms, const json& peers,
               const json& previous, double elapsed_s);

/// The text of a frame.
std::string render_top(const json& frame);

/// Print frames from `c` until `o.count` are printed; the first error of an info request ends it.
result<> run_top(client::client& c, const top_options& o, bool json_lines);

}  // namespace ferry::ctl
