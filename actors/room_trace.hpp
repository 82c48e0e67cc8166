#pragma once
/// Test hook: with FERRY_TRACE_DIR set when ferryd starts, every Sender and Receiver records
/// the events it feeds its room's state machine and the effects it gets back, one JSON line
/// each, in `<dir>/<sender|receiver>-<pid>-<n>.jsonl`. tests/e2e/test_trace_replay.cpp replays
/// the files of an end-to-end run into fresh machines (core/sender_room.hpp,
/// core/receiver_room.hpp) and checks that every effect comes back the same: the machines depend
/// on nothing but their events, and the actors decide nothing the machines do not.
///
/// The first line of a file is the machine's construction ("e":"new"); every later line is
/// {"event": {...}, "effects": [...]}; every line also carries "t_us", the monotonic clock when it
/// was written, so the files of two daemons on one host make one timeline
/// (scripts/trace-timeline.py). Off (a null pointer) unless the variable is set.

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

#include "core/inspect.hpp"
#include "core/receiver_room.hpp"
#include "core/sender_room.hpp"

namespace ferry::trace {

using json = nlohmann::json;

/// One room's trace file.
class file {
 public:
  /// Null unless FERRY_TRACE_DIR is set (and the file could be created).
  static std::unique_ptr<file> open(const char* kind);
  ~file();
  /// Append one line, stamped with "t_us": the steady (monotonic) clock in microseconds.
  void write(json line);

 private:
  explicit file(std::FILE* f) : f_(f) {}
  std::FILE* f_;
};

json result_json(const result<>& r);
result<> result_of(const json& j);
json limits_json(const lifecycle_limits& l);
lifecycle_limits limits_of(const json& j);
json schema_json(const rank_schema& s);
rank_schema schema_of(const json& j);
/// A room status from its name ("Success"); throws on another.
room_status status_of(const json& j);

// Events and effects as JSON, written once for every machine over their `name` and `inspect`
// (core/inspect.hpp): {"e": name, field: value, ...}; a room status by its name ("Success"),
// other enums by number. Reading is strict: a line without one of the fields its event lists
// throws (a trace of another build does not replay as something else).
template <class T>
json value_json(const T& v);
template <class T>
void value_of(const json& j, T& v);

namespace detail {
template <class T>
struct is_vector : std::false_type {};
template <class T>
struct is_vector<std::vector<T>> : std::true_type {};
template <class T>
struct is_optional : std::false_type {};
template <class T>
struct is_optional<std::optional<T>> : std::true_type {};

struct writer {
  json& j;
  template <class T>
  writer& operator()(std::string_view k, const T& v) {
    j[std::string(k)] = value_json(v);
    return *this;
  }
};
struct reader {
  const json& j;
  template <class T>
  reader& operator()(std::string_view k, T& v) {
    value_of(j.at(std::string(k)), v);
    return *this;
  }
};
}  // namespace detail

template <class T>
json value_json(const T& v) {
  if constexpr (std::is_same_v<T, result<>>) {
    return result_json(v);
  } else if constexpr (std::is_same_v<T, rank_schema>) {
    return schema_json(v);
  } else if constexpr (std::is_same_v<T, room_status>) {
    return to_string(v);
  } else if constexpr (std::is_enum_v<T>) {
    return static_cast<int64_t>(v);
  } else if constexpr (detail::is_optional<T>::value) {
    return v ? value_json(*v) : json();
  } else if constexpr (detail::is_vector<T>::value) {
    json a = json::array();
    for (const auto& x : v) a.push_back(value_json(x));
    return a;
  } else if constexpr (inspectable<T>) {
    json o = json::object();
    detail::writer w{o};
    inspect(w, const_cast<T&>(v));  // the writer only reads
    return o;
  } else {
    return json(v);
  }
}

template <class T>
void value_of(const json& j, T& v) {
  if constexpr (std::is_same_v<T, result<>>) {
    v = result_of(j);
  } else if constexpr (std::is_same_v<T, rank_schema>) {
    v = schema_of(j);
  } else if constexpr (std::is_same_v<T, room_status>) {
    v = status_of(j);
  } else if constexpr (std::is_enum_v<T>) {
    v = static_cast<T>(j.get<int64_t>());
  } else if constexpr (detail::is_optional<T>::value) {
    if (j.is_null()) {
      v.reset();
    } else {
      v.emplace();
      value_of(j, *v);
    }
  } else if constexpr (detail::is_vector<T>::value) {
    v.clear();
    v.resize(j.size());
    for (size_t i = 0; i < j.size(); ++i) value_of(j[i], v[i]);
  } else if constexpr (inspectable<T>) {
    detail::reader r{j};
    inspect(r, v);
  } else {
    v = j.get<T>();
  }
}

/// One event or effect (an alternative of a machine's variant, or the variant) as a line's
/// record: {"e": its name, its fields}.
template <class T>
json record_json(const T& x) {
  if constexpr (requires { std::variant_size<T>::value; }) {
    return std::visit([](const auto& a) { return record_json(a); }, x);
  } else {
    json j = value_json(x);
    j["e"] = std::string(T::name);
    return j;
  }
}

/// The alternative of `Variant` a record names, with its fields; throws on an unknown name.
template <class Variant>
Variant record_of(const json& j) {
  const std::string name = j.at("e");
  auto v = make_named<Variant>(name);
  if (!v) throw std::runtime_error("unknown event or effect '" + name + "'");
  std::visit([&](auto& x) { value_of(j, x); }, *v);
  return std::move(*v);
}

template <class Effects>
json effects_json(const Effects& fx) {
  json out = json::array();
  for (const auto& e : fx) out.push_back(record_json(e));
  return out;
}

/// Feed machine `m` one event; with a trace, the event (before it is moved in) and the effects
/// it gave are recorded.
template <class Machine, class Event>
auto feed(file* trace, Machine& m, Event&& e) {
  if (!trace) return m.on(std::forward<Event>(e));
  auto ev = record_json(e);
  auto fx = m.on(std::forward<Event>(e));
  trace->write({{"event", std::move(ev)}, {"effects", effects_json(fx)}});
  return fx;
}

/// A machine built from a trace's first line.
sender::room sender_of(const json& created);
receiver::room receiver_of(const json& created);
/// Feed `event` (as an actor recorded it) to `m`; its effects.
inline sender::effects replay(sender::room& m, const json& event) {
  return m.on(record_of<sender::event>(event));
}
inline receiver::effects replay(receiver::room& m, const json& event) {
  return m.on(record_of<receiver::event>(event));
}

}  // namespace ferry::trace
