#pragma once
/// ferryd's JSON log line (`log.format: json`, docs/operations.md "Logs"): one object per record,
/// built from the record's parts so a log shipper needs no pattern to read it.
///
///   {"ts":"2026-12-02T11:20:00.123456Z","level":"warn","logger":"room","room":7,"room_id":"7",
///    "peer":"p0","msg":"room=7 peer=p0 failed: peer lost"}
///
/// Fields beside ts, level, logger and msg come from the `key=value` words ferryd's messages
/// start with: room, conn (numbers, u64 ids: each also as a decimal string in room_id, conn_id,
/// which survives a reader that holds numbers as doubles), peer, side, code (strings). Only the
/// words before the message's first ": " count, so text a peer or a client supplied (a reason,
/// always after it) cannot add or change a field. Bytes that are not UTF-8 become U+FFFD: every
/// line parses.

#include <chrono>
#include <string>
#include <string_view>

namespace ferry {

/// The JSON line (without its newline) of one record; `ts` is written in UTC.
std::string json_log_line(std::chrono::system_clock::time_point ts, std::string_view level,
                          std::string_view logger, std::string_view msg);

/// `s` as a JSON string literal, quotes included (invalid UTF-8 replaced by U+FFFD).
void append_json_string(std::string& out, std::string_view s);

/// Whether `s` holds a byte the text log escapes (text_log_escape).
bool needs_text_log_escape(std::string_view s);

/// `s` with its control characters escaped, for the text format (`log.format: text`), so that
/// text a client or a peer supplied can neither start a line of its own nor drive a terminal:
/// \n, \r, \t as such, every other byte below 0x20 and DEL as \xHH, and the C1 controls (U+0080
/// to U+009F, e.g. NEL, which some viewers take for a newline) as \u00HH. Everything else,
/// backslashes included, is kept as it is.
std::string text_log_escape(std::string_view s);

/// `ts` as RFC 3339 in UTC with microseconds: 2026-12-02T11:20:00.123456Z.
void append_utc_timestamp(std::string& out, std::chrono::system_clock::time_point ts);

}  // namespace ferry
