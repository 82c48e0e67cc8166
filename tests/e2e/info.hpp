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

}  // namespace ferry::test
