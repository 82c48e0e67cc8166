// The version line of every tool; FERRY_VERSION comes from src/core/CMakeLists.txt.

#include "core/version.hpp"

#include <fmt/format.h>

#include "core/protocol.hpp"

#ifndef FERRY_VERSION
#error "FERRY_VERSION must be defined by the build (src/core/CMakeLists.txt)"
#endif

namespace ferry {

const char* version() { return FERRY_VERSION; }

std::string version_line(std::string_view tool, std::string_view extra) {
  return fmt::format("{} {} (protocol versions {}-{}{}{})", tool, version(),
                     proto::min_protocol_version, proto::protocol_version,
                     extra.empty() ? "" : ", ", extra);
}

}  // namespace ferry
