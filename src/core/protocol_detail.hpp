#pragma once
// Internal to src/core, not part of the protocol API (protocol.hpp is): the one thing the encoder
// (protocol_encode.cpp) and the decoder (protocol_decode.cpp) share, how a field's type maps to
// the unsigned integer it travels as, so both sides agree on every field's width.

#include <type_traits>

namespace ferry::proto::detail {

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
using wire_int_t = typename wire_int<T>::type;

}  // namespace ferry::proto::detail
