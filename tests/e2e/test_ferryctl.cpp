// ferryctl, run as the real binary: --json before or after the command's name for every command
// (one document each, errors included), the text rendered from the same documents, and room ids
// above 2^53 as strings.

#include <catch2/catch.hpp>
#include <set>

#include "ferryctl.hpp"
#include "harness.hpp"
#include "info.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

json position(uint32_t rank, uint32_t size) { return {{"rank", rank}, {"size", size}}; }

/// The one JSON document a `--json` command printed (and nothing on stderr).
json document(const ctl_result& r) {
  INFO("stdout: " << r.out << "\nstderr: " << r.err);
  CHECK(r.err.empty());
  auto doc = json::parse(r.out, nullptr, false);
  REQUIRE_FALSE(doc.is_discarded());
  CHECK(r.out.find('\n') == r.out.size() - 1);  // one document, one line
  return doc;
}

}  // namespace

TEST_CASE("ferryctl --json prints one document for every command, before or after its name",
          "[e2e][info][ferryctl]") {
  pair c;
  const auto P = c.prefill.socket(), D = c.decode.socket();
  const auto peer = c.prefill.control();

  // --json before and after the command's name: the daemon's document, as is.
  const auto before = document(ferryctl(c.dir, D, {"--json", "status"}));
  const auto after = document(ferryctl(c.dir, D, {"status", "--json"}));
  CHECK(before["node"] == "decode-0");
  CHECK(before["role"] == "decode");
  CHECK(after["instance"] == before["instance"]);
  CHECK(after["listen"]["control"] == c.decode.control());
  CHECK(document(ferryctl(c.dir, D, {"rooms", "--json"})) == json::array());
  CHECK(document(ferryctl(c.dir, D, {"wait-ready", "--json"})) ==
        json{{"ready", true},
             {"node", "decode-0"},
             {"instance", before["instance"]},
             {"role", "decode"}});

  // A room driven by ferryctl alone.
  auto ok = [](const ctl_result& r) {
    INFO(r.out << r.err);
    CHECK(r.code == 0);
    return document(r);
  };
  CHECK(ok(ferryctl(c.dir, P,
                    {"fill", "-r", "41", "-p", "0-15", "--state-slot", "1", "--aux-row", "1",
                     "--json"})) == json{{"room", 41},
                                         {"room_id", "41"},
                                         {"filled", true},
                                         {"pages", 16},
                                         {"state_slot", 1},
                                         {"aux_row", 1}});
  CHECK(ok(ferryctl(c.dir, D,
                    {"--json", "prepare", "-r", "41", "--peer", peer, "-p", "100-115",
                     "--state-slot", "2", "--aux-row", "2"})) ==
        json{{"room", 41}, {"room_id", "41"}, {"ok", true}});
  const auto listed = ok(ferryctl(c.dir, D, {"--json", "rooms"}));
  REQUIRE(listed.size() == 1);
  CHECK(listed[0]["room"] == 41);
  CHECK(listed[0]["peer"] == peer);
  const auto held = ok(ferryctl(c.dir, D, {"pools", "--json"}));
  CHECK(held["kv"]["in_use"] == 16);
  CHECK(held["state"]["in_use"] == 1);
  CHECK(ok(ferryctl(c.dir, P,
                    {"send", "-r", "41", "-p", "0-15", "--last", "--state-slot", "1", "--aux-row",
                     "1", "--json"})) == json{{"room", 41}, {"room_id", "41"}, {"ok", true}});
  const auto waited = ok(ferryctl(c.dir, D, {"--json", "wait", "-r", "41"}));
  CHECK(waited["room"] == 41);
  CHECK(waited["status"] == "Success");
  CHECK(waited["code"] == "ok");
  CHECK(waited["reason"] == "");
  REQUIRE_FALSE(waited["events"].empty());
  CHECK(waited["events"].back()["status"] == "Success");
  CHECK(ok(ferryctl(c.dir, D, {"poll", "-r", "41", "--json"})) == json{{"room", 41},
                                                                       {"room_id", "41"},
                                                                       {"status", "Success"},
                                                                       {"code", "ok"},
                                                                       {"reason", ""},
                                                                       {"prefix_tokens", 0}});
  CHECK(ok(ferryctl(c.dir, D,
                    {"--json", "verify", "-r", "41", "-p", "100-115", "--state-slot", "2",
                     "--aux-row", "2"})) ==
        json{{"room", 41}, {"room_id", "41"}, {"verified", true}});
  const auto status = ok(ferryctl(c.dir, D, {"status", "--json"}));
  CHECK(status["decode"]["succeeded"] == 1);
  CHECK(status["decode"]["active"] == 0);
  CHECK(ok(ferryctl(c.dir, D, {"--json", "pools"}))["kv"]["in_use"] == 0);
  const auto peers = ok(ferryctl(c.dir, D, {"peers", "--json"}));
  REQUIRE(peers.size() == 1);
  CHECK(peers[0]["address"] == peer);
  CHECK(peers[0]["state"] == "connected");
  CHECK(peers[0]["tp"] == position(0, 1));
  const auto found = ok(ferryctl(c.dir, D, {"--json", "discover", peer}));
  REQUIRE(found["ranks"].size() == 1);
  CHECK(found["ranks"][0]["address"] == peer);
  CHECK(found["ranks"][0]["up"] == true);
  CHECK(found["ranks"][0]["node"] == "prefill-0");
  CHECK(found["ranks"][0]["tp"] == position(0, 1));

  // Errors are documents too, with the errc name, and an exit status that says what kind
  // (docs/cli.md): ferryd's refusals 1, a command line that does not parse 2.
  auto refused = [](const ctl_result& r, int code = exit_code::failed) {
    INFO(r.out << r.err);
    CHECK(r.code == code);
    return document(r);
  };
  CHECK(refused(ferryctl(c.dir, D, {"--json", "poll", "-r", "999999"})) ==
        json{{"error", {{"code", "unknown_room"}, {"message", "unknown room 999999"}}}});
  CHECK(refused(ferryctl(c.dir, D, {"cancel", "-r", "41", "--json"}))["error"]["code"] ==
        "room_finished");
  CHECK(refused(ferryctl(c.dir, P, {"--json", "prepare", "-r", "42", "--peer", peer}))["error"] ==
        json{{"code", "wrong_role"},
             {"message", "room 42: prepare is a decode operation; this daemon's role is prefill"}});
  const auto usage = refused(ferryctl(c.dir, D, {"--json", "poll"}), exit_code::usage);
  CHECK(usage["error"]["code"] == "invalid_request");
  CHECK_THAT(usage["error"]["message"].get<std::string>(), Catch::Contains("--room"));

  // Without --json: text rendered from the same documents.
  const auto text = ferryctl(c.dir, D, {"status"});
  CHECK(text.code == 0);
  CHECK_THAT(text.out, Catch::StartsWith("node: decode-0\n") &&
                           Catch::Contains("\ndecode_rooms_succeeded: 1\n") &&
                           Catch::Contains("\ncontrol: " + c.decode.control() + "\n"));
  CHECK(ferryctl(c.dir, D, {"rooms"}).out == "no active rooms\n");
  // Two endpoints in use with the peer: the bulk rail and the express rail (on by default).
  CHECK_THAT(ferryctl(c.dir, D, {"peers"}).out,
             Catch::StartsWith("peer=" + peer + " node=prefill-0 instance=" +
                               c.p->daemon().instance + " tp=0/1 pp=0/1 rails=2") &&
                 Catch::Contains(" link: kv "));
  CHECK_THAT(ferryctl(c.dir, D, {"pools"}).out,
             Catch::StartsWith("pool kv: " + c.d->daemon().pools[0].shm_name + " (") &&
                 Catch::Contains("  4096 pages of 8192 bytes: 0 in use, 4096 free\n") &&
                 Catch::Contains("  K: 4 buffer(s) of 4096 x 1024 bytes\n"));
  const auto polled = ferryctl(c.dir, D, {"poll", "-r", "41"});
  CHECK(polled.out == "room 41: Success (4)\n");
  const auto missing = ferryctl(c.dir, D, {"poll", "-r", "999999"});
  CHECK(missing.code == exit_code::failed);
  CHECK(missing.err == "ferryctl: poll failed [unknown_room]: unknown room 999999\n");
}

TEST_CASE(
    "ferryctl send --first-layer --layer-count sends a room one layer range at a time, and "
    "prepare --checksum asks for its check (the room still lands byte-exact)",
    "[e2e][ferryctl][layer_wise][checksums]") {
  pair c;
  const auto P = c.prefill.socket(), D = c.decode.socket();
  auto run = [&](const std::string& sock, std::vector<std::string> args, int code = 0) {
    const auto r = ferryctl(c.dir, sock, std::move(args));
    INFO(r.out << r.err);
    CHECK(r.code == code);
    return document(r);
  };
  run(P, {"fill", "-r", "43", "-p", "0-15", "--state-slot", "1", "--aux-row", "1", "--json"});
  run(D, {"--json", "prepare", "-r", "43", "--peer", c.prefill.control(), "-p", "200-215",
          "--state-slot", "3", "--aux-row", "3", "--checksum"});
  const std::vector<std::string> last = {"send",         "-r", "43",        "-p", "0-15",  "--last",
                                         "--state-slot", "1",  "--aux-row", "1",  "--json"};
  auto layers = [&](const char* first, const char* count) {
    auto args = last;
    args.insert(args.end(), {"--first-layer", first, "--layer-count", count});
    return args;
  };
  CHECK(run(P, layers("8", "8")) == json{{"room", 43}, {"room_id", "43"}, {"ok", true}});
  CHECK(run(P, layers("8", "1"), exit_code::failed)["error"] ==
        json{{"code", "invalid_request"},
             {"message", "room 43: layer 8 of chunk 0 was already sent"}});
  CHECK(run(P, layers("0", "8")) == json{{"room", 43}, {"room_id", "43"}, {"ok", true}});
  CHECK(run(D, {"--json", "wait", "-r", "43"})["status"] == "Success");
  CHECK(run(D, {"--json", "verify", "-r", "43", "-p", "200-215", "--state-slot", "3", "--aux-row",
                "3"}) == json{{"room", 43}, {"room_id", "43"}, {"verified", true}});
}

TEST_CASE(
    "a room id above 2^53 survives a double: ferryctl --json, the info documents and the JSON "
    "log carry it as a string (room_id) beside the number",
    "[e2e][info][ferryctl][logs]") {
  shape s;
  s.log_yaml = "{format: json, levels: {scheduler: debug}}";
  pair c(s);
  const auto P = c.prefill.socket(), D = c.decode.socket();
  const auto peer = c.prefill.control();
  // 2^53 + 1 (the first integer a double cannot hold) and 2^63 - 1 (SGLang's largest room id).
  const uint64_t odd = 9007199254740993ull, top = 9223372036854775807ull;
  const std::string odd_s = "9007199254740993", top_s = "9223372036854775807";
  auto ok = [](const ctl_result& r) {
    INFO(r.out << r.err);
    CHECK(r.code == 0);
    return document(r);
  };
  // The string parses back to the very id; the number beside it stays for older readers.
  auto carries = [](const json& doc, uint64_t id, const std::string& text) {
    INFO(doc.dump());
    REQUIRE(doc.contains("room_id"));
    REQUIRE(doc["room_id"].is_string());
    CHECK(doc["room_id"] == text);
    CHECK(std::stoull(doc["room_id"].get<std::string>()) == id);
    CHECK(doc["room"] == id);
  };

  carries(ok(ferryctl(c.dir, P,
                      {"fill", "-r", top_s, "-p", "0-15", "--state-slot", "1", "--aux-row", "1",
                       "--json"})),
          top, top_s);
  carries(ok(ferryctl(c.dir, D,
                      {"--json", "prepare", "-r", top_s, "--peer", peer, "-p", "100-115",
                       "--state-slot", "2", "--aux-row", "2"})),
          top, top_s);
  carries(ok(ferryctl(c.dir, D,
                      {"--json", "prepare", "-r", odd_s, "--peer", peer, "-p", "200-203",
                       "--state-slot", "3", "--aux-row", "3"})),
          odd, odd_s);
  // Both rooms active: the rooms document (info rooms) lists them by id.
  const auto listed = ok(ferryctl(c.dir, D, {"--json", "rooms"}));
  REQUIRE(listed.size() == 2);
  carries(listed[0], odd, odd_s);
  carries(listed[1], top, top_s);
  const auto info = json::parse(c.d->info(proto::info_topic::rooms).value);
  REQUIRE(info.size() == 2);
  carries(info[0], odd, odd_s);

  carries(ok(ferryctl(c.dir, D, {"cancel", "-r", odd_s, "--json"})), odd, odd_s);
  carries(ok(ferryctl(c.dir, P,
                      {"send", "-r", top_s, "-p", "0-15", "--last", "--state-slot", "1",
                       "--aux-row", "1", "--json"})),
          top, top_s);
  const auto waited = ok(ferryctl(c.dir, D, {"--json", "wait", "-r", top_s}));
  carries(waited, top, top_s);
  REQUIRE_FALSE(waited["events"].empty());
  carries(waited["events"].back(), top, top_s);
  carries(ok(ferryctl(c.dir, D, {"poll", "-r", top_s, "--json"})), top, top_s);
  carries(ok(ferryctl(c.dir, D,
                      {"--json", "verify", "-r", top_s, "-p", "100-115", "--state-slot", "2",
                       "--aux-row", "2"})),
          top, top_s);
  const auto failed = ferryctl(c.dir, D, {"--json", "wait", "-r", odd_s});
  CHECK(failed.code == exit_code::failed);
  carries(document(failed), odd, odd_s);

  // The JSON log: each room's outcome line at the decode carries room_id too.
  REQUIRE(c.decode.stop() == 0);
  std::set<std::string> logged;
  std::istringstream in(c.decode.log_text());
  for (std::string line; std::getline(in, line);) {
    auto j = json::parse(line, nullptr, false);
    REQUIRE_FALSE(j.is_discarded());
    if (j.value("logger", "") != "scheduler" || j.value("side", "") != "decode") continue;
    if (!j.contains("room_id")) continue;
    INFO(line);
    CHECK(j["room_id"].is_string());
    logged.insert(j["room_id"].get<std::string>());
  }
  CHECK(logged == std::set<std::string>{odd_s, top_s});
}
