#pragma once
/// Locks that make a ferryd's liveness visible to other processes, and the clean-up of what dead
/// daemons left behind.
///
/// - The *config lock*, `<listen.client>.lock` beside the client socket, is held for the
///   daemon's life: a second ferryd started with the same config finds the first there and
///   exits, touching nothing of it (the file says which pid, node and instance hold it). It is
///   unlinked when released (a clean stop); one a crash left is unheld, and the next ferryd
///   takes it.
/// - The *instance lock*, the POSIX shm object `/ferry.<node>.<instance>.lock`, is held for the
///   instance's life beside its pools `/ferry.<node>.<instance>.{kv,state,aux}`. An instance
///   whose lock nobody holds is dead (the kernel drops an flock with its last holder, kill -9
///   included), so a starting ferryd unlinks that instance's objects.
///
/// Locks are flock(2) locks; they are released when the lock object is destroyed or the process
/// ends.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.hpp"

namespace ferry {

class daemon_lock {
 public:
  daemon_lock() = default;
  daemon_lock(daemon_lock&& o) noexcept;
  daemon_lock& operator=(daemon_lock&& o) noexcept;
  daemon_lock(const daemon_lock&) = delete;
  daemon_lock& operator=(const daemon_lock&) = delete;
  ~daemon_lock();  ///< unlinks the file first when `unlink_on_release`

  explicit operator bool() const { return fd_ >= 0; }

 private:
  friend result<daemon_lock> lock_config(const std::string&, const std::string&,
                                         const std::string&);
  friend result<daemon_lock> lock_instance(const std::string&, const std::string&);
  int fd_ = -1;
  std::string unlink_path_;  ///< unlinked, while still held, on release
};

/// Take the config lock beside `client_socket`. When another live ferryd holds it, the error
/// (`errc::system_error`, as for a lock that cannot be taken) names that daemon, e.g. "another
/// ferryd (pid 4242, node decode-0, instance 1a2b3c4d) is running with listen.client /tmp/d.sock
/// (it holds /tmp/d.sock.lock)".
result<daemon_lock> lock_config(const std::string& client_socket, const std::string& node,
                                const std::string& instance);

/// Create and take this instance's liveness lock in /dev/shm (unlinked on release).
result<daemon_lock> lock_instance(const std::string& node, const std::string& instance);

/// What `reclaim_dead_instances` removed of one dead instance.
struct reclaimed_instance {
  std::string instance;
  std::vector<std::string> objects;  ///< shm object names, e.g. "/ferry.decode-0.1a2b.kv"
  uint64_t bytes = 0;
};

/// Unlink the shm objects of every dead instance of `node`: those whose instance lock nobody
/// holds, and pools without a lock (left by a Ferry that predates the locks). A live
/// instance's objects are never touched.
std::vector<reclaimed_instance> reclaim_dead_instances(const std::string& node);

}  // namespace ferry
