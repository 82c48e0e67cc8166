#pragma once
/// Events and effects as data. Every event a state machine takes and every effect it gives is a
/// plain struct with a `name` and one `inspect` listing its fields, in the manner of CAF's
/// inspectors:
///
///   struct posted {
///     static constexpr std::string_view name = "posted";
///     size_t link = 0;
///     uint64_t batch = 0;
///   };
///   inline void inspect(auto& f, posted& x) { f("link", x.link)("batch", x.batch); }
///
/// A machine takes one `std::variant` of its events (`room::on(event)`) and answers with a list
/// of effects, a `std::variant` too. So what does not depend on the machine is written once,
/// over `name` and `inspect`: the actors' traces and their replay (actors/room_trace.hpp) and
/// the table tests' harness (tests/core/machine_table.hpp). An inspector is called as
/// `f(field_name, field)` and returns itself; one that writes does not modify the object it is
/// given (it is handed a non-const reference so that one `inspect` serves reading and writing).

#include <cstddef>
#include <optional>
#include <string_view>
#include <utility>
#include <variant>

namespace ferry {

/// An inspector that does nothing: for types whose fields need no inspection.
struct no_fields {
  template <class T>
  no_fields& operator()(std::string_view, T&) {
    return *this;
  }
};

/// A type that lists its fields with `inspect`.
template <class T>
concept inspectable = requires(no_fields& f, T& x) {
  inspect(f, x);
};

/// The name of the alternative `v` holds.
template <class Variant>
std::string_view name_of(const Variant& v) {
  return std::visit([](const auto& x) { return std::decay_t<decltype(x)>::name; }, v);
}

/// The alternative of `Variant` called `name`, default-constructed; nullopt if none is.
template <class Variant>
std::optional<Variant> make_named(std::string_view name) {
  std::optional<Variant> out;
  [&]<size_t... I>(std::index_sequence<I...>) {
    (void)((std::variant_alternative_t<I, Variant>::name == name &&
            (out.emplace(std::in_place_index<I>), true)) ||
           ...);
  }
  (std::make_index_sequence<std::variant_size_v<Variant>>{});
  return out;
}

}  // namespace ferry
