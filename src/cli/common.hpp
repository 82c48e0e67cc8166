#pragma once
/// What every Ferry tool's command line shares (header only, on CLI11): `--version`, and
/// parsing that maps CLI11's errors to Ferry's exit codes (core/exit_codes.hpp): --help and
/// --version exit 0, every refused command line exits `exit_code::usage` (CLI11's own codes,
/// 104-109, are never seen).

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "core/exit_codes.hpp"
#include "core/version.hpp"

namespace ferry::cli {

/// `--version` on `app`: prints version_line(tool, extra) on stdout and exits 0.
inline void add_version(CLI::App& app, std::string_view tool, std::string_view extra = {}) {
  app.set_version_flag("--version", version_line(tool, extra),
                       "print the version and the protocol versions spoken, and exit");
}

/// The exit code for a parse error CLI11 threw: its message printed as CLI11 prints it (help
/// and version on stdout, errors on stderr), then 0 for --help/--version, usage otherwise.
inline int exit_for(const CLI::App& app, const CLI::ParseError& e) {
  return app.exit(e) == 0 ? exit_code::ok : exit_code::usage;
}

/// Parse the command line; nothing when the tool should go on, else the code to exit with.
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return exit_for(app, e);
  }
  return std::nullopt;
}

}  // namespace ferry::cli
