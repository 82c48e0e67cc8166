#pragma once
// The golden frames of the client protocol (tests/golden/frames.txt): one of every message in
// every version it exists in. The C++ test below and the Python tests (tests/python) decode each
// frame of the file and re-encode it to the same bytes, so the two codecs cannot drift.
// Regenerate the file after a deliberate change of the wire format:
//   FERRY_WRITE_GOLDEN=1 build/tests/ferry_core_tests "golden frames*"

#include <string>
#include <vector>

#include "core/protocol.hpp"

namespace ferry::test {

struct golden_frame {
  uint16_t version;
  std::string name;
  uint32_t seq;
  proto::message msg;
};

inline std::vector<golden_frame> golden_frames() {
  using namespace proto;
  hello_reply hr;
  hr.node = "decode-0";
  hr.instance = "0a1b2c3d";
  hr.role = "decode";
  hr.control = "127.0.0.1:7402";
  hr.tp_size = 2;
  hr.tp_rank = 1;
  hr.page_tokens = 16;
  hr.config_yaml = "role: decode\n";
  hr.pools[0].present = true;
  hr.pools[0].shm_name = "/ferry.decode-0.0a1b2c3d.kv";
  hr.pools[0].layout.present = true;
  hr.pools[0].layout.total_bytes = 2048;
  hr.pools[0].layout.buffers = {{0, 512, 2, 3, 0, buffer_kind::k},
                                {1024, 512, 2, 3, 0, buffer_kind::v}};
  hr.pools[2].present = true;
  hr.pools[2].shm_name = "/ferry.decode-0.0a1b2c3d.aux";
  hr.pools[2].layout.present = true;
  hr.pools[2].layout.total_bytes = 64;
  hr.pools[2].layout.buffers = {{0, 32, 2, 0, 0, buffer_kind::aux}};

  std::vector<golden_frame> out;
  for (uint16_t v = min_protocol_version; v <= protocol_version; ++v) {
    hello h{v, "engine-7", true, v};
    if (v >= 4) h.min_version = 3;
    auto r = hr;
    r.version = v;
    r.min_version = 3;  // on the wire in v4 only
    r.max_version = v;
    out.push_back({v, "hello", 1, h});
    out.push_back({v, "hello_reply", 1, r});
    if (v >= 7) {  // a pool its registration describes, before and after the first one
      auto described = r;
      described.pools[1].present = described.pools[1].layout.present = true;
      described.pools[1].registered = true;
      described.pools[2].registered = true;
      described.pools[2].shm_name.clear();
      out.push_back({v, "hello_reply_registered", 1, described});
    }
    // prefix_tokens (v4) is on the wire in v4 only
    out.push_back(
        {v, "prepare", 2,
         prepare{77, {"127.0.0.1:7401", "10.0.0.2:7401"}, {5, 6, 9}, 2, 3, v >= 4 ? 48u : 0u}});
    out.push_back({v, "send", 3, send{77, {1, 2}, false, no_index, no_index}});
    out.push_back({v, "send_last", 4, send{77, {}, true, 1, 1}});
    // A layer range (v6): layers [12, 15) of the last chunk.
    if (v >= 6) out.push_back({v, "send_layers", 4, send{77, {1, 2}, true, 1, 1, 12, 3}});
    if (v >= 8) {  // a paged state pool's pages (swa, dsa, minimax_index_k)
      out.push_back({v, "prepare_state_pages", 2,
                     prepare{77, {"127.0.0.1:7401"}, {5, 6}, no_index, 3, 0, {30, 31, 2}}});
      out.push_back(
          {v, "send_state_pages", 4, send{77, {1, 2}, true, no_index, 1, 0, 0, {5, 6, 20}}});
    }
    if (v >= 10) {  // a room the decode asks to be checked end to end
      prepare checked{77, {"127.0.0.1:7401"}, {5, 6}, 2, 3, 16};
      checked.checksum = true;
      out.push_back({v, "prepare_checked", 2, checked});
    }
    out.push_back({v, "poll", 5, poll{77}});
    out.push_back({v, "cancel", 6, cancel{78}});
    out.push_back({v, "subscribe", 7, subscribe{77}});
    out.push_back({v, "info", 8, info{info_topic::peers}});
    out.push_back({v, "info_pools", 8, info{info_topic::pools}});
    out.push_back({v, "ok", 2, ok{}});
    out.push_back({v, "error", 9, error{errc::unknown_room, "unknown room 79"}});
    out.push_back({v, "poll_reply_success", 5,
                   poll_reply{77, room_status::success, "", errc::ok, v >= 4 ? 48u : 0u}});
    out.push_back({v, "poll_reply_failed", 5,
                   poll_reply{78, room_status::failed, "cancelled by client", errc::cancelled}});
    out.push_back({v, "info_reply", 8,
                   info_reply{R"([{"room":77,"side":"decode","status":"Transferring",)"
                              R"("peer":"127.0.0.1:7401"}])"}});
    out.push_back(
        {v, "event", 0,
         event{78, room_status::failed, "peer 127.0.0.1:7401 lost: gone", errc::peer_lost}});
    if (v >= 4) {
      register_memory reg;
      reg.pool = pool_kind::kv;
      reg.kind = memory_kind::host;
      reg.fd_count = 2;
      reg.buffers = {{0, 0, 512, 2, 3, 0, buffer_kind::k}, {1, 4096, 512, 2, 3, 0, buffer_kind::v}};
      out.push_back({v, "register_memory", 11, reg});
      if (v >= 7) {
        // A pool the registration describes: any offsets, with the slicing facts.
        register_memory described;
        described.pool = pool_kind::state;
        described.fd_count = 1;
        described.buffers = {{0, 76800, 6144, 9, 5, 0, buffer_kind::state, 1024, 0, 1, {512, 512}},
                             {0, 131072, 65536, 9, 5, 1, buffer_kind::state, 4, 0, 1, {}}};
        out.push_back({v, "register_memory_described", 11, described});
        register_memory aux;
        aux.pool = pool_kind::aux;
        aux.fd_count = 1;
        aux.buffers = {{0, 0, 64, 8, 0, 0, buffer_kind::aux},
                       {0, 512, 8, 8, 0, 0, buffer_kind::aux}};
        aux.room_id_buffer = 1;
        out.push_back({v, "register_memory_aux", 11, aux});
        register_memory kv = reg;
        kv.page_tokens = 16;
        for (auto& b : kv.buffers) b.slice_dim = 2, b.total_dim = 4;
        out.push_back({v, "register_memory_kv", 11, kv});
      }
      if (v >= 8) {
        register_memory swa;
        swa.pool = pool_kind::state;
        swa.fd_count = 1;
        swa.buffers = {{0, 8192, 4096, 32, 0, 0, buffer_kind::state},
                       {0, 139264, 4096, 32, 0, 1, buffer_kind::state}};
        swa.state = state_type::swa;
        out.push_back({v, "register_memory_swa", 11, swa});
      }
      if (v >= 9) {
        // Mamba2 with n_groups 1 at TP 2: conv [x | B | C] with B and C held whole (units).
        register_memory replicated;
        replicated.pool = pool_kind::state;
        replicated.fd_count = 1;
        replicated.buffers = {
            {0, 0, 26112, 4, 0, 0, buffer_kind::state, 4352, 0, 1, {8192, 128, 128}, {128, 1, 1}}};
        out.push_back({v, "register_memory_replicated", 11, replicated});
      }
      out.push_back({v, "discover", 12, discover{"10.0.0.2:7401"}});
      discover_reply found;
      found.ranks.push_back({"10.0.0.2:7401", true, "prefill-1", 2, 1, 1, 0, 2, 1, ""});
      found.ranks.push_back({"10.0.0.3:7401", false, "", 0, 0, 0, 0, 0, 0,
                             "cannot connect to 10.0.0.3:7401: refused"});
      out.push_back({v, "discover_reply", 12, found});
      out.push_back({v, "poll_many", 10, poll_many{{77, 78, 79}}});
      out.push_back({v, "poll_many_reply", 10,
                     poll_many_reply{{poll_reply{77, room_status::transferring, "", errc::ok, 48},
                                      poll_reply{78, room_status::failed, "cancelled by client",
                                                 errc::cancelled},
                                      poll_reply{79, room_status::bootstrapping, "", errc::ok}}}});
    }
    if (v >= 5) {
      out.push_back({v, "drain", 13, drain{}});
      out.push_back({v, "set_log_level", 14, set_log_level{"peer", "debug"}});
      out.push_back({v, "set_log_level_all", 14, set_log_level{"", "warn"}});
    }
  }
  return out;
}

}  // namespace ferry::test
