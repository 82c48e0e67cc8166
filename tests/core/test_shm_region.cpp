#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>

#include "core/shm_region.hpp"

using namespace ferry;

namespace {
std::string test_name(const char* what) {
  return "/ferry-unit-" + std::to_string(::getpid()) + "-" + what;
}
}  // namespace

TEST_CASE("shm region: created, opened by name, unlinked by its creator", "[unit][shm_region]") {
  const auto name = test_name("a");
  {
    auto owner_made = shm_region::create(name, 1 << 20);
    auto& owner = owner_made.value;
    REQUIRE(owner);
    CHECK(owner.size() == 1u << 20);
    CHECK(owner.name() == name);
    std::memcpy(owner.data() + 4096, "ferry", 5);
    auto reader_made = shm_region::open(name, 1 << 20);
    auto& reader = reader_made.value;
    REQUIRE(reader);
    CHECK(std::memcmp(reader.data() + 4096, "ferry", 5) == 0);
    reader.data()[0] = 7;  // both map the same pages
    CHECK(owner.data()[0] == 7);
  }
  auto gone_made = shm_region::open(name, 1);
  CHECK_FALSE(gone_made);
  CHECK(gone_made.code == errc::system_error);
  CHECK(gone_made.message == "shm_open('" + name + "') failed: No such file or directory");
}

TEST_CASE("shm region: open refuses an object smaller than asked", "[unit][shm_region]") {
  const auto name = test_name("b");
  auto owner_made = shm_region::create(name, 8192);
  auto& owner = owner_made.value;
  REQUIRE(owner);
  auto r_made = shm_region::open(name, 8193);
  CHECK_FALSE(r_made);
  CHECK(r_made.message == "shm object '" + name + "' is 8192 bytes, expected at least 8193");
}

TEST_CASE("shm region: create replaces a stale object of a crashed daemon", "[unit][shm_region]") {
  const auto name = test_name("c");
  int fd = ::shm_open(name.c_str(), O_CREAT | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  REQUIRE(::ftruncate(fd, 4096) == 0);
  ::close(fd);
  auto r_made = shm_region::create(name, 16384);
  auto& r = r_made.value;
  REQUIRE(r);
  CHECK(r.size() == 16384);
  CHECK(r.data()[16383] == 0);  // fresh, zeroed, and all of it mapped
}

TEST_CASE("shm region: a move hands over the mapping and the unlink", "[unit][shm_region]") {
  const auto name = test_name("d");
  auto a_made = shm_region::create(name, 4096);
  auto& a = a_made.value;
  REQUIRE(a);
  shm_region b = std::move(a);
  CHECK_FALSE(a);  // NOLINT(bugprone-use-after-move): the moved-from state is the contract
  REQUIRE(b);
  CHECK(b.name() == name);
  { auto c = std::move(b); }  // unlinks once, here
  auto r_made = shm_region::open(name, 1);
  auto& r = r_made.value;
  CHECK_FALSE(r);
}

TEST_CASE("shm region: a move onto a mapped region releases the old one first",
          "[unit][shm_region]") {
  // What a reconnecting client does when it maps a restarted daemon's pool over the old one.
  const auto old_name = test_name("e-old-with-a-name-longer-than-sso");
  const auto new_name = test_name("e-new-with-a-name-longer-than-sso");
  auto target_made = shm_region::create(old_name, 4096);
  auto& target = target_made.value;
  REQUIRE(target);
  auto other_made = shm_region::create(new_name, 8192);
  REQUIRE(other_made.value);
  target = std::move(other_made.value);
  REQUIRE(target);
  CHECK(target.name() == new_name);
  CHECK(target.size() == 8192u);
  CHECK_FALSE(shm_region::open(old_name, 1));  // the old one was unlinked by its creator
  target = shm_region{};                       // and onto an empty one
  CHECK_FALSE(target);
  CHECK_FALSE(shm_region::open(new_name, 1));
}
