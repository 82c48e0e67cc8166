#pragma once
/// A decode room whose actor ended without a terminal status (an exception, a bug): its pages
/// may still be written by its prefill ranks and nobody is left to drain them, so it may not be
/// handed back at once. The rule: fence every link of the room that is still open (its
/// connection ends, its keys close, the peer is cut; other rooms on it fail too), and report
/// the room Failed only once every one of those fences has happened. With no link left open it
/// fails at once. The Scheduler (actors/scheduler.cpp) keeps one per room entry and does the
/// fencing; tests/core/test_orphan_fence.cpp is the table.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

namespace ferry {

template <class Link>
class orphan_fence {
 public:
  /// The room's actor ended with `reason`; `open` are its links still open. The links to fence
  /// now: none means the room fails at once, with `reason`.
  std::vector<Link> ended(std::vector<Link> open, std::string reason) {
    waiting_ = std::move(open);
    reason_ = waiting_.empty() ? std::move(reason) : reason + "; its prefill links were fenced";
    return waiting_;
  }

  /// Link `l` was fenced (or went down): true when it was the last the room waited for, and the
  /// room now fails with `reason()`.
  bool fenced(const Link& l) {
    return !waiting_.empty() && std::erase(waiting_, l) > 0 && waiting_.empty();
  }

  bool waiting() const { return !waiting_.empty(); }
  const std::string& reason() const { return reason_; }

 private:
  std::vector<Link> waiting_;
  std::string reason_;
};

}  // namespace ferry
