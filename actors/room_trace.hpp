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
#include <string>

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

json effects_json(const sender::effects& fx);
json effects_json(const receiver::effects& fx);

/// Feed a machine one event: `call` runs it; with a trace, the event (`describe`, built only
/// then, before the call moves its arguments) and the effects are recorded.
template <class Describe, class Call>
auto feed(file* trace, Describe&& describe, Call&& call) {
  if (!trace) return call();
  auto ev = describe();
  auto fx = call();
  trace->write({{"event", std::move(ev)}, {"effects", effects_json(fx)}});
  return fx;
}

/// A machine built from a trace's first line.
sender::room sender_of(const json& created);
receiver::room receiver_of(const json& created);
/// Feed `event` (as an actor recorded it) to `m`; its effects.
sender::effects replay(sender::room& m, const json& event);
receiver::effects replay(receiver::room& m, const json& event);

}  // namespace ferry::trace
