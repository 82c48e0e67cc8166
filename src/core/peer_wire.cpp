// The peer channel's frames: sealing, opening and checking them (core/peer_wire.hpp). The
// bodies are generated from wire.yaml (peer_codec.cpp).
#include "core/peer_wire.hpp"

#include <fmt/format.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "core/peer_wire_io.hpp"

namespace ferry::peer_wire {

namespace {

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

std::vector<uint8_t> encode_body(const message& m) {
  std::vector<uint8_t> out;
  detail::writer w(out);
  detail::encode_body(w, m);
  return out;
}

result<message> decode_body(kind k, std::span<const uint8_t> body) {
  const auto i = static_cast<size_t>(k);
  if (i < 1 || i > max_kind)
    return error{errc::malformed_frame, fmt::format("unknown peer message kind {}", i)};
  detail::reader r(body, name(k));
  message m;
  if (!(detail::decode_body(k, r, m) && r.done())) return error{errc::malformed_frame, r.error()};
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
    detail::writer w(out);
    detail::encode_body(w, m);
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
