#pragma once
/// The daemon's effective config (pools, TP/PP geometry) as structs, parsed from the YAML text
/// of its hello reply. In-tree only (ferry_workload: ferryctl, ferry-bench, ferry-soak, tests):
/// parsing needs yaml-cpp, which the installed Ferry::client does not carry.

#include <memory>

#include "core/config.hpp"
#include "ferry/client.hpp"

namespace ferry::client {

/// `c`'s daemon config, or nullptr when its hello carried none that parses. Parsed once per
/// distinct text and thread (the workload helpers ask for it on every call); the result stays
/// valid as long as the caller holds it.
std::shared_ptr<const ferry_config> daemon_config(const client& c);

}  // namespace ferry::client
