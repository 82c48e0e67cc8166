// Emission: the config structs back to YAML (to_yaml), the effective config that
// `ferryd --check-config` prints and the hello reply carries; parsing it gives the same config.
#include <yaml-cpp/yaml.h>

#include <string>
#include <vector>

#include "core/config.hpp"

namespace ferry {
namespace {

void emit_ids(YAML::Emitter& out, const std::vector<uint32_t>& ids) {
  out << YAML::Flow << YAML::BeginSeq;
  for (uint32_t id : ids) out << id;
  out << YAML::EndSeq;
}

void emit_dims(YAML::Emitter& out, const std::vector<uint64_t>& dims) {
  out << YAML::Flow << YAML::BeginSeq;
  for (uint64_t d : dims) out << d;
  out << YAML::EndSeq;
}

/// A pool the engine's registration describes, before it did: `memory: client` and a comment.
bool emit_undescribed(YAML::Emitter& out, const pool_placement& p, bool empty) {
  if (!p.registered || !empty) return false;
  out << YAML::Key << "memory" << YAML::Value << "client";
  out << YAML::Comment("described by the engine's register_memory (not registered yet)");
  return true;
}

/// A registered pool's buffer offsets (what a peer needs to address them), and that its
/// registration described it.
void emit_offsets(YAML::Emitter& out, const pool_placement& p) {
  if (p.registered) out << YAML::Key << "registered" << YAML::Value << true;
  if (p.offsets.empty()) return;
  out << YAML::Key << "offsets" << YAML::Value;
  emit_dims(out, p.offsets);
}

}  // namespace

std::string to_yaml(const ferry_config& cfg, yaml_for reader) {
  YAML::Emitter out;
  out << YAML::BeginMap;

  out << YAML::Key << "node" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "name" << YAML::Value << cfg.node_name;
  out << YAML::Key << "instance" << YAML::Value << cfg.instance;
  out << YAML::EndMap;

  out << YAML::Key << "role" << YAML::Value << to_string(cfg.role);
  if (!cfg.instance_ranks.empty()) {
    out << YAML::Key << "discovery" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "instance_ranks" << YAML::Value << YAML::Flow << cfg.instance_ranks;
    out << YAML::EndMap;
  }

  if (cfg.model) {  // the peers compare it (geometry.cpp): a peer copy carries it too
    out << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "architecture" << YAML::Value << cfg.model->architecture;
    if (cfg.catalogue)  // the result is what counts: peers get the layout, not the file
      out << YAML::Comment("from model.config_json " + cfg.catalogue->config_json + " (engine " +
                           cfg.catalogue->convention + ": " + cfg.catalogue->family +
                           "); the pools' layout fields below are the catalogue's");
    if (!cfg.model->state_covers.empty())
      out << YAML::Key << "state_covers" << YAML::Value << cfg.model->state_covers;
    if (!cfg.model->fields.empty()) {
      out << YAML::Key << "fields" << YAML::Value << YAML::BeginMap;
      for (const auto& [key, value] : cfg.model->fields)
        out << YAML::Key << key << YAML::Value << value;
      out << YAML::EndMap;
    }
    out << YAML::EndMap;
  }

  out << YAML::Key << "listen" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "control" << YAML::Value << cfg.control_listen;
  out << YAML::Key << "client" << YAML::Value << cfg.client_listen;
  if (!cfg.metrics_listen.empty())
    out << YAML::Key << "metrics" << YAML::Value << cfg.metrics_listen;
  out << YAML::EndMap;

  out << YAML::Key << "fabric" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "provider" << YAML::Value << cfg.fabric.provider;
  out << YAML::Key << "address" << YAML::Value << cfg.fabric.address;
  out << YAML::Key << "max_inflight_writes" << YAML::Value << cfg.fabric.max_inflight_writes;
  out << YAML::Key << "max_inflight_bytes" << YAML::Value << cfg.fabric.max_inflight_bytes;
  out << YAML::Key << "write_piece_bytes" << YAML::Value << cfg.fabric.write_piece_bytes;
  out << YAML::Key << "staging_bytes" << YAML::Value << cfg.fabric.staging_bytes;
  // Unset stays unset (the default follows the provider), and the comment says what it is.
  if (cfg.fabric.pack_threshold_bytes)
    out << YAML::Key << "pack_threshold_bytes" << YAML::Value << *cfg.fabric.pack_threshold_bytes;
  else
    out << YAML::Comment(
        "pack_threshold_bytes not set: " + std::to_string(cfg.fabric.pack_threshold()) +
        " for provider " + cfg.fabric.provider);
  if (reader == yaml_for::self) {
    out << YAML::Key << "rails" << YAML::Value << cfg.fabric.rails;
    out << YAML::Key << "express_bytes" << YAML::Value << cfg.fabric.express_bytes;
  }
  out << YAML::EndMap;

  out << YAML::Key << "timeouts" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "handshake_ms" << YAML::Value << cfg.timeouts.handshake_ms;
  out << YAML::Key << "bootstrapping_ms" << YAML::Value << cfg.timeouts.bootstrapping_ms;
  out << YAML::Key << "waiting_for_input_ms" << YAML::Value << cfg.timeouts.waiting_for_input_ms;
  out << YAML::Key << "transferring_ms" << YAML::Value << cfg.timeouts.transferring_ms;
  out << YAML::Key << "transfer_ms" << YAML::Value << cfg.timeouts.transfer_ms;
  out << YAML::Key << "drain_ms" << YAML::Value << cfg.timeouts.drain_ms;
  out << YAML::Key << "stop_ms" << YAML::Value << cfg.timeouts.stop_ms;
  out << YAML::Key << "heartbeat_ms" << YAML::Value << cfg.timeouts.heartbeat_ms;
  out << YAML::Key << "heartbeat_misses" << YAML::Value << cfg.timeouts.heartbeat_misses;
  out << YAML::EndMap;

  if (const auto& sec = cfg.security;
      !sec.cluster_secret_file.empty() || !sec.client_users.empty() || !sec.client_groups.empty()) {
    out << YAML::Key << "security" << YAML::Value << YAML::BeginMap;
    if (!sec.cluster_secret_file.empty())
      out << YAML::Key << "cluster_secret_file" << YAML::Value << sec.cluster_secret_file;
    if (!sec.accepted_cluster_secret_file.empty())
      out << YAML::Key << "accepted_cluster_secret_file" << YAML::Value
          << sec.accepted_cluster_secret_file;
    if (!sec.client_users.empty())
      out << YAML::Key << "client_users" << YAML::Value << YAML::Flow << sec.client_users;
    if (!sec.client_groups.empty())
      out << YAML::Key << "client_groups" << YAML::Value << YAML::Flow << sec.client_groups;
    out << YAML::EndMap;
  }

  out << YAML::Key << "limits" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "max_active_rooms" << YAML::Value << cfg.limits.max_active_rooms;
  out << YAML::Key << "max_clients" << YAML::Value << cfg.limits.max_clients;
  out << YAML::Key << "client_frame_ms" << YAML::Value << cfg.limits.client_frame_ms;
  out << YAML::Key << "peer_preamble_ms" << YAML::Value << cfg.limits.peer_preamble_ms;
  out << YAML::Key << "max_pending_peers" << YAML::Value << cfg.limits.max_pending_peers;
  out << YAML::Key << "max_pending_peers_per_source" << YAML::Value
      << cfg.limits.max_pending_peers_per_source;
  out << YAML::EndMap;

  out << YAML::Key << "tp" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "size" << YAML::Value << cfg.tp.size;
  out << YAML::Key << "rank" << YAML::Value << cfg.tp.rank;
  out << YAML::EndMap;

  out << YAML::Key << "pp" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "size" << YAML::Value << cfg.pp.size;
  out << YAML::Key << "rank" << YAML::Value << cfg.pp.rank;
  out << YAML::EndMap;

  out << YAML::Key << "dp" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "size" << YAML::Value << cfg.dp.size;
  out << YAML::Key << "rank" << YAML::Value << cfg.dp.rank;
  out << YAML::EndMap;

  out << YAML::Key << "runtime" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "workers" << YAML::Value << cfg.runtime.workers;
  out << YAML::EndMap;

  if (reader == yaml_for::self) {  // the decode's own choice: a peer learns it per prepare
    out << YAML::Key << "integrity" << YAML::Value << YAML::BeginMap;
    out << YAML::Key << "checksums" << YAML::Value << cfg.integrity.checksums;
    out << YAML::EndMap;
  }

  out << YAML::Key << "log" << YAML::Value << YAML::BeginMap;
  out << YAML::Key << "level" << YAML::Value << cfg.log.level;
  out << YAML::Key << "format" << YAML::Value << cfg.log.format;
  out << YAML::Key << "levels" << YAML::Value << YAML::BeginMap;
  for (const auto& [logger, level] : cfg.log.levels)
    out << YAML::Key << logger << YAML::Value << level;
  out << YAML::EndMap;
  out << YAML::Key << "summary_ms" << YAML::Value << cfg.log.summary_ms;
  out << YAML::Key << "burst" << YAML::Value << cfg.log.burst;
  out << YAML::EndMap;

  out << YAML::Key << "pools" << YAML::Value << YAML::BeginMap;
  if (cfg.pools.kv) {
    const kv_pool_config& kv = *cfg.pools.kv;
    out << YAML::Key << "kv" << YAML::Value << YAML::BeginMap;
    if (!emit_undescribed(out, kv.placement, kv.layer_ids.empty())) {
      out << YAML::Key << "layer_ids" << YAML::Value;
      emit_ids(out, kv.layer_ids);
      out << YAML::Key << "page_tokens" << YAML::Value << kv.page_tokens;
      out << YAML::Key << "kv_heads" << YAML::Value << kv.kv_heads;
      if (kv.total_heads)
        out << YAML::Key << "total_heads" << YAML::Value << kv.total_heads;
      else if (!kv.mla)
        out << YAML::Comment("total_heads not set: kv_heads x tp.size = " +
                             std::to_string(kv.model_heads(cfg.tp.size)) + " assumed");
      out << YAML::Key << "head_dim" << YAML::Value << kv.head_dim;
      out << YAML::Key << "dtype_bytes" << YAML::Value << kv.dtype_bytes;
      out << YAML::Key << "mla" << YAML::Value << kv.mla;
      out << YAML::Key << "pages" << YAML::Value << kv.pages;
      if (kv.memory != pool_memory::daemon)
        out << YAML::Key << "memory" << YAML::Value << to_string(kv.memory);
      emit_offsets(out, kv.placement);
    }
    out << YAML::EndMap;
  }
  if (cfg.pools.mamba) {
    const mamba_pool_config& mamba = *cfg.pools.mamba;
    out << YAML::Key << "mamba" << YAML::Value << YAML::BeginMap;
    if (!emit_undescribed(out, mamba.placement, mamba.tensors.empty())) {
      if (mamba.type != state_type::mamba)
        out << YAML::Key << "type" << YAML::Value << to_string(mamba.type);
      out << YAML::Key << "slots" << YAML::Value << mamba.slots;
      out << YAML::Key << "layer_ids" << YAML::Value;
      emit_ids(out, mamba.layer_ids);
      out << YAML::Key << "tensors" << YAML::Value << YAML::BeginSeq;
      for (const state_tensor_config& t : mamba.tensors) {
        out << YAML::BeginMap;
        out << YAML::Key << "name" << YAML::Value << t.name;
        out << YAML::Key << "shape" << YAML::Value;
        emit_dims(out, t.shape);
        out << YAML::Key << "dtype_bytes" << YAML::Value << t.dtype_bytes;
        if (!t.dtype.empty()) out << YAML::Key << "dtype" << YAML::Value << t.dtype;
        if (t.slice_axis) out << YAML::Key << "slice_axis" << YAML::Value << *t.slice_axis;
        if (!t.shard_groups.empty()) {
          out << YAML::Key << "shard_groups" << YAML::Value;
          emit_dims(out, t.shard_groups);
        }
        if (!t.shard_units.empty()) {
          out << YAML::Key << "shard_units" << YAML::Value;
          emit_dims(out, t.shard_units);
        }
        out << YAML::EndMap;
      }
      out << YAML::EndSeq;
      if (mamba.memory != pool_memory::daemon)
        out << YAML::Key << "memory" << YAML::Value << to_string(mamba.memory);
      emit_offsets(out, mamba.placement);
    }
    out << YAML::EndMap;
  }
  if (cfg.pools.aux) {
    const aux_pool_config& aux = *cfg.pools.aux;
    out << YAML::Key << "aux" << YAML::Value << YAML::BeginMap;
    if (!emit_undescribed(out, aux.placement, aux.rows == 0)) {
      out << YAML::Key << "rows" << YAML::Value << aux.rows;
      out << YAML::Key << "row_bytes" << YAML::Value;
      if (aux.more_row_bytes.empty())
        out << aux.row_bytes;
      else
        emit_dims(out, aux.row_sizes());
      if (aux.room_id_buffer == aux_pool_config::no_room_id)
        out << YAML::Key << "room_id_buffer" << YAML::Value << "none";
      else if (aux.room_id_buffer != 0)
        out << YAML::Key << "room_id_buffer" << YAML::Value << aux.room_id_buffer;
      if (aux.memory != pool_memory::daemon)
        out << YAML::Key << "memory" << YAML::Value << to_string(aux.memory);
      emit_offsets(out, aux.placement);
    }
    out << YAML::EndMap;
  }
  out << YAML::EndMap;

  out << YAML::EndMap;
  return std::string(out.c_str()) + "\n";
}

}  // namespace ferry
