#pragma once
/// Ferry's version (the file VERSION, which CMake's `project(ferry VERSION ...)` and the Python
/// package read: its one source) and the line every tool prints for `--version`.

#include <string>
#include <string_view>

namespace ferry {

/// "0.5.0": the project version the tree was configured with.
const char* version();

/// "<tool> 0.5.0 (protocol versions 3-6)": the client protocol versions (core/protocol.hpp)
/// this build speaks; `extra`, when not empty, is added inside the parentheses
/// ("..., peer protocol versions 5-7").
std::string version_line(std::string_view tool, std::string_view extra = {});

}  // namespace ferry
