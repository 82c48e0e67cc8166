// The C++ client's session machine (core/client_session.hpp) against the cases both clients pass,
// tests/conformance/client_session.yaml (the Python client's ferry/session.py runs the same file
// in tests/python/test_session.py). Requests and frames are the golden frames.
#include <yaml-cpp/yaml.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <map>
#include <string>

#include "core/client_session.hpp"
#include "golden_frames.hpp"

using namespace ferry;
using namespace ferry::proto;

namespace {

std::string conformance_path() {
  const char* dir = std::getenv("FERRY_SOURCE_DIR");
  return std::string(dir ? dir : FERRY_DEFAULT_SOURCE_DIR) +
         "/tests/conformance/client_session.yaml";
}

const message& golden(uint16_t version, const std::string& name) {
  static const auto frames = test::golden_frames();
  for (const auto& f : frames)
    if (f.version == version && f.name == name) return f.msg;
  FAIL("no golden frame " << name << " of version " << version);
  throw std::logic_error("unreachable");
}

/// The frame a `receive` or `receive_error` step feeds: type, flags, seq and body.
session_outcome feed(client_session& s, const YAML::Node& step, uint16_t version) {
  message m;
  if (step["receive_error"])
    m = error{static_cast<errc>(step["receive_error"]["code"].as<int>()),
              step["receive_error"]["message"].as<std::string>()};
  else
    m = golden(version, step["receive"].as<std::string>());
  const auto seq = step["seq"].as<uint32_t>();
  auto whole = encode(m, seq, version);
  std::span<const uint8_t> body(whole.data() + header_bytes, whole.size() - header_bytes);
  if (step["keep"]) body = body.first(step["keep"].as<size_t>());
  const auto flags = step["flags"] ? step["flags"].as<uint16_t>() : uint16_t{0};
  return s.on_frame(static_cast<uint16_t>(type_of(m)), flags, seq, body);
}

const char* name_of(session_outcome::kind k) {
  using kind = session_outcome::kind;
  switch (k) {
    case kind::reply:
      return "reply";
    case kind::refused:
      return "refused";
    case kind::failed:
      return "failed";
    case kind::dropped:
      return "dropped";
    case kind::pushed:
      return "pushed";
    case kind::ended:
      return "ended";
  }
  return "?";
}

void check(const session_outcome& got, const YAML::Node& step) {
  const auto want = step["outcome"].as<std::string>();
  REQUIRE(std::string(name_of(got.what)) == want);
  if (step["of"]) CHECK(got.seq == step["of"].as<uint32_t>());
  if (step["code"]) CHECK(static_cast<int>(got.err.code) == step["code"].as<int>());
  if (step["text"]) CHECK(got.err.message == step["text"].as<std::string>());
  if (step["draining"]) CHECK(got.draining == step["draining"].as<bool>());
  if (step["room"]) {
    REQUIRE(got.msg);
    CHECK(std::get<event>(*got.msg).room == step["room"].as<uint64_t>());
  }
}

void check_hello(const hello_outcome& got, const YAML::Node& step) {
  const auto want = step["hello"].as<std::string>();
  const char* names[] = {"accepted", "refused", "ended"};
  REQUIRE(std::string(names[static_cast<int>(got.what)]) == want);
  if (step["version"]) CHECK(got.reply.version == step["version"].as<uint16_t>());
  if (step["code"]) CHECK(static_cast<int>(got.err.code) == step["code"].as<int>());
  if (step["text"]) CHECK(got.err.message == step["text"].as<std::string>());
  if (step["retry_v3"]) CHECK(got.retry_v3 == step["retry_v3"].as<bool>());
}

}  // namespace

TEST_CASE("the client session passes every conformance case both clients share",
          "[client_session]") {
  const auto cases = YAML::LoadFile(conformance_path())["cases"];
  REQUIRE(cases.size() >= 10);
  for (const auto& c : cases) {
    const auto name = c["name"].as<std::string>();
    DYNAMIC_SECTION(name) {
      const auto version = c["version"] ? c["version"].as<uint16_t>() : uint16_t{10};
      client_session s(version);
      for (const auto& step : c["steps"]) {
        INFO(YAML::Dump(step));
        if (step["start"]) {
          const auto& m = golden(version, step["start"].as<std::string>());
          const auto [seq, frame] = s.start(m);
          CHECK(seq == step["seq"].as<uint32_t>());
          auto d = decode(static_cast<uint16_t>(type_of(m)), seq,
                          std::span(frame).subspan(header_bytes), version);
          REQUIRE(d.msg);
          CHECK(encode(*d.msg, seq, version) == frame);
        } else if (step["abandon"]) {
          CHECK(s.abandon(step["abandon"].as<uint32_t>()) == step["result"].as<bool>());
        } else if (step["end"]) {
          CHECK(s.end() == step["failed"].as<std::vector<uint32_t>>());
          CHECK(s.outstanding().empty());
        } else if (step["hello"]) {
          const auto range = c["hello"].as<std::vector<uint16_t>>();
          check_hello(read_hello(feed(s, step, version), range[0], range[1]), step);
        } else {
          check(feed(s, step, version), step);
        }
      }
    }
  }
}
