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

room_status status_of(const json& j) {
  const auto name = j.get<std::string>();
  for (auto s : {room_status::failed, room_status::bootstrapping, room_status::waiting_for_input,
                 room_status::transferring, room_status::success})
    if (name == to_string(s)) return s;
  throw std::runtime_error("unknown room status '" + name + "'");
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

}  // namespace ferry::trace
