#include "core/log_line.hpp"

#include <fmt/format.h>

#include <ctime>

namespace ferry {
namespace {

/// The fields a message's leading words may carry, and whether each is a number.
struct field {
  std::string_view key;
  bool number;
};
constexpr field fields[] = {
    {"room", true}, {"conn", true}, {"peer", false}, {"side", false}, {"code", false}};

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 20) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

/// Length of the valid UTF-8 sequence at the start of `s`, or 0 when it is not one.
size_t utf8_sequence(std::string_view s) {
  const auto b0 = static_cast<unsigned char>(s[0]);
  size_t n = 0;
  uint32_t min = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF)
    n = 2, min = 0x80;
  else if (b0 >= 0xE0 && b0 <= 0xEF)
    n = 3, min = 0x800;
  else if (b0 >= 0xF0 && b0 <= 0xF4)
    n = 4, min = 0x10000;
  else
    return 0;
  if (s.size() < n) return 0;
  uint32_t cp = b0 & (0x7F >> n);
  for (size_t i = 1; i < n; ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      if (const size_t n = utf8_sequence(s.substr(i))) {
        out.append(s.substr(i, n));
        i += n;
      } else {
        out += "\xEF\xBF\xBD";  // U+FFFD
        ++i;
      }
      continue;
    }
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
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20)
          out += fmt::format("\\u{:04x}", c);
        else
          out += static_cast<char>(c);
    }
    ++i;
  }
  out += '"';
}

namespace {
/// A C1 control encoded as UTF-8 (C2 80 to C2 9F) at `s[i]`.
bool c1_at(std::string_view s, size_t i) {
  return static_cast<unsigned char>(s[i]) == 0xC2 && i + 1 < s.size() &&
         static_cast<unsigned char>(s[i + 1]) >= 0x80 &&
         static_cast<unsigned char>(s[i + 1]) <= 0x9F;
}
}  // namespace

bool needs_text_log_escape(std::string_view s) {
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F || c1_at(s, i)) return true;
  }
  return false;
}

std::string text_log_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 16);
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7F)
      out += fmt::format("\\x{:02x}", c);
    else if (c1_at(s, i))
      out += fmt::format("\\u{:04x}", static_cast<unsigned char>(s[++i]));
    else
      out += static_cast<char>(c);
  }
  return out;
}

void append_utc_timestamp(std::string& out, std::chrono::system_clock::time_point ts) {
  using namespace std::chrono;
  const auto since = ts.time_since_epoch();
  const auto secs = floor<seconds>(since);
  const auto micros = duration_cast<microseconds>(since - secs).count();
  const std::time_t t = secs.count();
  std::tm tm{};
  gmtime_r(&t, &tm);
  out += fmt::format("{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z", tm.tm_year + 1900, tm.tm_mon + 1,
                     tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, micros);
}

std::string json_log_line(std::chrono::system_clock::time_point ts, std::string_view level,
                          std::string_view logger, std::string_view msg) {
  std::string out;
  out.reserve(96 + msg.size());
  out += "{\"ts\":\"";
  append_utc_timestamp(out, ts);
  out += "\",\"level\":";
  append_json_string(out, level);
  out += ",\"logger\":";
  append_json_string(out, logger);
  // The leading words: up to the first ": " (what follows may be another party's text).
  const auto head = msg.substr(0, std::min(msg.find(": "), msg.size()));
  bool seen[std::size(fields)] = {};
  for (size_t pos = 0; pos < head.size();) {
    const size_t end = std::min(head.find(' ', pos), head.size());
    const auto word = head.substr(pos, end - pos);
    pos = end + 1;
    const size_t eq = word.find('=');
    if (eq == std::string_view::npos) continue;
    const auto key = word.substr(0, eq), value = word.substr(eq + 1);
    for (size_t f = 0; f < std::size(fields); ++f) {
      if (fields[f].key != key || seen[f] || value.empty()) continue;
      seen[f] = true;
      out += ",\"";
      out += key;
      out += "\":";
      if (fields[f].number && all_digits(value)) {
        // A u64 id: the number, and beside it the same digits as a string (`room_id`), which
        // a reader that holds numbers as doubles (jq, JavaScript) cannot round.
        out += value;
        out += ",\"";
        out += key;
        out += "_id\":\"";
        out += value;
        out += '"';
      } else {
        append_json_string(out, value);
      }
    }
  }
  out += ",\"msg\":";
  append_json_string(out, msg);
  out += '}';
  return out;
}

}  // namespace ferry
