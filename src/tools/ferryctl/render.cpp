// ferryctl's text, rendered from the JSON documents it prints with --json.

#include "tools/ferryctl/render.hpp"

#include <fmt/format.h>

namespace ferry::ctl {

namespace {

std::string position(const json& p) {
  return fmt::format("{}/{}", p.at("rank").get<uint32_t>(), p.at("size").get<uint32_t>());
}

std::string text(const json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

std::string render_status(const json& d) {
  std::string o;
  auto line = [&](const char* key, const json& v) { o += fmt::format("{}: {}\n", key, text(v)); };
  line("node", d.at("node"));
  line("instance", d.at("instance"));
  line("role", d.at("role"));
  o += fmt::format("tp: {}\npp: {}\n", position(d.at("tp")), position(d.at("pp")));
  line("provider", d.at("provider"));
  line("control", d.at("listen").at("control"));
  line("client", d.at("listen").at("client"));
  line("clients", d.at("clients"));
  line("peers", d.at("peers"));
  for (const char* side : {"prefill", "decode"}) {
    const auto& s = d.at(side);
    o += fmt::format("{0}_rooms_active: {1}\n{0}_rooms_succeeded: {2}\n{0}_rooms_failed: {3}\n",
                     side, text(s.at("active")), text(s.at("succeeded")), text(s.at("failed")));
    o += fmt::format("{}_bytes_{}: {}\n", side,
                     side == std::string("prefill") ? "sent" : "received", text(s.at("bytes")));
  }
  line("stray_writes", d.at("stray_writes"));
  const auto& st = d.at("staging");
  line("staging_bytes", st.at("bytes"));
  line("staging_in_use", st.at("in_use"));
  line("staging_waits", st.at("waits"));
  // One line per endpoint, only when there are several (fabric.rails, fabric.express_bytes):
  // a daemon of one endpoint prints what it always did.
  if (d.contains("rails") && d.at("rails").size() > 1)
    for (const auto& r : d.at("rails"))
      o += fmt::format("rail {}: {} writes ({} bytes) in flight, {} writes ({} bytes) posted\n",
                       text(r.at("rail")), text(r.at("writes_in_flight")),
                       text(r.at("bytes_in_flight")), text(r.at("writes_posted")),
                       text(r.at("bytes_posted")));
  return o;
}

std::string render_rooms(const json& d) {
  if (d.empty()) return "no active rooms\n";
  std::string o;
  for (const auto& r : d) {
    const auto peer = r.at("peer").get<std::string>();
    o += fmt::format("room={} side={} status={} peer={}\n", text(r.at("room")), text(r.at("side")),
                     text(r.at("status")), peer.empty() ? "-" : peer);
  }
  return o;
}

std::string render_peers(const json& d) {
  if (d.empty()) return "no peers\n";
  std::string o;
  for (const auto& p : d) {
    if (p.at("state") != "connected") {
      o += fmt::format("peer={} {}\n", text(p.at("address")), text(p.at("state")));
      continue;
    }
    const bool dp = p.contains("dp") && p.at("dp").at("size").get<uint32_t>() > 1;
    // Like dp: said only when the pair uses more than one endpoint.
    const bool several = p.contains("rails") && p.at("rails").get<uint64_t>() > 1;
    const auto rails = several ? " rails=" + text(p.at("rails")) : std::string();
    o += fmt::format("peer={} node={} instance={} tp={} pp={}{}{} link: {}\n",
                     text(p.at("address")), text(p.at("node")), text(p.at("instance")),
                     position(p.at("tp")), position(p.at("pp")),
                     dp ? " dp=" + position(p.at("dp")) : "", rails, text(p.at("link")));
  }
  return o;
}

std::string render_pools(const json& d) {
  if (d.empty()) return "no pools\n";
  std::string o;
  for (const auto& [name, p] : d.items()) {
    const auto where =
        p.at("memory") == "daemon"
            ? fmt::format("{} ({} bytes)", text(p.at("shm_name")), text(p.at("bytes")))
            : fmt::format("{} bytes", text(p.at("bytes")));
    o += fmt::format("pool {}: {}, {} memory, {}\n", name, where, text(p.at("memory")),
                     text(p.at("state")));
    const char* items = name == "kv" ? "pages" : name == "state" ? "slots" : "rows";
    o += fmt::format("  {} {} of {} bytes: {} in use, {} free\n", text(p.at("items")), items,
                     text(p.at("item_bytes")), text(p.at("in_use")), text(p.at("free")));
    for (const auto& b : p.at("buffers")) {
      const auto kind = b.at("kind").get<std::string>();
      const auto what = kind == "state" ? "state tensor " + text(b.at("tensor")) : kind;
      o += fmt::format("  {}: {} buffer(s) of {} x {} bytes\n", what, text(b.at("buffers")),
                       text(b.at("items")), text(b.at("item_bytes")));
    }
  }
  return o;
}

std::string render_info(proto::info_topic topic, const json& doc) {
  switch (topic) {
    case proto::info_topic::status:
      return render_status(doc);
    case proto::info_topic::rooms:
      return render_rooms(doc);
    case proto::info_topic::peers:
      return render_peers(doc);
    case proto::info_topic::pools:
      return render_pools(doc);
    case proto::info_topic::timelines:
      break;  // numbers for tools: printed as JSON
  }
  return doc.dump() + "\n";
}

json error_doc(errc code, const std::string& message) {
  return {{"error", {{"code", to_string(code)}, {"message", message}}}};
}

json room_status_doc(uint64_t room, room_status status, errc code, const std::string& reason,
                     uint32_t prefix_tokens) {
  return {{"room", room},
          {"room_id", std::to_string(room)},
          {"status", to_string(status)},
          {"code", to_string(code)},
          {"reason", reason},
          {"prefix_tokens", prefix_tokens}};
}

json discover_doc(const std::string& address, const proto::discover_reply& r) {
  json ranks = json::array();
  for (const auto& k : r.ranks)
    ranks.push_back({{"address", k.address},
                     {"up", k.up},
                     {"node", k.node},
                     {"tp", {{"rank", k.tp_rank}, {"size", k.tp_size}}},
                     {"pp", {{"rank", k.pp_rank}, {"size", k.pp_size}}},
                     {"dp", {{"rank", k.dp_rank}, {"size", k.dp_size}}},
                     {"reason", k.reason}});
  return {{"address", address}, {"ranks", ranks}};
}

std::string render_discover(const json& d) {
  std::string o;
  for (const auto& k : d.at("ranks")) {
    if (!k.at("up").get<bool>()) {
      o += fmt::format("{} down: {}\n", text(k.at("address")), text(k.at("reason")));
      continue;
    }
    o += fmt::format("{} up node={} tp={} pp={} dp={}\n", text(k.at("address")), text(k.at("node")),
                     position(k.at("tp")), position(k.at("pp")), position(k.at("dp")));
  }
  return o;
}

}  // namespace ferry::ctl
