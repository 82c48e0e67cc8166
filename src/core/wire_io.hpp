#pragma once
// Internal to src/core: what the generated codecs of both protocols (scripts/gen_wire.py,
// from wire.yaml) share with the hand-written readers and writers beside them: how a field's
// type maps to the unsigned integer it travels as, and how many fields a struct has (so the
// generated code can check each struct is what the schema says).

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace ferry::wire {

template <class T, bool = std::is_enum_v<T>>
struct wire_int {
  using type = std::make_unsigned_t<T>;
};
template <class T>
struct wire_int<T, true> {
  using type = std::make_unsigned_t<std::underlying_type_t<T>>;
};
/// The unsigned integer a field of type T (integer or enum) travels as.
template <class T>
using wire_int_t = typename wire_int<std::remove_cvref_t<T>>::type;

/// A field's value as a plain number (for range checks and error texts).
template <class T>
constexpr uint64_t wire_value(T v) {
  return static_cast<wire_int_t<T>>(v);
}

/// The little-endian integer of type U at `p` (its bytes in bounds, checked by the caller).
template <class U>
U load_le(const uint8_t* p) {
  U u = 0;
  for (size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(U{p[i]} << (8 * i));
  return u;
}

/// Append `u` to `out`, little-endian.
template <class U>
void append_le(std::vector<uint8_t>& out, U u) {
  for (size_t i = 0; i < sizeof(U); ++i) out.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

/// A list without a limit of its own (the frame's size bounds it).
inline constexpr uint32_t no_limit = UINT32_MAX;

struct any_field {
  template <class U>
  operator U() const;  // never defined: only asked whether a struct can be built from it
};
/// How many fields the aggregate T has (the most initializers `T{...}` takes). Not for structs
/// with an array member, which take one initializer per element.
template <class T, class... A>
consteval size_t arity() {
  if constexpr (requires { T{A{}..., any_field{}}; })
    return arity<T, A..., any_field>();
  else
    return sizeof...(A);
}

}  // namespace ferry::wire
