// Decoding: a frame's body to a message, every read bounds-checked and a failure naming the
// message type and field, and frame_reader, which cuts a byte stream into frames.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/protocol.hpp"
#include "core/protocol_detail.hpp"

namespace ferry::proto {

using detail::wire_int_t;

namespace {

/// Bounds-checked reader: every read names the field it was reading when it fails.
class reader {
 public:
  reader(std::span<const uint8_t> in, uint16_t version) : version(version), in_(in) {}
  const uint16_t version;  ///< of the connection: some bodies differ between versions
  template <class T>
  bool num(T& v, const char* field) {
    using U = wire_int_t<T>;
    if (in_.size() - pos_ < sizeof(U)) return fail(field, sizeof(U));
    U u = 0;
    for (size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(U{in_[pos_ + i]} << (8 * i));
    pos_ += sizeof(U);
    v = static_cast<T>(u);
    return true;
  }
  bool boolean(bool& b, const char* field) {
    uint8_t v = 0;
    if (!num(v, field)) return false;
    if (v > 1) {
      error_ = fmt::format("field '{}' must be 0 or 1, got {}", field, v);
      return false;
    }
    b = v == 1;
    return true;
  }
  bool str(std::string& s, const char* field) {
    uint32_t n = 0;
    if (!num(n, field)) return false;
    if (n > max_string_bytes) {
      error_ =
          fmt::format("field '{}' is {} bytes, above the limit of {}", field, n, max_string_bytes);
      return false;
    }
    if (in_.size() - pos_ < n) return fail(field, n);
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool str_list(std::vector<std::string>& v, const char* field) {
    uint32_t n = 0;
    if (!num(n, field)) return false;
    if (n > max_list_strings) {
      error_ = fmt::format("field '{}' has {} entries, above the limit of {}", field, n,
                           max_list_strings);
      return false;
    }
    v.resize(n);
    for (auto& x : v)
      if (!str(x, field)) return false;
    return true;
  }
  /// u32 count (at most `limit`), then that many integers of type T.
  template <class T>
  bool num_list(std::vector<T>& v, const char* field, uint32_t limit = UINT32_MAX) {
    uint32_t n = 0;
    if (!num(n, field)) return false;
    if (n > limit) {
      error_ = fmt::format("field '{}' has {} entries, above the limit of {}", field, n, limit);
      return false;
    }
    if ((in_.size() - pos_) / sizeof(T) < n) {
      error_ = fmt::format("field '{}' claims {} entries but only {} bytes remain", field, n,
                           in_.size() - pos_);
      return false;
    }
    v.resize(n);
    for (auto& x : v) num(x, field);
    return true;
  }
  bool code(errc& c, const char* field) {
    uint16_t v = 0;
    if (!num(v, field)) return false;
    c = static_cast<errc>(v);
    return true;
  }
  bool status(room_status& s, const char* field) {
    uint8_t v = 0;
    if (!num(v, field)) return false;
    if (v > static_cast<uint8_t>(room_status::success)) {
      error_ = fmt::format("field '{}' is not a status: {}", field, v);
      return false;
    }
    s = static_cast<room_status>(v);
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  const std::string& error() const { return error_; }
  void set_error(std::string e) { error_ = std::move(e); }

 private:
  bool fail(const char* field, size_t need) {
    error_ = fmt::format("truncated at field '{}': needs {} bytes, {} remain", field, need,
                         in_.size() - pos_);
    return false;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  std::string error_;
};

bool decode_body(reader& r, hello& m) {
  uint8_t cancel = 0;
  if (!(r.num(m.version, "version") && r.str(m.client_name, "client_name") &&
        r.num(cancel, "cancel_on_disconnect")))
    return false;
  m.cancel_on_disconnect = cancel != 0;
  m.min_version = m.version;  // a v3 hello speaks only its own version
  if (m.version >= 4) {
    if (!r.num(m.min_version, "min_version")) return false;
    if (m.min_version > m.version) {
      r.set_error(
          fmt::format("field 'min_version' is {}, above 'version' {}", m.min_version, m.version));
      return false;
    }
  }
  return true;
}
bool decode_body(reader& r, prepare& m) {
  return r.num(m.room, "room") && r.str_list(m.prefill_peers, "prefill_peers") &&
         r.num_list(m.dst_pages, "dst_pages") && r.num(m.state_slot, "state_slot") &&
         r.num(m.aux_row, "aux_row") &&
         (r.version < 4 || r.num(m.prefix_tokens, "prefix_tokens")) &&
         (r.version < 8 || r.num_list(m.state_pages, "state_pages")) &&
         (r.version < 10 || r.boolean(m.checksum, "checksum"));
}
bool decode_body(reader& r, send& m) {
  return r.num(m.room, "room") && r.num_list(m.src_pages, "src_pages") &&
         r.boolean(m.last, "last") && r.num(m.state_slot, "state_slot") &&
         r.num(m.aux_row, "aux_row") &&
         (r.version < 6 ||
          (r.num(m.first_layer, "first_layer") && r.num(m.layer_count, "layer_count"))) &&
         (r.version < 8 || r.num_list(m.state_pages, "state_pages"));
}
bool decode_body(reader& r, poll& m) { return r.num(m.room, "room"); }
bool decode_body(reader& r, cancel& m) { return r.num(m.room, "room"); }
bool decode_body(reader& r, subscribe& m) { return r.num(m.room, "room"); }
bool decode_body(reader& r, info& m) {
  if (!r.num(m.topic, "topic")) return false;
  if (m.topic > info_topic::timelines) {
    r.set_error(fmt::format("field 'topic' must be 0..4, got {}", static_cast<int>(m.topic)));
    return false;
  }
  return true;
}
bool decode_body(reader& r, register_memory& m) {
  uint8_t pool = 0;
  uint32_t n = 0;
  if (!(r.num(pool, "pool") && r.num(m.kind, "memory_kind") && r.num(m.fd_count, "fd_count") &&
        r.num(n, "buffers")))
    return false;
  if (pool >= pool_kind_count) {
    r.set_error(fmt::format("field 'pool' must be 0..{}, got {}", pool_kind_count - 1, pool));
    return false;
  }
  m.pool = static_cast<pool_kind>(pool);
  if (m.fd_count > max_register_fds) {
    r.set_error(
        fmt::format("field 'fd_count' is {}, above the limit of {}", m.fd_count, max_register_fds));
    return false;
  }
  if (n > max_register_buffers) {
    r.set_error(fmt::format("field 'buffers' has {} entries, above the limit of {}", n,
                            max_register_buffers));
    return false;
  }
  if (r.remaining() / 37 < n) {  // 37 bytes per buffer entry
    r.set_error(fmt::format("field 'buffers' claims {} entries, too many for the frame", n));
    return false;
  }
  m.buffers.resize(n);
  for (auto& b : m.buffers) {
    uint8_t kind = 0;
    if (!(r.num(b.fd_index, "buffer.fd_index") && r.num(b.fd_offset, "buffer.fd_offset") &&
          r.num(b.item_bytes, "buffer.item_bytes") && r.num(b.items, "buffer.items") &&
          r.num(b.layer_id, "buffer.layer_id") && r.num(b.tensor, "buffer.tensor") &&
          r.num(kind, "buffer.kind")))
      return false;
    if (kind > static_cast<uint8_t>(buffer_kind::aux)) {
      r.set_error(fmt::format("field 'buffer.kind' is not a buffer kind: {}", kind));
      return false;
    }
    b.kind = static_cast<buffer_kind>(kind);
    if (r.version < 7) continue;
    uint16_t groups = 0;
    if (!(r.num(b.slice_dim, "buffer.slice_dim") && r.num(b.total_dim, "buffer.total_dim") &&
          r.num(b.outer, "buffer.outer") && r.num(groups, "buffer.groups")))
      return false;
    if (groups > max_shard_groups) {
      r.set_error(fmt::format("field 'buffer.groups' has {} entries, above the limit of {}", groups,
                              max_shard_groups));
      return false;
    }
    b.groups.resize(groups);
    for (auto& g : b.groups)
      if (!r.num(g, "buffer.group")) return false;
    if (r.version < 9) continue;
    uint16_t units = 0;
    if (!r.num(units, "buffer.units")) return false;
    if (units != 0 && units != groups) {
      r.set_error(
          fmt::format("field 'buffer.units' has {} entries for {} shard groups (0 or one "
                      "per group)",
                      units, groups));
      return false;
    }
    b.units.resize(units);
    for (auto& u : b.units)
      if (!r.num(u, "buffer.unit")) return false;
  }
  if (r.version >= 7 &&
      !(r.num(m.page_tokens, "page_tokens") && r.num(m.room_id_buffer, "room_id_buffer")))
    return false;
  if (r.version < 8) return true;
  uint8_t type = 0;
  if (!r.num(type, "state_type")) return false;
  if (type >= state_type_count) {
    r.set_error(
        fmt::format("field 'state_type' must be 0..{}, got {}", state_type_count - 1, type));
    return false;
  }
  m.state = static_cast<state_type>(type);
  return true;
}
bool decode_body(reader& r, discover& m) { return r.str(m.address, "address"); }
bool decode_body(reader&, drain&) { return true; }
bool decode_body(reader& r, set_log_level& m) {
  return r.str(m.logger, "logger") && r.str(m.level, "level");
}
bool decode_body(reader& r, discover_reply& m) {
  uint32_t n = 0;
  if (!r.num(n, "ranks")) return false;
  if (n > max_list_strings) {
    r.set_error(
        fmt::format("field 'ranks' has {} entries, above the limit of {}", n, max_list_strings));
    return false;
  }
  m.ranks.resize(n);
  for (auto& x : m.ranks)
    if (!(r.str(x.address, "rank.address") && r.boolean(x.up, "rank.up") &&
          r.str(x.node, "rank.node") && r.num(x.tp_size, "rank.tp_size") &&
          r.num(x.tp_rank, "rank.tp_rank") && r.num(x.pp_size, "rank.pp_size") &&
          r.num(x.pp_rank, "rank.pp_rank") && r.num(x.dp_size, "rank.dp_size") &&
          r.num(x.dp_rank, "rank.dp_rank") && r.str(x.reason, "rank.reason")))
      return false;
  return true;
}
bool decode_body(reader& r, poll_many& m) { return r.num_list(m.rooms, "rooms", max_poll_many); }
bool decode_body(reader&, ok&) { return true; }
bool decode_body(reader& r, error& m) {
  return r.num(m.code, "code") && r.str(m.message, "message");
}
bool decode_body(reader& r, hello_reply& m) {
  if (!(r.num(m.version, "version") && r.str(m.node, "node") && r.str(m.instance, "instance") &&
        r.str(m.role, "role") && r.str(m.control, "control") && r.num(m.tp_size, "tp_size") &&
        r.num(m.tp_rank, "tp_rank") && r.num(m.page_tokens, "page_tokens") &&
        r.str(m.config_yaml, "config_yaml")))
    return false;
  for (auto& p : m.pools) {
    uint32_t n = 0;
    if (!(r.boolean(p.present, "pool.present") && r.str(p.shm_name, "pool.shm_name") &&
          r.num(p.layout.total_bytes, "pool.total_bytes") && r.num(n, "pool.buffers")))
      return false;
    if (r.remaining() / 33 < n) {
      r.set_error(fmt::format("field 'pool.buffers' claims {} entries, too many for the frame", n));
      return false;
    }
    p.layout.present = p.present;
    p.layout.buffers.resize(n);
    for (auto& b : p.layout.buffers)
      if (!(r.num(b.offset, "buffer.offset") && r.num(b.item_bytes, "buffer.item_bytes") &&
            r.num(b.items, "buffer.items") && r.num(b.layer_id, "buffer.layer_id") &&
            r.num(b.tensor, "buffer.tensor") && r.num(b.kind, "buffer.kind")))
        return false;
    if (m.version >= 7 && !r.boolean(p.registered, "pool.registered")) return false;
  }
  if (m.version >= 4) {
    if (!(r.num(m.min_version, "min_version") && r.num(m.max_version, "max_version"))) return false;
  } else {
    m.min_version = m.max_version = m.version;
  }
  return true;
}
template <class T>
bool decode_status(reader& r, T& m) {
  return r.num(m.room, "room") && r.status(m.status, "status") &&
         (r.version < 4 || r.code(m.code, "code")) && r.str(m.reason, "reason") &&
         (r.version < 4 || r.num(m.prefix_tokens, "prefix_tokens"));
}
bool decode_body(reader& r, poll_reply& m) { return decode_status(r, m); }
bool decode_body(reader& r, info_reply& m) { return r.str(m.text, "text"); }
bool decode_body(reader& r, event& m) { return decode_status(r, m); }
bool decode_body(reader& r, poll_many_reply& m) {
  uint32_t n = 0;
  if (!r.num(n, "rooms")) return false;
  // Each entry takes at least 19 bytes (room, status, code, an empty reason's length, prefix).
  if (r.remaining() / 19 < n) {
    r.set_error(fmt::format("field 'rooms' claims {} entries, too many for the frame", n));
    return false;
  }
  m.rooms.resize(n);
  for (auto& x : m.rooms)
    if (!decode_status(r, x)) return false;
  return true;
}

template <class T>
decoded decode_as(std::span<const uint8_t> body, uint32_t seq, msg_type t, uint16_t version) {
  reader r(body, version);
  T m;
  decoded out;
  out.seq = seq;
  if (!decode_body(r, m)) {
    out.code = errc::malformed_frame;
    out.error = fmt::format("malformed {} frame: {}", to_string(t), r.error());
    return out;
  }
  if (r.remaining() != 0) {
    out.code = errc::malformed_frame;
    out.error = fmt::format("malformed {} frame: {} unexpected bytes after the last field",
                            to_string(t), r.remaining());
    return out;
  }
  out.msg = std::move(m);
  return out;
}

}  // namespace

decoded decode(uint16_t type, uint32_t seq, std::span<const uint8_t> body, uint16_t version) {
  const auto t = static_cast<msg_type>(type);
  if (version < first_version(t)) {
    decoded out;
    out.seq = seq;
    out.code = errc::malformed_frame;
    out.error = fmt::format("{} needs protocol version {}; this connection speaks {}", to_string(t),
                            first_version(t), version);
    return out;
  }
  switch (t) {
    case msg_type::hello:
      return decode_as<hello>(body, seq, t, version);
    case msg_type::prepare:
      return decode_as<prepare>(body, seq, t, version);
    case msg_type::send:
      return decode_as<send>(body, seq, t, version);
    case msg_type::poll:
      return decode_as<poll>(body, seq, t, version);
    case msg_type::cancel:
      return decode_as<cancel>(body, seq, t, version);
    case msg_type::subscribe:
      return decode_as<subscribe>(body, seq, t, version);
    case msg_type::info:
      return decode_as<info>(body, seq, t, version);
    case msg_type::ok:
      return decode_as<ok>(body, seq, t, version);
    case msg_type::error:
      return decode_as<error>(body, seq, t, version);
    case msg_type::hello_reply:
      return decode_as<hello_reply>(body, seq, t, version);
    case msg_type::poll_reply:
      return decode_as<poll_reply>(body, seq, t, version);
    case msg_type::info_reply:
      return decode_as<info_reply>(body, seq, t, version);
    case msg_type::event:
      return decode_as<event>(body, seq, t, version);
    case msg_type::poll_many:
      return decode_as<poll_many>(body, seq, t, version);
    case msg_type::poll_many_reply:
      return decode_as<poll_many_reply>(body, seq, t, version);
    case msg_type::register_memory:
      return decode_as<register_memory>(body, seq, t, version);
    case msg_type::discover:
      return decode_as<discover>(body, seq, t, version);
    case msg_type::discover_reply:
      return decode_as<discover_reply>(body, seq, t, version);
    case msg_type::drain:
      return decode_as<drain>(body, seq, t, version);
    case msg_type::set_log_level:
      return decode_as<set_log_level>(body, seq, t, version);
  }
  decoded out;
  out.seq = seq;
  out.code = errc::malformed_frame;
  out.error = fmt::format("unknown message type {}", type);
  return out;
}

void frame_reader::feed(std::span<const uint8_t> bytes) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

std::optional<decoded> frame_reader::next() {
  const size_t avail = buf_.size() - pos_;
  if (avail < 4) return std::nullopt;
  const uint8_t* p = buf_.data() + pos_;
  const uint32_t len =
      uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
  if (len > max_frame_bytes) {
    decoded d;
    d.code = errc::frame_too_large;
    d.framing_lost = true;
    d.error = fmt::format("frame of {} bytes exceeds the limit of {} bytes", len, max_frame_bytes);
    return d;
  }
  if (len < header_bytes - 4) {
    decoded d;
    d.code = errc::malformed_frame;
    d.framing_lost = true;
    d.error = fmt::format("frame length {} is shorter than the {}-byte header", len, header_bytes);
    return d;
  }
  if (avail < 4 + size_t{len}) return std::nullopt;
  const uint16_t type = static_cast<uint16_t>(p[4] | p[5] << 8);
  const uint32_t seq =
      uint32_t{p[8]} | uint32_t{p[9]} << 8 | uint32_t{p[10]} << 16 | uint32_t{p[11]} << 24;
  const uint16_t flags = static_cast<uint16_t>(p[6] | p[7] << 8);
  auto body = std::span<const uint8_t>(p + header_bytes, len - (header_bytes - 4));
  pos_ += 4 + size_t{len};
  decoded out;
  if (flags != 0) {  // reserved: a frame using them means something this version cannot know
    out.seq = seq;
    out.code = errc::malformed_frame;
    out.error = fmt::format("frame flags must be 0, got {:#06x}", flags);
  } else {
    out = decode(type, seq, body, version_);
  }
  // Compact occasionally so a long-lived connection does not grow its buffer.
  if (pos_ > (1u << 20) && pos_ * 2 > buf_.size()) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  return out;
}

}  // namespace ferry::proto
