// The peer channel's frames and message bodies (core/peer_wire.hpp).
#include "core/peer_wire.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

namespace ferry::peer_wire {

namespace {

/// The regions a hello may list: one per pool kind, with room to grow.
constexpr uint32_t max_hello_regions = 16;

class writer {
 public:
  explicit writer(std::vector<uint8_t>& out) : out_(out) {}
  template <class T>
  void num(T v) {
    using U = std::make_unsigned_t<T>;
    const auto u = static_cast<U>(v);
    for (size_t i = 0; i < sizeof(U); ++i) out_.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  void boolean(bool b) { num<uint8_t>(b ? 1 : 0); }
  void blob(const void* p, size_t n) {
    num(static_cast<uint32_t>(n));
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void str(const std::string& s) { blob(s.data(), s.size()); }
  /// A reason: cut to what a reader takes, so a long one arrives shortened, not refused.
  void text(const std::string& s) { blob(s.data(), std::min<size_t>(s.size(), max_text_bytes)); }
  void bytes_(const std::vector<uint8_t>& v) { blob(v.data(), v.size()); }
  void u32s(const std::vector<uint32_t>& v) {
    num(static_cast<uint32_t>(v.size()));
    const size_t at = out_.size();
    out_.resize(at + 4 * v.size());
    uint8_t* p = out_.data() + at;
    for (uint32_t x : v) {
      p[0] = uint8_t(x), p[1] = uint8_t(x >> 8), p[2] = uint8_t(x >> 16), p[3] = uint8_t(x >> 24);
      p += 4;
    }
  }
  void u64s(const std::vector<uint64_t>& v) {
    num(static_cast<uint32_t>(v.size()));
    for (uint64_t x : v) num(x);
  }
  void region(const peer_region& r) {
    boolean(r.present);
    num(r.remote_base);
    num(r.key);
    num(r.length);
  }

 private:
  std::vector<uint8_t>& out_;
};

/// Bounds-checked reader; the first failure is kept, naming the message and the field.
class reader {
 public:
  reader(std::span<const uint8_t> in, const char* msg) : in_(in), msg_(msg) {}
  template <class T>
  bool num(T& v, const char* field) {
    using U = std::make_unsigned_t<T>;
    if (!need(sizeof(U), field)) return false;
    U u = 0;
    for (size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(U{in_[pos_ + i]} << (8 * i));
    pos_ += sizeof(U);
    v = static_cast<T>(u);
    return true;
  }
  bool boolean(bool& b, const char* field) {
    uint8_t v = 0;
    if (!num(v, field)) return false;
    if (v > 1) return fail(fmt::format("field '{}' must be 0 or 1, got {}", field, v));
    b = v == 1;
    return true;
  }
  bool count(uint32_t& n, const char* field, uint64_t limit, const char* unit = "entries") {
    if (!num(n, field)) return false;
    if (n > limit)
      return fail(
          fmt::format("field '{}' has {} {}, above the limit of {}", field, n, unit, limit));
    return true;
  }
  bool str(std::string& s, const char* field, uint32_t limit = max_text_bytes) {
    uint32_t n = 0;
    if (!count(n, field, limit, "bytes") || !need(n, field)) return false;
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool bytes_(std::vector<uint8_t>& v, const char* field, uint32_t limit = max_blob_bytes) {
    uint32_t n = 0;
    if (!count(n, field, limit, "bytes") || !need(n, field)) return false;
    v.assign(in_.data() + pos_, in_.data() + pos_ + n);
    pos_ += n;
    return true;
  }
  bool u32s(std::vector<uint32_t>& v, const char* field) {
    uint32_t n = 0;
    if (!num(n, field)) return false;
    // A count the rest of the body cannot hold is refused before anything is allocated (the
    // rest after the count itself: fuzz_peer_wire found the bound taken before it, one entry
    // too many, and the reads past the body that followed).
    if (const size_t fits = (in_.size() - pos_) / 4; n > fits)
      return fail(fmt::format("field '{}' has {} entries, above the limit of {}", field, n, fits));
    v.resize(n);
    const uint8_t* p = in_.data() + pos_;
    for (auto& x : v) {
      x = uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
      p += 4;
    }
    pos_ += 4 * size_t{n};
    return true;
  }
  bool u64s(std::vector<uint64_t>& v, const char* field, uint32_t limit) {
    uint32_t n = 0;
    if (!count(n, field, limit) || !need(8 * size_t{n}, field)) return false;
    v.resize(n);
    for (auto& x : v) num(x, field);
    return true;
  }
  bool region(peer_region& r, const char* field) {
    return boolean(r.present, field) && num(r.remote_base, field) && num(r.key, field) &&
           num(r.length, field);
  }
  /// The body must end here.
  bool done() {
    if (pos_ == in_.size()) return true;
    return fail(fmt::format("{} trailing bytes after the last field", in_.size() - pos_));
  }
  std::string error() const { return fmt::format("peer message {}: {}", msg_, error_); }

 private:
  bool need(size_t n, const char* field) {
    if (pos_ <= in_.size() && in_.size() - pos_ >= n) return true;
    return fail(fmt::format("field '{}' needs {} bytes, {} left", field, n, in_.size() - pos_));
  }
  bool fail(std::string e) {
    if (error_.empty()) error_ = std::move(e);
    return false;
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  const char* msg_;
  std::string error_;
};

void encode(writer& w, const peer_hello& h) {
  w.num(h.version);
  w.num(h.min_version);
  w.str(h.node);
  w.str(h.instance);
  w.str(h.role);
  w.num(h.tp_size);
  w.num(h.tp_rank);
  w.num(h.pp_size);
  w.num(h.pp_rank);
  w.str(h.config_yaml);
  w.num(h.compat_hash);
  w.bytes_(h.fabric_address);
  w.num(static_cast<uint32_t>(h.regions.size()));
  for (const auto& r : h.regions) w.region(r);
  w.region(h.staging);
  w.bytes_(h.nonce);
  w.bytes_(h.proof);
}
bool decode(reader& r, peer_hello& h) {
  uint32_t regions = 0;
  if (!(r.num(h.version, "version") && r.num(h.min_version, "min_version") &&
        r.str(h.node, "node") && r.str(h.instance, "instance") && r.str(h.role, "role") &&
        r.num(h.tp_size, "tp_size") && r.num(h.tp_rank, "tp_rank") && r.num(h.pp_size, "pp_size") &&
        r.num(h.pp_rank, "pp_rank") && r.str(h.config_yaml, "config_yaml", max_yaml_bytes) &&
        r.num(h.compat_hash, "compat_hash") && r.bytes_(h.fabric_address, "fabric_address") &&
        r.count(regions, "regions", max_hello_regions)))
    return false;
  h.regions.resize(regions);
  for (auto& x : h.regions)
    if (!r.region(x, "regions")) return false;
  return r.region(h.staging, "staging") && r.bytes_(h.nonce, "nonce") && r.bytes_(h.proof, "proof");
}

void encode(writer& w, const peer_auth& a) { w.bytes_(a.proof); }
bool decode(reader& r, peer_auth& a) { return r.bytes_(a.proof, "proof"); }

void encode(writer& w, const peer_refused& m) { w.text(m.reason); }
bool decode(reader& r, peer_refused& m) { return r.str(m.reason, "reason"); }

void encode(writer& w, const peer_prepare& p) {
  w.num(p.room);
  w.num(p.token);
  w.u32s(p.dst_pages);
  w.num(p.dst_state_slot);
  w.num(p.dst_aux_row);
  w.num(p.dst_staging);
  w.num(p.prefix_tokens);
}
bool decode(reader& r, peer_prepare& p) {
  return r.num(p.room, "room") && r.num(p.token, "token") && r.u32s(p.dst_pages, "dst_pages") &&
         r.num(p.dst_state_slot, "dst_state_slot") && r.num(p.dst_aux_row, "dst_aux_row") &&
         r.num(p.dst_staging, "dst_staging") && r.num(p.prefix_tokens, "prefix_tokens");
}

void encode(writer& w, const peer_prepare_paged& p) {
  encode(w, p.prepare);
  w.u32s(p.dst_state_pages);
}
bool decode(reader& r, peer_prepare_paged& p) {
  return decode(r, p.prepare) && r.u32s(p.dst_state_pages, "dst_state_pages");
}

void encode(writer& w, const peer_prepare_checked& p) {
  encode(w, p.prepare);
  w.u32s(p.dst_state_pages);
}
bool decode(reader& r, peer_prepare_checked& p) {
  return decode(r, p.prepare) && r.u32s(p.dst_state_pages, "dst_state_pages");
}

void encode(writer& w, const peer_prepare_ack& a) {
  w.num(a.room);
  w.num(a.token);
  w.boolean(a.ok);
  w.text(a.reason);
  w.num(a.code);
}
bool decode(reader& r, peer_prepare_ack& a) {
  return r.num(a.room, "room") && r.num(a.token, "token") && r.boolean(a.ok, "ok") &&
         r.str(a.reason, "reason") && r.num(a.code, "code");
}

void encode(writer& w, const peer_announce& a) {
  w.num(a.room);
  w.num(a.token);
  w.num(a.total_writes);
  w.num(a.total_bytes);
}
bool decode(reader& r, peer_announce& a) {
  return r.num(a.room, "room") && r.num(a.token, "token") &&
         r.num(a.total_writes, "total_writes") && r.num(a.total_bytes, "total_bytes");
}

void encode(writer& w, const peer_announce_checked& a) {
  encode(w, a.announce);
  w.u64s(a.digests);
}
bool decode(reader& r, peer_announce_checked& a) {
  return decode(r, a.announce) && r.u64s(a.digests, "digests", max_room_digests);
}

void encode(writer& w, const peer_outcome& o) {
  w.num(o.room);
  w.num(o.token);
  w.boolean(o.to_decode);
  w.boolean(o.ok);
  w.text(o.reason);
  w.num(o.code);
}
bool decode(reader& r, peer_outcome& o) {
  return r.num(o.room, "room") && r.num(o.token, "token") && r.boolean(o.to_decode, "to_decode") &&
         r.boolean(o.ok, "ok") && r.str(o.reason, "reason") && r.num(o.code, "code");
}

void encode(writer& w, const peer_drained& d) {
  w.num(d.room);
  w.num(d.token);
  w.num(d.completed);
  w.num(d.failed);
}
bool decode(reader& r, peer_drained& d) {
  return r.num(d.room, "room") && r.num(d.token, "token") && r.num(d.completed, "completed") &&
         r.num(d.failed, "failed");
}

void encode(writer& w, const peer_leaving& m) { w.text(m.reason); }
bool decode(reader& r, peer_leaving& m) { return r.str(m.reason, "reason"); }

void encode(writer&, const peer_leaving_ack&) {}
bool decode(reader&, peer_leaving_ack&) { return true; }

void encode(writer& w, const peer_rails& m) {
  w.num(static_cast<uint32_t>(m.rails.size()));
  for (const auto& x : m.rails) {
    w.bytes_(x.fabric_address);
    w.boolean(x.express);
  }
}
bool decode(reader& r, peer_rails& m) {
  uint32_t n = 0;
  if (!r.count(n, "rails", max_peer_rails)) return false;
  m.rails.resize(n);
  for (auto& x : m.rails)
    if (!r.bytes_(x.fabric_address, "rails.fabric_address") ||
        !r.boolean(x.express, "rails.express"))
      return false;
  return true;
}

void encode(writer&, const peer_heartbeat&) {}
bool decode(reader&, peer_heartbeat&) { return true; }

void encode(writer& w, const peer_staging_request& m) {
  w.num(m.room);
  w.num(m.token);
}
bool decode(reader& r, peer_staging_request& m) {
  return r.num(m.room, "room") && r.num(m.token, "token");
}

void encode(writer& w, const peer_staging_grant& m) {
  w.num(m.room);
  w.num(m.token);
  w.num(m.offset);
}
bool decode(reader& r, peer_staging_grant& m) {
  return r.num(m.room, "room") && r.num(m.token, "token") && r.num(m.offset, "offset");
}

void put_header(uint8_t* h, uint32_t length, kind k, uint64_t seq) {
  for (int i = 0; i < 4; ++i) h[i] = uint8_t(length >> (8 * i));
  h[4] = static_cast<uint8_t>(k);
  h[5] = h[6] = h[7] = 0;
  for (int i = 0; i < 8; ++i) h[8 + i] = uint8_t(seq >> (8 * i));
}

/// HMAC-SHA256(key, data), its first mac_bytes bytes, into `out`.
void mac_of(const bytes& key, const uint8_t* data, size_t n, uint8_t* out) {
  uint8_t full[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), data, n, full, &len))
    throw std::runtime_error("HMAC-SHA256 failed");
  std::memcpy(out, full, mac_bytes);
}

bytes as_bytes(std::string_view s) { return bytes(s.begin(), s.end()); }

}  // namespace

const char* name(kind k) {
  switch (k) {
    case kind::hello:
      return "peer_hello";
    case kind::auth:
      return "peer_auth";
    case kind::refused:
      return "peer_refused";
    case kind::prepare:
      return "peer_prepare";
    case kind::prepare_paged:
      return "peer_prepare_paged";
    case kind::prepare_ack:
      return "peer_prepare_ack";
    case kind::announce:
      return "peer_announce";
    case kind::outcome:
      return "peer_outcome";
    case kind::drained:
      return "peer_drained";
    case kind::leaving:
      return "peer_leaving";
    case kind::leaving_ack:
      return "peer_leaving_ack";
    case kind::staging_request:
      return "peer_staging_request";
    case kind::staging_grant:
      return "peer_staging_grant";
    case kind::rails:
      return "peer_rails";
    case kind::heartbeat:
      return "peer_heartbeat";
    case kind::prepare_checked:
      return "peer_prepare_checked";
    case kind::announce_checked:
      return "peer_announce_checked";
  }
  return "unknown";
}

uint32_t max_body(kind k) {
  switch (k) {
    case kind::hello:
      return max_hello_body;
    case kind::prepare:
    case kind::prepare_paged:
    case kind::prepare_checked:
      return max_list_body;
    case kind::announce_checked:  // the announcement, then up to max_room_digests
      return 32 + 4 + 8 * max_room_digests;
    case kind::heartbeat:
    case kind::leaving_ack:
      return 0;
    case kind::rails:
      return static_cast<uint32_t>(4 + max_peer_rails * (4 + max_blob_bytes + 1));
    default:
      return max_small_body;
  }
}

std::vector<uint8_t> encode_body(const message& m) {
  std::vector<uint8_t> out;
  writer w(out);
  std::visit([&](const auto& x) { encode(w, x); }, m);
  return out;
}

result<message> decode_body(kind k, std::span<const uint8_t> body) {
  const auto i = static_cast<size_t>(k);
  if (i < 1 || i > max_kind)
    return error{errc::malformed_frame, fmt::format("unknown peer message kind {}", i)};
  reader r(body, name(k));
  message m;
  bool ok = false;
  // The alternative of index kind - 1, default-constructed, then decoded in place.
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((I == i - 1 ? (m.emplace<I>(), ok = decode(r, std::get<I>(m)) && r.done(), 0) : 0), ...);
  }
  (std::make_index_sequence<std::variant_size_v<message>>{});
  if (!ok) return error{errc::malformed_frame, r.error()};
  return m;
}

link_keys derive_keys(std::string_view accept_secret, std::string_view connect_secret,
                      const bytes& connect_nonce, const bytes& accept_nonce, bool we_accept) {
  // Each side's contribution under the secret it proved with, then one session secret over
  // both; a key per direction from it, so a frame cannot be reflected back to its sender.
  const auto a = auth_proof(accept_secret, "ferry-link-accept", connect_nonce, accept_nonce, "");
  const auto c = auth_proof(connect_secret, "ferry-link-connect", connect_nonce, accept_nonce, "");
  std::string session(a.begin(), a.end());
  session.append(c.begin(), c.end());
  auto to_accept = hmac_sha256(session, as_bytes("ferry-link to the accepting side"));
  auto to_connect = hmac_sha256(session, as_bytes("ferry-link to the connecting side"));
  OPENSSL_cleanse(session.data(), session.size());
  if (we_accept) return {std::move(to_connect), std::move(to_accept)};
  return {std::move(to_accept), std::move(to_connect)};
}

void frame_writer::seal(const message& m, std::vector<uint8_t>& out) {
  const size_t at = out.size();
  out.resize(at + header_bytes);
  {
    writer w(out);
    std::visit([&](const auto& x) { encode(w, x); }, m);
  }
  const size_t body = out.size() - at - header_bytes;
  put_header(out.data() + at, static_cast<uint32_t>(body), kind_of(m), seq_++);
  out.resize(out.size() + mac_bytes);
  mac_of(key_, out.data() + at, header_bytes + body, out.data() + at + header_bytes + body);
}

void frame_reader::feed(const uint8_t* data, size_t n) {
  if (failed_) return;
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  } else if (pos_ > (64u << 10) && pos_ * 2 > buf_.size()) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
  buf_.insert(buf_.end(), data, data + n);
}

frame_reader::result_kind frame_reader::next(message& out, std::string& error) {
  auto fail = [&](std::string why) {
    failed_ = true;
    error_ = std::move(why);
    error = error_;
    buf_.clear();
    pos_ = 0;
    return result_kind::failed;
  };
  if (failed_) {
    error = error_;
    return result_kind::failed;
  }
  if (buffered() < header_bytes) return result_kind::more;
  const uint8_t* h = buf_.data() + pos_;
  const uint32_t length =
      uint32_t{h[0]} | uint32_t{h[1]} << 8 | uint32_t{h[2]} << 16 | uint32_t{h[3]} << 24;
  const uint8_t k = h[4];
  if (k < 1 || k > max_kind) return fail(fmt::format("peer frame of unknown kind {}", k));
  if (h[5] != 0 || h[6] != 0 || h[7] != 0)
    return fail(fmt::format("peer frame {} has nonzero flags or reserved bytes",
                            name(static_cast<kind>(k))));
  if (only_ && static_cast<kind>(k) != *only_)
    return fail(fmt::format("peer frame {} where only {} may come", name(static_cast<kind>(k)),
                            name(*only_)));
  if (length > max_body(static_cast<kind>(k)))
    return fail(fmt::format("peer frame {} claims a body of {} bytes, above its limit of {}",
                            name(static_cast<kind>(k)), length, max_body(static_cast<kind>(k))));
  const size_t whole = header_bytes + size_t{length} + mac_bytes;
  if (buffered() < whole) return result_kind::more;
  uint8_t mac[mac_bytes];
  mac_of(key_, h, header_bytes + length, mac);
  if (CRYPTO_memcmp(mac, h + header_bytes + length, mac_bytes) != 0)
    return fail(
        fmt::format("peer frame {} failed its MAC check (forged, corrupted, or keyed "
                    "for another link)",
                    name(static_cast<kind>(k))));
  uint64_t seq = 0;
  for (int i = 0; i < 8; ++i) seq |= uint64_t{h[8 + i]} << (8 * i);
  if (seq != seq_)
    return fail(
        fmt::format("peer frame {} carries sequence {}, expected {} (replayed or "
                    "reordered)",
                    name(static_cast<kind>(k)), seq, seq_));
  auto decoded = decode_body(static_cast<kind>(k), {h + header_bytes, length});
  if (!decoded) return fail(decoded.message);
  ++seq_;
  pos_ += whole;
  out = std::move(decoded.value);
  return result_kind::message;
}

}  // namespace ferry::peer_wire
