// The helpers parsing and validation share (declared in config_detail.hpp), and the public entry
// points, which combine reading a file, parsing (config_parse.cpp) and validation
// (config_validate.cpp) and turn a config_failure into an error (errc::config_invalid). to_yaml
// is in config_emit.cpp; the structs' own helpers are in config_types.cpp.
#include "core/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "core/config_detail.hpp"

namespace ferry {

namespace detail {

// ---------------------------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------------------------

[[noreturn]] void fail(const std::string& path, const std::string& expected_and_got) {
  throw config_failure{path + ": " + expected_and_got};
}

std::string quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static constexpr char hex[] = "0123456789abcdef";
          out += "\\x";
          out += hex[(c >> 4) & 0xf];
          out += hex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  out += '"';
  return out;
}

bool all_digits(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace detail

using detail::config_failure;
using detail::is_host_port;
using detail::parse_text;
using detail::validate_all;

// ---------------------------------------------------------------------------------------------
// Public entry points
// ---------------------------------------------------------------------------------------------

bool valid_host_port(std::string_view address) { return is_host_port(address); }

void fill_derived(ferry_config&) {
  // Nothing is derived into the config itself any more: pools.kv.total_heads stays 0 when it was
  // not set (the effective config says what is assumed in a comment), so a peer's message about
  // it can say whether it was set.
}

result<ferry_config> parse_config_text(const std::string& yaml_text,
                                       const std::vector<config_override>& overrides) {
  return parse_text(yaml_text, "config", overrides);
}

result<ferry_config> parse_config_file(const std::string& path,
                                       const std::vector<config_override>& overrides) {
  // POSIX I/O rather than ifstream so the reported reason is the real errno (ENOENT, EACCES,
  // EISDIR on read of a directory).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return error{errc::config_invalid,
                 "cannot read config file '" + path + "': " + std::strerror(errno)};
  }
  std::string text;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int saved = errno;
      ::close(fd);
      return error{errc::config_invalid,
                   "cannot read config file '" + path + "': " + std::strerror(saved)};
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return parse_text(text, path, overrides);
}

result<> validate_config(const ferry_config& cfg) {
  try {
    validate_all(cfg);
  } catch (const config_failure& f) {
    return error{errc::config_invalid, f.what};
  }
  return {};
}

result<ferry_config> load_config_file(const std::string& path) {
  auto parsed = parse_config_file(path);
  if (!parsed) return parsed;
  if (auto valid = validate_config(parsed.value); !valid) return std::move(valid).error();
  return parsed;
}

}  // namespace ferry
