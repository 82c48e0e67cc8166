// Decoding: a frame's body to a message (the bodies are generated from wire.yaml into
// protocol_codec.cpp; every read is bounds-checked and a failure names the message type and the
// field), and frame_reader, which cuts a byte stream into frames.
#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/protocol.hpp"
#include "core/protocol_io.hpp"

namespace ferry::proto {

decoded decode(uint16_t type, uint32_t seq, std::span<const uint8_t> body, uint16_t version) {
  const auto t = static_cast<msg_type>(type);
  decoded out;
  out.seq = seq;
  out.code = errc::malformed_frame;
  if (!detail::known_type(type)) {
    out.error = fmt::format("unknown message type {}", type);
    return out;
  }
  if (version < first_version(t)) {
    out.error = fmt::format("{} needs protocol version {}; this connection speaks {}", to_string(t),
                            first_version(t), version);
    return out;
  }
  detail::reader r(body, version);
  if (!detail::decode_body(t, r, out.msg)) {
    out.msg.reset();
    out.error = fmt::format("malformed {} frame: {}", to_string(t), r.error());
    return out;
  }
  if (r.remaining() != 0) {
    out.msg.reset();
    out.error = fmt::format("malformed {} frame: {} unexpected bytes after the last field",
                            to_string(t), r.remaining());
    return out;
  }
  out.code = errc::ok;
  return out;
}

void frame_reader::feed(std::span<const uint8_t> bytes) {
  if (pos_ > 0 && pos_ == buf_.size()) {
    buf_.clear();
    pos_ = 0;
  }
  buf_.insert(buf_.end(), bytes.begin(), bytes.end());
}

std::optional<decoded> frame_reader::take(raw_frame& header, std::span<const uint8_t>& body) {
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
  header.type = static_cast<uint16_t>(p[4] | p[5] << 8);
  header.flags = static_cast<uint16_t>(p[6] | p[7] << 8);
  header.seq = uint32_t{p[8]} | uint32_t{p[9]} << 8 | uint32_t{p[10]} << 16 | uint32_t{p[11]} << 24;
  body = std::span<const uint8_t>(p + header_bytes, len - (header_bytes - 4));
  pos_ += 4 + size_t{len};
  return decoded{};  // code ok: a whole frame
}

void frame_reader::compact() {
  // Compact occasionally so a long-lived connection does not grow its buffer.
  if (pos_ > (1u << 20) && pos_ * 2 > buf_.size()) {
    buf_.erase(buf_.begin(), buf_.begin() + static_cast<std::ptrdiff_t>(pos_));
    pos_ = 0;
  }
}

std::optional<decoded> frame_reader::next() {
  raw_frame h;
  std::span<const uint8_t> body;
  auto got = take(h, body);
  if (!got || got->framing_lost) return got;
  decoded out;
  if (h.flags != 0) {  // reserved: a frame using them means something this version cannot know
    out.seq = h.seq;
    out.code = errc::malformed_frame;
    out.error = fmt::format("frame flags must be 0, got {:#06x}", h.flags);
  } else {
    out = decode(h.type, h.seq, body, version_);
  }
  compact();
  return out;
}

std::optional<result<raw_frame>> frame_reader::next_raw() {
  raw_frame h;
  std::span<const uint8_t> body;
  auto got = take(h, body);
  if (!got) return std::nullopt;
  if (got->framing_lost) return result<raw_frame>(error{got->code, std::move(got->error)});
  h.body.assign(body.begin(), body.end());
  compact();
  return result<raw_frame>(std::move(h));
}

}  // namespace ferry::proto
