#pragma once
// Internal to src/core: the peer channel's primitive reads and writes, with their error texts.
// The bodies built from them are generated from wire.yaml (peer_codec.cpp, scripts/gen_wire.py);
// peer_wire.cpp frames, seals and opens them.

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/peer_wire.hpp"
#include "core/wire_io.hpp"

namespace ferry::peer_wire::detail {

using wire::wire_int_t;

class writer {
 public:
  explicit writer(std::vector<uint8_t>& out) : out_(out) {}
  /// An integer of `Width` bytes (the schema's width, checked against the member's type), or a
  /// count.
  template <size_t Width = 0, class T>
  void num(T v) {
    using U = wire_int_t<T>;
    static_assert(Width == 0 || sizeof(U) == Width, "the member's width is not the schema's");
    wire::append_le(out_, static_cast<U>(v));
  }
  void boolean(bool b) { num<1>(static_cast<uint8_t>(b ? 1 : 0)); }
  void blob(const void* p, size_t n) {
    num(static_cast<uint32_t>(n));
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  void str(const std::string& s) { blob(s.data(), s.size()); }
  /// A reason: cut to what a reader takes, so a long one arrives shortened, not refused.
  void text(const std::string& s) { blob(s.data(), std::min<size_t>(s.size(), max_text_bytes)); }
  void bytes_(const std::vector<uint8_t>& v) { blob(v.data(), v.size()); }
  /// u32 count, then the numbers.
  template <class T>
  void nums(const std::vector<T>& v) {
    num(static_cast<uint32_t>(v.size()));
    const size_t at = out_.size();
    out_.resize(at + sizeof(T) * v.size());
    uint8_t* p = out_.data() + at;
    for (T x : v)
      for (size_t i = 0; i < sizeof(T); ++i) *p++ = static_cast<uint8_t>(x >> (8 * i));
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
    using U = wire_int_t<T>;
    if (!need(sizeof(U), field)) return false;
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
    if (!count(n, field, limit, "bytes") || !need(n, field)) return false;
    s.assign(reinterpret_cast<const char*>(in_.data() + pos_), n);
    pos_ += n;
    return true;
  }
  bool bytes_(std::vector<uint8_t>& v, const char* field, uint32_t limit) {
    uint32_t n = 0;
    if (!count(n, field, limit, "bytes") || !need(n, field)) return false;
    v.assign(in_.data() + pos_, in_.data() + pos_ + n);
    pos_ += n;
    return true;
  }
  /// u32 count, then the numbers: at most `limit` of them, or (wire::no_limit) as many as the
  /// rest of the body holds.
  template <class T>
  bool nums(std::vector<T>& v, const char* field, uint32_t limit) {
    uint32_t n = 0;
    if (limit == wire::no_limit) {
      if (!num(n, field)) return false;
      // A count the rest of the body cannot hold is refused before anything is allocated (the
      // rest after the count itself: fuzz_peer_wire found the bound taken before it, one entry
      // too many, and the reads past the body that followed).
      if (const size_t fits = (in_.size() - pos_) / sizeof(T); n > fits)
        return fail(
            fmt::format("field '{}' has {} entries, above the limit of {}", field, n, fits));
    } else if (!count(n, field, limit) || !need(sizeof(T) * size_t{n}, field)) {
      return false;
    }
    v.resize(n);
    for (auto& x : v) num(x, field);
    return true;
  }
  /// The body must end here.
  bool done() {
    if (pos_ == in_.size()) return true;
    return fail(fmt::format("{} trailing bytes after the last field", in_.size() - pos_));
  }
  size_t remaining() const { return in_.size() - pos_; }
  std::string error() const { return fmt::format("peer message {}: {}", msg_, error_); }
  /// Fail with `e` (the first failure is kept); always false.
  bool fail(std::string e) {
    if (error_.empty()) error_ = std::move(e);
    return false;
  }

 private:
  bool count(uint32_t& n, const char* field, uint64_t limit, const char* unit = "entries") {
    if (!num(n, field)) return false;
    if (n > limit)
      return fail(
          fmt::format("field '{}' has {} {}, above the limit of {}", field, n, unit, limit));
    return true;
  }
  bool need(size_t n, const char* field) {
    if (pos_ <= in_.size() && in_.size() - pos_ >= n) return true;
    return fail(fmt::format("field '{}' needs {} bytes, {} left", field, n, in_.size() - pos_));
  }
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  const char* msg_;
  std::string error_;
};

/// Generated (peer_codec.cpp): the body of any message, and the body of a message of kind `k`
/// into `out` (false with the reader's error when it does not decode).
void encode_body(writer& w, const message& m);
bool decode_body(kind k, reader& r, message& out);

}  // namespace ferry::peer_wire::detail
