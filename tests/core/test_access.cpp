// Who may use the client socket and map the pools (core/access.hpp): names and ids resolved at
// validation with errors naming the key, the admission rule, the refusal's words, and the modes,
// group and ACL given to a socket file and an shm object. The cluster secrets of a rotation
// (core/auth.hpp: matching_secret) are at the end.

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <string>

#include "config_yaml.hpp"
#include "core/access.hpp"
#include "core/auth.hpp"
#include "core/config.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

std::string with_security(const std::string& body) { return base_yaml + "security:\n" + body; }

/// A fresh shm object's descriptor, unlinked at once (the descriptor keeps it).
int shm_fd() {
  const auto name = "/ferry-test-access." + std::to_string(getpid());
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  REQUIRE(fd >= 0);
  shm_unlink(name.c_str());
  return fd;
}

}  // namespace

TEST_CASE("client users and groups resolve names and numbers", "[unit][access]") {
  CHECK(resolve_user("root").value == 0);
  CHECK(resolve_user("4242").value == 4242);  // a uid need not have a name
  CHECK(resolve_group("root").value == 0);
  CHECK(resolve_group("4343").value == 4343);
  const auto no_user = resolve_user("no-such-ferry-user");
  CHECK(no_user.code == errc::config_invalid);
  CHECK(no_user.message ==
        "no user \"no-such-ferry-user\" on this host (give a user name it knows, or a numeric "
        "uid)");
  CHECK(resolve_group("no-such-ferry-group").message ==
        "no group \"no-such-ferry-group\" on this host (give a group name it knows, or a numeric "
        "gid)");
  CHECK_FALSE(resolve_user("4294967295"));  // (uid_t)-1 is no uid
  CHECK_FALSE(resolve_user("-1"));

  const auto cfg =
      parse_ok(with_security("  client_users: [root, 4242, \"0\"]\n"
                             "  client_groups: [4343]\n"));
  REQUIRE(validate_config(cfg));
  const auto access = resolve_client_access(cfg.security);
  REQUIRE(access);
  CHECK(access.value.uids == std::vector<uint32_t>{0, 4242});  // root named twice counts once
  CHECK(access.value.gids == std::vector<uint32_t>{4343});
  CHECK_FALSE(access.value.sole_group());
}

TEST_CASE("security config errors name the key and the value", "[unit][access][config]") {
  CHECK(validate_error(with_security("  client_users: [root, no-such-ferry-user]\n")) ==
        "security.client_users[1]: no user \"no-such-ferry-user\" on this host (give a user name "
        "it knows, or a numeric uid)");
  CHECK(validate_error(with_security("  client_groups: [no-such-ferry-group]\n")) ==
        "security.client_groups[0]: no group \"no-such-ferry-group\" on this host (give a group "
        "name it knows, or a numeric gid)");
  CHECK(parse_error(with_security("  client_users: root\n")) ==
        "security.client_users: expected a list, got \"root\"");
  CHECK(parse_error(with_security("  client_user: [root]\n")) ==
        "security.client_user: unknown key");
  CHECK(validate_error(with_security("  accepted_cluster_secret_file: /etc/ferry/new.key\n")) ==
        "security.accepted_cluster_secret_file: needs security.cluster_secret_file too: the "
        "secret this daemon proves with (the accepted one is only checked in peers' proofs)");
  CHECK(validate_error(with_security("  cluster_secret_file: /etc/ferry/a.key\n"
                                     "  accepted_cluster_secret_file: /etc/ferry/a.key\n")) ==
        "security.accepted_cluster_secret_file: expected a file other than "
        "security.cluster_secret_file, got the same \"/etc/ferry/a.key\"");
}

TEST_CASE("the security keys survive to_yaml", "[unit][access][config]") {
  const auto cfg =
      parse_ok(with_security("  cluster_secret_file: /etc/ferry/new.key\n"
                             "  accepted_cluster_secret_file: /etc/ferry/old.key\n"
                             "  client_users: [root, 4242]\n"
                             "  client_groups: [\"0\"]\n"));
  const auto again = parse_ok(to_yaml(cfg));
  INFO(to_yaml(cfg));
  CHECK(again.security.cluster_secret_file == "/etc/ferry/new.key");
  CHECK(again.security.accepted_cluster_secret_file == "/etc/ferry/old.key");
  CHECK(again.security.client_users == std::vector<std::string>{"root", "4242"});
  CHECK(again.security.client_groups == std::vector<std::string>{"0"});
  CHECK(to_yaml(parse_ok(base_yaml)).find("security") == std::string::npos);
}

TEST_CASE("a client is admitted as ferryd's user, root, a named user or a group member",
          "[unit][access]") {
  client_access a;
  a.uids = {1001};
  a.gids = {2000, 2001};
  const uint32_t self = 500;
  auto peer = [](uint32_t uid, uint32_t gid, std::vector<uint32_t> groups = {}) {
    peer_credentials p;
    p.pid = 77;
    p.uid = uid;
    p.gid = gid;
    p.groups = std::move(groups);
    return p;
  };
  CHECK(admitted(a, self, peer(500, 500)));                    // ferryd's own user
  CHECK(admitted(a, self, peer(0, 0)));                        // root
  CHECK(admitted(a, self, peer(1001, 1001)));                  // named user
  CHECK(admitted(a, self, peer(1002, 2001)));                  // primary group
  CHECK(admitted(a, self, peer(1002, 1002, {10, 2000})));      // supplementary group
  CHECK_FALSE(admitted(a, self, peer(1002, 1002, {10, 11})));  // none of them
  CHECK_FALSE(admitted({}, self, peer(1001, 2000)));           // nobody named
  CHECK(access_denied_reason(peer(1002, 1003)) ==
        "access denied: uid 1002 (gid 1003, pid 77) may not use this ferryd; to admit it, add "
        "the uid to security.client_users or one of its groups to security.client_groups in "
        "ferryd's config");
}

TEST_CASE("the kernel's credentials of a unix socket's peer", "[unit][access]") {
  int sv[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0);
  const auto c = credentials_of(sv[0]);
  close(sv[0]);
  close(sv[1]);
  REQUIRE(c);
  CHECK(c.value.pid == static_cast<uint32_t>(getpid()));
  CHECK(c.value.uid == geteuid());
  CHECK(c.value.gid == getegid());
  std::vector<gid_t> groups(static_cast<size_t>(getgroups(0, nullptr)));
  groups.resize(static_cast<size_t>(getgroups(static_cast<int>(groups.size()), groups.data())));
  CHECK(c.value.groups == std::vector<uint32_t>(groups.begin(), groups.end()));
}

TEST_CASE("the socket file and the pools are opened only as far as the config says",
          "[unit][access]") {
  const auto dir =
      std::filesystem::temp_directory_path() / ("ferry-access-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "s.sock").string();
  auto bound = [&] {
    std::filesystem::remove(path);
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    const mode_t old = umask(0077);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0);
    umask(old);
    return fd;
  };
  auto stat_of = [](const std::string& p) {
    struct stat st {};
    REQUIRE(stat(p.c_str(), &st) == 0);
    return st;
  };
  auto fstat_of = [](int fd) {
    struct stat st {};
    REQUIRE(fstat(fd, &st) == 0);
    return st;
  };
  // A group ferryd's user is in (its own), so this works as any user.
  const uint32_t mine = getegid();

  SECTION("nobody named: untouched") {
    const int s = bound();
    REQUIRE(share_socket_file({}, path));
    CHECK((stat_of(path).st_mode & 0777) == 0700);
    close(s);
    const int fd = shm_fd();
    REQUIRE(share_shm_object({}, fd));
    CHECK((fstat_of(fd).st_mode & 0777) == 0600);
    CHECK(fgetxattr(fd, "system.posix_acl_access", nullptr, 0) < 0);
    close(fd);
  }
  SECTION("one group, no user: that group, 0660") {
    client_access a;
    a.gids = {mine};
    const int s = bound();
    REQUIRE(share_socket_file(a, path));
    CHECK((stat_of(path).st_mode & 0777) == 0660);
    CHECK(stat_of(path).st_gid == mine);
    close(s);
    const int fd = shm_fd();
    REQUIRE(share_shm_object(a, fd));
    CHECK((fstat_of(fd).st_mode & 0777) == 0660);
    CHECK(fstat_of(fd).st_gid == mine);
    close(fd);
  }
  SECTION("users or several groups: a 0666 socket, and pools with an ACL") {
    client_access a;
    a.uids = {4242, 4241};
    a.gids = {4343};
    const int s = bound();
    REQUIRE(share_socket_file(a, path));
    CHECK((stat_of(path).st_mode & 0777) == 0666);
    close(s);
    const int fd = shm_fd();
    REQUIRE(share_shm_object(a, fd));
    // The group bits show the ACL's mask; the owning group and others get nothing.
    CHECK((fstat_of(fd).st_mode & 0777) == 0660);
    const auto size = fgetxattr(fd, "system.posix_acl_access", nullptr, 0);
    CHECK(size == 4 + 7 * 8);  // header; owner, 2 users, owning group, 1 group, mask, other
    close(fd);
  }
  std::filesystem::remove_all(dir);
}

TEST_CASE("a proof matches whichever accepted secret made it, and no other", "[unit][auth]") {
  const bytes a{1, 2, 3}, b{4, 5};
  const cluster_secrets both("the new secret, 16+", "the old secret, 16+");
  const cluster_secrets one("the new secret, 16+");
  auto proof = [&](const std::string& s) { return auth_proof(s, "ferry-accept", a, b, "n/i"); };
  CHECK(matching_secret(both, proof("the new secret, 16+"), "ferry-accept", a, b, "n/i") == 0);
  CHECK(matching_secret(both, proof("the old secret, 16+"), "ferry-accept", a, b, "n/i") == 1);
  CHECK(matching_secret(one, proof("the old secret, 16+"), "ferry-accept", a, b, "n/i") == -1);
  CHECK(matching_secret(both, proof("another secret, 16+"), "ferry-accept", a, b, "n/i") == -1);
  CHECK(matching_secret(both, proof("the new secret, 16+"), "ferry-connect", a, b, "n/i") == -1);
  CHECK(matching_secret(both, bytes{}, "ferry-accept", a, b, "n/i") == -1);
  CHECK(both.proving() == "the new secret, 16+");
  CHECK(cluster_secrets("").empty());
  CHECK(cluster_secrets("x", "").accepted.size() == 1);
}
