#include "actors/room_trace.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>

namespace ferry::trace {

std::unique_ptr<file> file::open(const char* kind) {
  static const char* dir = std::getenv("FERRY_TRACE_DIR");
  if (!dir || !*dir) return nullptr;
  static std::atomic<uint64_t> next{0};
  const auto path = std::string(dir) + "/" + kind + "-" + std::to_string(::getpid()) + "-" +
                    std::to_string(next++) + ".jsonl";
  std::FILE* f = std::fopen(path.c_str(), "we");
  if (!f) return nullptr;
  return std::unique_ptr<file>(new file(f));
}

file::~file() { std::fclose(f_); }

void file::write(json line) {
  // CLOCK_MONOTONIC is one clock for every process of the host: two daemons' traces line up.
  line["t_us"] = std::chrono::duration_cast<std::chrono::microseconds>(
                     std::chrono::steady_clock::now().time_since_epoch())
                     .count();
  const auto s = line.dump() + "\n";
  std::fwrite(s.data(), 1, s.size(), f_);
  std::fflush(f_);  // a daemon killed by a test keeps what it wrote
}

json result_json(const result<>& r) {
  if (r) return json{{"ok", true}};
  return json{{"ok", false}, {"code", static_cast<int>(r.code)}, {"message", r.message}};
}

result<> result_of(const json& j) {
  if (j.at("ok").get<bool>()) return {};
  return error{static_cast<errc>(j.at("code").get<int>()), j.at("message").get<std::string>()};
}

json limits_json(const lifecycle_limits& l) {
  return json{l.bootstrapping_ms, l.waiting_for_input_ms, l.transferring_ms, l.transfer_ms,
              l.drain_ms};
}

lifecycle_limits limits_of(const json& j) {
  return {j.at(0).get<uint32_t>(), j.at(1).get<uint32_t>(), j.at(2).get<uint32_t>(),
          j.at(3).get<uint32_t>(), j.at(4).get<uint32_t>()};
}

namespace {

json pools_json(const pools_config& p) {
  json j = json::object();
  if (p.kv)
    j["kv"] = {{"layer_ids", p.kv->layer_ids},
               {"page_tokens", p.kv->page_tokens},
               {"kv_heads", p.kv->kv_heads},
               {"head_dim", p.kv->head_dim},
               {"dtype_bytes", p.kv->dtype_bytes},
               {"mla", p.kv->mla},
               {"pages", p.kv->pages},
               {"total_heads", p.kv->total_heads}};
  if (p.mamba) {
    json tensors = json::array();
    for (const auto& t : p.mamba->tensors)
      tensors.push_back({{"name", t.name},
                         {"shape", t.shape},
                         {"dtype_bytes", t.dtype_bytes},
                         {"slice_axis", t.slice_axis ? json(*t.slice_axis) : json()},
                         {"shard_groups", t.shard_groups}});
    j["mamba"] = {
        {"slots", p.mamba->slots}, {"layer_ids", p.mamba->layer_ids}, {"tensors", tensors}};
  }
  if (p.aux)
    j["aux"] = {{"rows", p.aux->rows},
                {"row_bytes", p.aux->row_bytes},
                {"more_row_bytes", p.aux->more_row_bytes},
                {"room_id_buffer", p.aux->room_id_buffer}};
  // A registered pool's buffers lie where the engine's memory put them.
  if (p.kv && !p.kv->placement.offsets.empty()) j["kv"]["offsets"] = p.kv->placement.offsets;
  if (p.mamba && !p.mamba->placement.offsets.empty())
    j["mamba"]["offsets"] = p.mamba->placement.offsets;
  if (p.aux && !p.aux->placement.offsets.empty()) j["aux"]["offsets"] = p.aux->placement.offsets;
  return j;
}

pools_config pools_of(const json& j) {
  pools_config p;
  if (j.contains("kv")) {
    const auto& k = j["kv"];
    kv_pool_config c;
    c.layer_ids = k.at("layer_ids").get<std::vector<uint32_t>>();
    c.page_tokens = k.at("page_tokens");
    c.kv_heads = k.at("kv_heads");
    c.head_dim = k.at("head_dim");
    c.dtype_bytes = k.at("dtype_bytes");
    c.mla = k.at("mla");
    c.pages = k.at("pages");
    c.total_heads = k.at("total_heads");
    c.placement.offsets = k.value("offsets", std::vector<uint64_t>{});
    p.kv = c;
  }
  if (j.contains("mamba")) {
    const auto& m = j["mamba"];
    mamba_pool_config c;
    c.slots = m.at("slots");
    c.layer_ids = m.at("layer_ids").get<std::vector<uint32_t>>();
    for (const auto& t : m.at("tensors")) {
      state_tensor_config s;
      s.name = t.at("name");
      s.shape = t.at("shape").get<std::vector<uint64_t>>();
      s.dtype_bytes = t.at("dtype_bytes");
      if (!t.at("slice_axis").is_null()) s.slice_axis = t.at("slice_axis").get<uint32_t>();
      s.shard_groups = t.at("shard_groups").get<std::vector<uint64_t>>();
      c.tensors.push_back(std::move(s));
    }
    c.placement.offsets = m.value("offsets", std::vector<uint64_t>{});
    p.mamba = c;
  }
  if (j.contains("aux")) {
    const auto& a = j["aux"];
    aux_pool_config c;
    c.rows = a.at("rows");
    c.row_bytes = a.at("row_bytes");
    c.more_row_bytes = a.value("more_row_bytes", std::vector<uint64_t>{});
    c.room_id_buffer = a.value("room_id_buffer", uint32_t{0});
    c.placement.offsets = a.value("offsets", std::vector<uint64_t>{});
    p.aux = c;
  }
  return p;
}

json life_json(const lifecycle_effects& e) {
  json arm = json::array(), cancel = json::array();
  for (const auto& a : e.arm) arm.push_back({static_cast<int>(a.kind), a.generation, a.ms});
  for (auto k : e.cancel) cancel.push_back(static_cast<int>(k));
  json j{{"life", {{"cancel", cancel}, {"arm", arm}, {"quit", e.quit}}}};
  if (e.report)
    j["life"]["report"] = {
        {"status", to_string(*e.report)}, {"reason", e.reason}, {"code", static_cast<int>(e.code)}};
  return j;
}

}  // namespace

json schema_json(const rank_schema& s) {
  return {{"pools", pools_json(s.pools)},
          {"tp", {s.tp_size, s.tp_rank}},
          {"pp", {s.pp_size, s.pp_rank}},
          {"dp", {s.dp_size, s.dp_rank}}};
}

rank_schema schema_of(const json& j) {
  rank_schema s;
  s.pools = pools_of(j.at("pools"));
  s.tp_size = j.at("tp").at(0);
  s.tp_rank = j.at("tp").at(1);
  s.pp_size = j.at("pp").at(0);
  s.pp_rank = j.at("pp").at(1);
  s.dp_size = j.at("dp").at(0);
  s.dp_rank = j.at("dp").at(1);
  return s;
}

json effects_json(const sender::effects& fx) {
  json out = json::array();
  for (const auto& e : fx)
    std::visit(
        [&](const auto& x) {
          using E = std::decay_t<decltype(x)>;
          using namespace sender;
          if constexpr (std::is_same_v<E, reply>)
            out.push_back({{"reply", result_json(x.outcome)}});
          if constexpr (std::is_same_v<E, ack>)
            out.push_back(
                {{"ack",
                  {{"link", x.link}, {"token", x.token}, {"outcome", result_json(x.outcome)}}}});
          if constexpr (std::is_same_v<E, post_chunk>)
            out.push_back({{"post_chunk",
                            {{"pages", x.chunk.src_pages},
                             {"first", x.first},
                             {"last", x.chunk.last},
                             {"layers", {x.chunk.first_layer, x.chunk.layer_count}},
                             {"ends_room", x.ends_room}}}});
          if constexpr (std::is_same_v<E, pump>) out.push_back("pump");
          if constexpr (std::is_same_v<E, announce>) out.push_back("announce");
          if constexpr (std::is_same_v<E, tell_failed>)
            out.push_back({{"tell_failed",
                            {{"reason", x.reason},
                             {"code", static_cast<int>(x.code)},
                             {"in_flight", x.in_flight}}}});
          if constexpr (std::is_same_v<E, tell_drained>) out.push_back("tell_drained");
          if constexpr (std::is_same_v<E, life>) out.push_back(life_json(x.effects));
        },
        e);
  return out;
}

json effects_json(const receiver::effects& fx) {
  json out = json::array();
  for (const auto& e : fx)
    std::visit(
        [&](const auto& x) {
          using E = std::decay_t<decltype(x)>;
          using namespace receiver;
          if constexpr (std::is_same_v<E, reserve_staging>)
            out.push_back({{"reserve_staging", x.bytes}, {"wait", x.wait}});
          if constexpr (std::is_same_v<E, no_staging>)
            out.push_back({{"no_staging", x.need}, {"full", x.full}});
          if constexpr (std::is_same_v<E, send_prepares>) out.push_back("send_prepares");
          if constexpr (std::is_same_v<E, grant>) out.push_back({{"grant", x.link}});
          if constexpr (std::is_same_v<E, tell>)
            out.push_back(
                {{"tell",
                  {{"ok", x.ok}, {"reason", x.reason}, {"code", static_cast<int>(x.code)}}}});
          if constexpr (std::is_same_v<E, failed>) out.push_back({{"failed", x.reason}});
          if constexpr (std::is_same_v<E, unpack>) out.push_back("unpack");
          if constexpr (std::is_same_v<E, verify>) out.push_back("verify");
          if constexpr (std::is_same_v<E, release_staging>)
            out.push_back({{"release_staging", x.at}});
          if constexpr (std::is_same_v<E, fence>)
            out.push_back({{"fence", {{"link", x.link}, {"reason", x.reason}}}});
          if constexpr (std::is_same_v<E, life>) out.push_back(life_json(x.effects));
        },
        e);
  return out;
}

sender::room sender_of(const json& c) {
  return sender::room(c.at("id"), limits_of(c.at("limits")), c.at("tp_rank"), c.at("tp_size"),
                      c.at("pp_rank"), c.at("layers").get<std::vector<uint32_t>>());
}

receiver::room receiver_of(const json& c) {
  return receiver::room(c.at("id"), limits_of(c.at("limits")), schema_of(c.at("mine")),
                        c.at("named").get<std::vector<std::string>>(), c.at("first_token"),
                        c.at("pages"), c.at("staging_capacity"), c.value("checks", false));
}

namespace {
errc code_of(const json& j) { return static_cast<errc>(j.get<int>()); }
}  // namespace

sender::effects replay(sender::room& m, const json& ev) {
  const std::string e = ev.at("e");
  if (e == "start") return m.start();
  if (e == "prepare") {
    sender::prepare_in p;
    p.link = ev.at("link");
    p.address = ev.at("address");
    p.in_group = ev.at("in_group");
    p.tp_size = ev.at("tp_size");
    p.tp_rank = ev.at("tp_rank");
    p.pp_rank = ev.at("pp_rank");
    p.expected_links = ev.at("expected_links");
    p.pages = ev.at("pages");
    p.state_pages = ev.value("state_pages", 0u);  // (traces before version 8 have none)
    p.prefix_tokens = ev.at("prefix_tokens");
    p.token = ev.at("token");
    p.indices = result_of(ev.at("indices"));
    return m.prepare(std::move(p));
  }
  if (e == "chunk")
    return m.chunk(proto::send{ev.at("room"), ev.at("pages").get<std::vector<uint32_t>>(),
                               ev.at("last"), ev.at("slot"), ev.at("row"), ev.at("layers").at(0),
                               ev.at("layers").at(1),
                               ev.value("state_pages", std::vector<uint32_t>{})});
  if (e == "posted")
    return m.posted(ev.at("link"), ev.at("batch"), ev.at("writes"), ev.at("bytes"));
  if (e == "chunk_posted") return m.chunk_posted(ev.at("pending"));
  if (e == "pumped") return m.pumped(ev.at("pending"));
  if (e == "batch_done")
    return m.batch_done(ev.at("batch"), ev.at("completed"), ev.at("failed"),
                        result_of(ev.at("result")));
  if (e == "outcome")
    return m.outcome(ev.at("link"), ev.at("address"), ev.at("in_group"), ev.at("token"),
                     ev.at("ok"), code_of(ev.at("code")), ev.at("reason"));
  if (e == "cancel") return m.cancel(ev.at("why"));
  if (e == "peer_down") return m.peer_down(code_of(ev.at("code")), ev.at("why"));
  if (e == "expired")
    return m.expired(static_cast<deadline_kind>(ev.at("kind").get<int>()), ev.at("generation"));
  throw std::runtime_error("unknown sender event '" + e + "'");
}

receiver::effects replay(receiver::room& m, const json& ev) {
  const std::string e = ev.at("e");
  if (e == "start") return m.start();
  if (e == "resolved")
    return m.resolved(ev.at("i"), schema_of(ev.at("schema")), ev.at("unpack"), ev.at("optional"),
                      ev.value("asks", false));
  if (e == "staging_requested") return m.staging_requested(ev.at("i"), ev.at("token"));
  if (e == "unusable") return m.unusable(ev.at("i"), code_of(ev.at("code")), ev.at("why"));
  if (e == "staging_reserved") return m.staging_reserved(ev.at("at"));
  if (e == "staging_freed") return m.staging_freed();
  if (e == "staging_declined") return m.staging_declined();
  if (e == "prepare_ack")
    return m.prepare_ack(ev.at("i"), ev.at("token"), ev.at("ok"), code_of(ev.at("code")),
                         ev.at("reason"));
  if (e == "announce")
    return m.announce(ev.at("i"), ev.at("token"), ev.at("writes"), ev.at("bytes"));
  if (e == "outcome")
    return m.outcome(ev.at("i"), ev.at("token"), ev.at("ok"), code_of(ev.at("code")),
                     ev.at("reason"));
  if (e == "drained")
    return m.drained(ev.at("i"), ev.at("token"), ev.at("completed"), ev.value("failed", 0));
  if (e == "landed") return m.landed(ev.at("token"), ev.at("count"));
  if (e == "unpacked") return m.unpacked();
  if (e == "verified") return m.verified(code_of(ev.at("code")), ev.at("reason"));
  if (e == "cancel") return m.cancel(ev.at("why"));
  if (e == "peer_down")
    return m.peer_down(ev.at("i"), ev.at("fenced"), code_of(ev.at("code")), ev.at("why"));
  if (e == "expired")
    return m.expired(static_cast<deadline_kind>(ev.at("kind").get<int>()), ev.at("generation"));
  throw std::runtime_error("unknown receiver event '" + e + "'");
}

}  // namespace ferry::trace
