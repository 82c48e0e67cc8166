// Encoding: messages to frames (header, then the body in the connection's version).
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/protocol.hpp"
#include "core/protocol_detail.hpp"

namespace ferry::proto {

using detail::wire_int_t;

namespace {

class writer {
 public:
  writer(std::vector<uint8_t>& out, uint16_t version) : version(version), out_(out) {}
  const uint16_t version;  ///< of the connection: some bodies differ between versions
  template <class T>
  void num(T v) {
    using U = wire_int_t<T>;
    auto u = static_cast<U>(v);
    for (size_t i = 0; i < sizeof(U); ++i) out_.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  void str(const std::string& s) {
    num(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  void str_list(const std::vector<std::string>& v) {
    num(static_cast<uint32_t>(v.size()));
    for (const auto& x : v) str(x);
  }
  void u32_list(const std::vector<uint32_t>& v) {
    num(static_cast<uint32_t>(v.size()));
    for (auto x : v) num(x);
  }

 private:
  std::vector<uint8_t>& out_;
};

void encode_body(writer& w, const hello& m) {
  w.num(m.version);
  w.str(m.client_name);
  w.num(static_cast<uint8_t>(m.cancel_on_disconnect));
  if (m.version >= 4) w.num(m.min_version);
}
void encode_body(writer& w, const prepare& m) {
  w.num(m.room);
  w.str_list(m.prefill_peers);
  w.u32_list(m.dst_pages);
  w.num(m.state_slot);
  w.num(m.aux_row);
  if (w.version >= 4) w.num(m.prefix_tokens);
  if (w.version >= 8) w.u32_list(m.state_pages);
  if (w.version >= 10) w.num(static_cast<uint8_t>(m.checksum));
}
void encode_body(writer& w, const send& m) {
  w.num(m.room);
  w.u32_list(m.src_pages);
  w.num(static_cast<uint8_t>(m.last));
  w.num(m.state_slot);
  w.num(m.aux_row);
  if (w.version >= 6) {
    w.num(m.first_layer);
    w.num(m.layer_count);
  }
  if (w.version >= 8) w.u32_list(m.state_pages);
}
void encode_body(writer& w, const poll& m) { w.num(m.room); }
void encode_body(writer& w, const cancel& m) { w.num(m.room); }
void encode_body(writer& w, const subscribe& m) { w.num(m.room); }
void encode_body(writer& w, const info& m) { w.num(m.topic); }
void encode_body(writer& w, const register_memory& m) {
  w.num(static_cast<uint8_t>(m.pool));
  w.num(m.kind);
  w.num(m.fd_count);
  w.num(static_cast<uint32_t>(m.buffers.size()));
  for (const auto& b : m.buffers) {
    w.num(b.fd_index);
    w.num(b.fd_offset);
    w.num(b.item_bytes);
    w.num(b.items);
    w.num(b.layer_id);
    w.num(b.tensor);
    w.num(b.kind);
    if (w.version >= 7) {
      w.num(b.slice_dim);
      w.num(b.total_dim);
      w.num(b.outer);
      w.num(static_cast<uint16_t>(b.groups.size()));
      for (auto g : b.groups) w.num(g);
      if (w.version >= 9) {
        w.num(static_cast<uint16_t>(b.units.size()));
        for (auto u : b.units) w.num(u);
      }
    }
  }
  if (w.version >= 7) {
    w.num(m.page_tokens);
    w.num(m.room_id_buffer);
  }
  if (w.version >= 8) w.num(static_cast<uint8_t>(m.state));
}
void encode_body(writer& w, const discover& m) { w.str(m.address); }
void encode_body(writer&, const drain&) {}
void encode_body(writer& w, const set_log_level& m) {
  w.str(m.logger);
  w.str(m.level);
}
void encode_body(writer& w, const discover_reply& m) {
  w.num(static_cast<uint32_t>(m.ranks.size()));
  for (const auto& r : m.ranks) {
    w.str(r.address);
    w.num(static_cast<uint8_t>(r.up));
    w.str(r.node);
    w.num(r.tp_size);
    w.num(r.tp_rank);
    w.num(r.pp_size);
    w.num(r.pp_rank);
    w.num(r.dp_size);
    w.num(r.dp_rank);
    w.str(r.reason);
  }
}
void encode_body(writer& w, const poll_many& m) {
  w.num(static_cast<uint32_t>(m.rooms.size()));
  for (auto r : m.rooms) w.num(r);
}
void encode_body(writer&, const ok&) {}
void encode_body(writer& w, const error& m) {
  w.num(m.code);
  w.str(m.message);
}
void encode_body(writer& w, const hello_reply& m) {
  w.num(m.version);
  w.str(m.node);
  w.str(m.instance);
  w.str(m.role);
  w.str(m.control);
  w.num(m.tp_size);
  w.num(m.tp_rank);
  w.num(m.page_tokens);
  w.str(m.config_yaml);
  for (const auto& p : m.pools) {
    w.num(static_cast<uint8_t>(p.present));
    w.str(p.shm_name);
    w.num(p.layout.total_bytes);
    w.num(static_cast<uint32_t>(p.layout.buffers.size()));
    for (const auto& b : p.layout.buffers) {
      w.num(b.offset);
      w.num(b.item_bytes);
      w.num(b.items);
      w.num(b.layer_id);
      w.num(b.tensor);
      w.num(b.kind);
    }
    if (m.version >= 7) w.num(static_cast<uint8_t>(p.registered));
  }
  if (m.version >= 4) {
    w.num(m.min_version);
    w.num(m.max_version);
  }
}
/// A room's status: `u64 room, u8 status, (v4) u16 code, string reason`.
/// A room's status (poll_reply, event, each poll_many_reply entry): v3 room, status, reason;
/// v4 adds the code before the reason and the prefill's prefix_tokens after it.
template <class T>
void encode_status(writer& w, const T& m) {
  w.num(m.room);
  w.num(m.status);
  if (w.version >= 4) w.num(m.code);
  w.str(m.reason);
  if (w.version >= 4) w.num(m.prefix_tokens);
}
void encode_body(writer& w, const poll_reply& m) { encode_status(w, m); }
void encode_body(writer& w, const info_reply& m) { w.str(m.text); }
void encode_body(writer& w, const event& m) { encode_status(w, m); }
void encode_body(writer& w, const poll_many_reply& m) {
  w.num(static_cast<uint32_t>(m.rooms.size()));
  for (const auto& r : m.rooms) encode_status(w, r);
}

}  // namespace

std::vector<uint8_t> encode(const message& m, uint32_t seq, uint16_t version) {
  std::vector<uint8_t> out;
  out.reserve(64);
  writer w(out, version);
  w.num(uint32_t{0});  // length, patched below
  w.num(static_cast<uint16_t>(type_of(m)));
  w.num(uint16_t{0});
  w.num(seq);
  std::visit([&](const auto& x) { encode_body(w, x); }, m);
  const uint32_t len = static_cast<uint32_t>(out.size() - 4);
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint8_t>(len >> (8 * i));
  return out;
}

}  // namespace ferry::proto
