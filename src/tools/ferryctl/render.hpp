#pragma once
/// ferryctl's output: the JSON document of every command (`--json`) and the text rendered from
/// the same document without it. The info documents are the daemon's (docs/protocol.md, "Info
/// documents"); the others describe a command's outcome.

#include <nlohmann/json.hpp>
#include <string>

#include "core/errors.hpp"
#include "core/protocol.hpp"

namespace ferry::ctl {

using json = nlohmann::ordered_json;

/// Text of an info document, close to what `ferryctl status|rooms|peers|pools` always printed.
std::string render_status(const json& doc);
std::string render_rooms(const json& doc);
std::string render_peers(const json& doc);
std::string render_pools(const json& doc);
std::string render_info(proto::info_topic topic, const json& doc);

/// {"error": {"code": "<errc name>", "message": ...}}
json error_doc(errc code, const std::string& message);
/// {"room", "room_id", "status", "code", "reason", "prefix_tokens"} of a poll reply or an event
/// (room_id: the id as a string, docs/cli.md).
json room_status_doc(uint64_t room, room_status status, errc code, const std::string& reason,
                     uint32_t prefix_tokens);
/// The ranks of a discover reply: {"address", "ranks": [...]}.
json discover_doc(const std::string& address, const proto::discover_reply& r);
std::string render_discover(const json& doc);

}  // namespace ferry::ctl
