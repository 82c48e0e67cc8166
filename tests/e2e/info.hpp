#pragma once
// The daemon's info documents (docs/protocol.md, "Info documents"), parsed, for tests that read
// its counters, rooms, peers and pools by field.

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "ferry/client.hpp"

namespace ferry::test {

using json = nlohmann::json;

/// The document of `topic` (the request and the parse must succeed).
inline json info_of(client::client& c, proto::info_topic topic) {
  auto s = c.info(topic);
  INFO(s.message);
  REQUIRE(s);
  INFO("info text: " << s.value);
  auto doc = json::parse(s.value, nullptr, false);
  REQUIRE_FALSE(doc.is_discarded());
  return doc;
}

inline json status_of(client::client& c) { return info_of(c, proto::info_topic::status); }

/// No room is held any more: none active on either side, no staging in use (a write cut by a
/// failure may still have been counted as stray).
inline void check_no_room_held(client::client& c) {
  const auto s = status_of(c);
  INFO(s.dump());
  CHECK(s.at("prefill").at("active") == 0);
  CHECK(s.at("decode").at("active") == 0);
  CHECK(s.at("staging").at("in_use") == 0);
}

/// No room is held and no write ever landed for a room that was not expecting it.
inline void check_nothing_held(client::client& c) {
  check_no_room_held(c);
  CHECK(status_of(c).at("stray_writes") == 0);
}

}  // namespace ferry::test
