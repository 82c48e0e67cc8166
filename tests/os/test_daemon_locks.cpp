// The locks that make a ferryd's liveness visible (src/os/daemon_locks.hpp): a second holder
// of a config lock is refused with the first one's identity, and only dead instances' shm
// objects are reclaimed. Real files in /tmp and /dev/shm, names unique to this process.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

#include "os/daemon_locks.hpp"

using namespace ferry;

namespace {

std::string unique(const std::string& what) {
  return "unit-" + std::to_string(::getpid()) + "-" + what;
}

/// A shm object of `bytes` that outlives this call (as a killed daemon's pool does).
void leave_shm_object(const std::string& name, off_t bytes) {
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, bytes) == 0);
  ::close(fd);
}

bool shm_exists(const std::string& name) { return std::filesystem::exists("/dev/shm" + name); }

}  // namespace

TEST_CASE("config lock: a second holder is refused and told who holds it", "[unit][locks]") {
  const auto socket = "/tmp/ferry-" + unique("lock") + ".sock";
  {
    auto first = lock_config(socket, "decode-0", "1a2b3c4d");
    INFO(first.message);
    REQUIRE(first);
    auto second = lock_config(socket, "decode-0", "5e6f7a8b");
    REQUIRE_FALSE(second);
    CHECK(second.code == errc::system_error);
    CHECK(second.message == "another ferryd (pid " + std::to_string(::getpid()) +
                                ", node decode-0, instance 1a2b3c4d) is running with "
                                "listen.client " +
                                socket + " (it holds " + socket +
                                ".lock); this one exits and touches nothing of it");
  }
  // Released with its holder, and its file removed: the next daemon takes it anew.
  CHECK_FALSE(std::filesystem::exists(socket + ".lock"));
  auto again = lock_config(socket, "decode-0", "5e6f7a8b");
  CHECK(again);
  CHECK(std::filesystem::exists(socket + ".lock"));
}

TEST_CASE("config lock: one a crash left behind, unheld, is taken", "[unit][locks]") {
  const auto socket = "/tmp/ferry-" + unique("stale") + ".sock";
  const int fd = ::open((socket + ".lock").c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  ::close(fd);
  {
    auto taken = lock_config(socket, "decode-0", "1a2b3c4d");
    INFO(taken.message);
    CHECK(taken);
  }
  CHECK_FALSE(std::filesystem::exists(socket + ".lock"));
}

TEST_CASE("instance locks: only a dead instance's objects are reclaimed", "[unit][locks]") {
  const auto node = unique("node");
  auto live = lock_instance(node, "aaaa0001");
  INFO(live.message);
  REQUIRE(live);
  const auto live_kv = "/ferry." + node + ".aaaa0001.kv";
  leave_shm_object(live_kv, 4096);
  // A dead instance: pools left behind, with a lock file nobody holds.
  const auto dead_kv = "/ferry." + node + ".dead0002.kv";
  const auto dead_aux = "/ferry." + node + ".dead0002.aux";
  leave_shm_object(dead_kv, 8192);
  leave_shm_object(dead_aux, 4096);
  leave_shm_object("/ferry." + node + ".dead0002.lock", 0);

  const auto reclaimed = reclaim_dead_instances(node);
  REQUIRE(reclaimed.size() == 1);
  CHECK(reclaimed[0].instance == "dead0002");
  CHECK(reclaimed[0].bytes == 8192 + 4096);
  CHECK(reclaimed[0].objects.size() == 2);
  CHECK_FALSE(shm_exists(dead_kv));
  CHECK_FALSE(shm_exists(dead_aux));
  CHECK_FALSE(shm_exists("/ferry." + node + ".dead0002.lock"));
  // The live instance keeps its lock and its pool.
  CHECK(shm_exists(live_kv));
  CHECK(shm_exists("/ferry." + node + ".aaaa0001.lock"));
  CHECK(reclaim_dead_instances(node).empty());
  ::shm_unlink(live_kv.c_str());
}
