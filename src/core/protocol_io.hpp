#pragma once
// Internal to src/core, not part of the protocol API (protocol.hpp is): the client protocol's
// primitive reads and writes, with their error texts. The bodies built from them are generated
// from wire.yaml (protocol_codec.cpp, scripts/gen_wire.py); protocol_encode.cpp and
// protocol_decode.cpp frame them.

#include <fmt/format.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/protocol.hpp"
#include "core/wire_io.hpp"

namespace ferry::proto::detail {

using wire::wire_int_t;

class writer {
 public:
  writer(std::vector<uint8_t>& out, uint16_t version) : version(version), out_(out) {}
  const uint16_t version;  ///< of the connection: some bodies differ between versions
  /// An integer or enum field of `Width` bytes (the schema's width, checked against the
  /// member's type), or a count.
  template <size_t Width = 0, class T>
  void num(T v) {
    using U = wire_int_t<T>;
    static_assert(Width == 0 || sizeof(U) == Width, "the member's width is not the schema's");
    wire::append_le(out_, static_cast<U>(v));
  }
  void boolean(bool b) { num(static_cast<uint8_t>(b)); }
  void str(const std::string& s) {
    num(static_cast<uint32_t>(s.size()));
    out_.insert(out_.end(), s.begin(), s.end());
  }
  /// u32 count, then the numbers.
  template <class T>
  void nums(const std::vector<T>& v) {
    num(static_cast<uint32_t>(v.size()));
    for (auto x : v) num(x);
  }

 private:
  std::vector<uint8_t>& out_;
};

/// Bounds-checked reader: every read names the field it was reading when it fails.
class reader {
 public:
  reader(std::span<const uint8_t> in, uint16_t version) : version(version), in_(in) {}
  const uint16_t version;  ///< of the connection: some bodies differ between versions
  template <class T>
  bool num(T& v, const char* field) {
    using U = wire_int_t<T>;
    if (in_.size() - pos_ < sizeof(U)) return truncated(field, sizeof(U));
    v = static_cast<T>(wire::load_le<U>(in_.data() + pos_));
    pos_ += sizeof(U);
    return true;
  }
  bool boolean(bool& b, const char* field) {
    uint8_t v = 0;
    if (!num(v, field)) return false;
    if (v > 1) return fail(fmt::format("field '{}' must be 0 or 1, got {}", field, v));
    b = v == 1;
    return true;
  }
  bool str(std::string& s, const char* field, uint32_t limit) {
    uint32_t n = 0;
    if (!num(n, field)) return false;
    if (n > limit)
      return fail(fmt::format("field '{}' is {} bytes, above the limit of {}", field, n, limit));
    if (in_.size() - pos_ < n) return truncated(field, n);
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  /// u32 count (at most `limit`), then that many integers of type T.
  template <class T>
  bool nums(std::vector<T>& v, const char* field, uint32_t limit) {
    uint32_t n = 0;
    if (!num(n, field)) return false;
    if (n > limit)
      return fail(fmt::format("field '{}' has {} entries, above the limit of {}", field, n, limit));
    if ((in_.size() - pos_) / sizeof(T) < n)
      return fail(fmt::format("field '{}' claims {} entries but only {} bytes remain", field, n,
                              in_.size() - pos_));
    v.resize(n);
    for (auto& x : v) num(x, field);
    return true;
  }
  size_t remaining() const { return in_.size() - pos_; }
  const std::string& error() const { return error_; }
  /// Fail with `e` (the first failure is kept); always false.
  bool fail(std::string e) {
    if (error_.empty()) error_ = std::move(e);
    return false;
  }

 private:
  bool truncated(const char* field, size_t need) {
    return fail(fmt::format("truncated at field '{}': needs {} bytes, {} remain", field, need,
                            in_.size() - pos_));
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  std::string error_;
};

/// Generated (protocol_codec.cpp): the body of any message, and the body of a message of type
/// `t` into `out` (false with the reader's error when it does not decode).
void encode_body(writer& w, const message& m);
bool decode_body(msg_type t, reader& r, std::optional<message>& out);
/// Whether `type` is a message type of the protocol.
bool known_type(uint16_t type);

}  // namespace ferry::proto::detail
