// Access (docs/operations.md, "Users" and "Secrets"), with real daemons:
// - engines running as other users: a forked child drops to an unused uid and gid (the kernel's
//   SO_PEERCRED reports numeric ids; the config takes them), connects, says hello and maps
//   every pool read-write, or is refused with access_denied and words naming its ids and the
//   keys to change; the daemon serves its own clients on. Needs root to change users: a reported
//   skip otherwise.
// - cluster-secret rotation: daemons holding the old secret, both, or the new one, paired as the
//   three steps of a rolling rotation pair them; which secret each peer proved is in the log and
//   the metrics.

#include <fmt/format.h>
#include <grp.h>
#include <sys/stat.h>

#include "harness.hpp"
#include "http.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

void skip_unless_root() {
  if (geteuid() != 0) {
    WARN("SKIPPED: connecting as another user needs root (setuid to an unused uid)");
    std::exit(skip_exit_code);
  }
}

/// The ferryd test directory must be searchable by the other users for them to reach the socket.
void open_dir(const temp_dir& dir) { REQUIRE(chmod(dir.path.c_str(), 0755) == 0); }

/// In a forked child running as `uid`/`gid` with supplementary `groups`: connect to `socket`, say
/// hello, map every pool and write a byte into each. What happened: "mapped N pools", or
/// "error CODE: MESSAGE" from the connect or the mapping.
std::string as_user(const std::string& socket, uid_t uid, gid_t gid, std::vector<gid_t> groups) {
  int out[2];
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    auto say = [&](const std::string& s) {
      [[maybe_unused]] auto n = write(out[1], s.data(), s.size());
      _exit(0);
    };
    close(out[0]);
    if (setgroups(groups.size(), groups.data()) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
      say(std::string("cannot change user: ") + std::strerror(errno));
    auto c = client::client::connect(socket, "other-user", std::chrono::seconds(10));
    if (!c) say(fmt::format("error {}: {}", static_cast<int>(c.code), c.message));
    if (auto m = c.value->map_pools(); !m)
      say(fmt::format("error {}: {}", static_cast<int>(m.code), m.message));
    int mapped = 0;
    for (int k = 0; k < pool_kind_count; ++k)
      if (auto* p = c.value->pool(static_cast<pool_kind>(k))) {
        p[0] = 0x5a;  // mapped read-write
        ++mapped;
      }
    say(fmt::format("mapped {} pools", mapped));
  }
  close(out[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  return got;
}

struct stat stat_of(const std::string& path) {
  struct stat st {};
  REQUIRE(stat(path.c_str(), &st) == 0);
  return st;
}

/// The pools' shm objects, as /dev/shm paths.
std::vector<std::string> pool_paths(client::client& c) {
  std::vector<std::string> v;
  for (const auto& p : c.daemon().pools)
    if (p.present) v.push_back("/dev/shm" + p.shm_name);
  return v;
}

/// The first byte of every pool, as this (root) client sees it.
int marked_pools(client::client& c) {
  int n = 0;
  for (int k = 0; k < pool_kind_count; ++k)
    if (auto* p = c.pool(static_cast<pool_kind>(k)); p && p[0] == 0x5a) ++n;
  return n;
}

const std::string refused_text =
    "may not use this ferryd; to admit it, add the uid to security.client_users or one of its "
    "groups to security.client_groups in ferryd's config";

}  // namespace

TEST_CASE(
    "client users named in the config get in and map the pools, others are refused with "
    "a reason",
    "[e2e][access]") {
  skip_unless_root();
  temp_dir dir;
  open_dir(dir);
  shape s;
  s.client_users = {"4242"};
  daemon_proc d(dir, "decode-0", "decode", s);
  auto own = d.connect();
  // Anyone may connect; the SO_PEERCRED check is the gate. The pools are shared by ACL.
  CHECK((stat_of(d.socket()).st_mode & 0777) == 0666);
  for (const auto& p : pool_paths(*own)) CHECK((stat_of(p).st_mode & 0777) == 0660);

  CHECK(as_user(d.socket(), 4242, 4242, {}) == "mapped 3 pools");
  CHECK(marked_pools(*own) == 3);  // the other user's writes landed in the daemon's pools

  const auto refused = as_user(d.socket(), 4343, 4343, {});
  CHECK_THAT(refused, Catch::StartsWith("error 313: access denied: uid 4343 (gid 4343, pid "));
  CHECK_THAT(refused, Catch::EndsWith(refused_text));
  CHECK_THAT(d.log_text(),
             Catch::Contains("warning [client] client connection refused: access denied: uid 4343 "
                             "(gid 4343, pid "));
  // The daemon serves its own clients on, and admits the named user again.
  CHECK(own->info(proto::info_topic::status));
  CHECK(as_user(d.socket(), 4242, 4242, {}) == "mapped 3 pools");
}

TEST_CASE("one client group: the socket and the pools belong to it, 0660", "[e2e][access]") {
  skip_unless_root();
  temp_dir dir;
  open_dir(dir);
  shape s;
  s.client_groups = {"4300"};
  daemon_proc d(dir, "decode-0", "decode", s);
  auto own = d.connect();
  CHECK((stat_of(d.socket()).st_mode & 0777) == 0660);
  CHECK(stat_of(d.socket()).st_gid == 4300);
  for (const auto& p : pool_paths(*own)) {
    CHECK((stat_of(p).st_mode & 0777) == 0660);
    CHECK(stat_of(p).st_gid == 4300);
  }
  // A member by a supplementary group, and one by its primary group.
  CHECK(as_user(d.socket(), 4242, 4242, {4300}) == "mapped 3 pools");
  CHECK(as_user(d.socket(), 4244, 4300, {}) == "mapped 3 pools");
  // Outside the group the kernel refuses the connect itself: ferryd never sees it.
  CHECK_THAT(as_user(d.socket(), 4343, 4343, {}),
             Catch::StartsWith("error 300: cannot connect to ferryd at '" + d.socket() + "'") &&
                 Catch::EndsWith("Permission denied"));
  CHECK(own->info(proto::info_topic::status));
}

TEST_CASE("several client groups: members get in, the pools carry an ACL entry for each",
          "[e2e][access]") {
  skip_unless_root();
  temp_dir dir;
  open_dir(dir);
  shape s;
  s.client_groups = {"4300", "4301"};
  daemon_proc d(dir, "decode-0", "decode", s);
  auto own = d.connect();
  CHECK((stat_of(d.socket()).st_mode & 0777) == 0666);
  CHECK(as_user(d.socket(), 4242, 4301, {}) == "mapped 3 pools");
  CHECK(as_user(d.socket(), 4243, 4243, {4300}) == "mapped 3 pools");
  const auto refused = as_user(d.socket(), 4343, 4343, {4302});
  CHECK_THAT(refused, Catch::StartsWith("error 313: access denied: uid 4343 (gid 4343, pid "));
  CHECK(own->info(proto::info_topic::status));
}

TEST_CASE("without client users or groups only ferryd's user gets in", "[e2e][access]") {
  skip_unless_root();
  temp_dir dir;
  open_dir(dir);
  daemon_proc d(dir, "decode-0", "decode", shape{});
  auto own = d.connect();
  CHECK((stat_of(d.socket()).st_mode & 0777) == 0700);
  for (const auto& p : pool_paths(*own)) CHECK((stat_of(p).st_mode & 0777) == 0600);
  CHECK_THAT(as_user(d.socket(), 4242, 4242, {}), Catch::EndsWith("Permission denied"));
  CHECK_THAT(d.log_text(), Catch::Contains("ferryd's own user (uid 0) and root alone may connect"));
}

TEST_CASE("a client user or group this host does not know stops the start, naming the key",
          "[e2e][access]") {
  temp_dir dir;
  shape s;
  s.client_users = {"4242", "no-such-ferry-user"};
  const auto config = (dir.path / "bad.yaml").string();
  std::ofstream(config) << make_config("bad", "decode", free_port(),
                                       (dir.path / "bad.sock").string(), s);
  auto r = run_ferryd({"--check-config", config}, dir.path / "bad.log");
  CHECK(r.code == exit_code::usage);
  CHECK(r.output ==
        "ferryd: invalid config: security.client_users[1]: no user \"no-such-ferry-user\" on this "
        "host (give a user name it knows, or a numeric uid)\n");
}

TEST_CASE("a cluster rotates its secret without refusing a handshake", "[e2e][security]") {
  temp_dir secrets;
  const auto old_key = write_secret(secrets, "old.key", "the cluster secret of last year");
  const auto new_key = write_secret(secrets, "new.key", "the cluster secret of this year");
  // Step 1 of a rotation: every daemon accepts the new secret while proving the old one; step 2:
  // every daemon proves the new one and still accepts the old one; step 3: the old one goes.
  shape only_old, step1, step2, only_new;
  only_old.secret_file = step1.secret_file = old_key;
  step1.accepted_secret_file = new_key;
  only_new.secret_file = step2.secret_file = new_key;
  step2.accepted_secret_file = old_key;
  const uint16_t metrics_port = free_port();
  step1.metrics_listen = fmt::format("127.0.0.1:{}", metrics_port);
  auto proved = [](const std::string& file, bool accepted) {
    return fmt::format(
        "it proved the cluster secret of {} ({})", file,
        accepted ? "security.accepted_cluster_secret_file" : "security.cluster_secret_file");
  };

  temp_dir dir;
  daemon_proc p_old(launch_only, dir, "prefill-old", "prefill", only_old);
  daemon_proc p_step2(launch_only, dir, "prefill-step2", "prefill", step2);
  await_ready(p_old, p_step2);
  auto c_old = p_old.connect();
  auto c_step2 = p_step2.connect();
  uint64_t next_room = 900;
  auto room = [&] {
    room_spec r;
    r.room = next_room++;
    r.src_pages = range(0, 8);
    r.dst_pages = range(8, 8);
    r.chunks = {8};
    return r;
  };
  {
    // A decode at step 1 serves an old-only prefill (old <-> old+new) and one already at step 2.
    daemon_proc d(dir, "decode-step1", "decode", step1);
    auto cd = d.connect();
    run_and_verify(*c_old, *cd, p_old.control(), room());
    run_and_verify(*c_step2, *cd, p_step2.control(), room());
    // Each side says which file's secret its peer proved.
    CHECK_THAT(d.log_text(),
               Catch::Contains(proved(old_key, false)) && Catch::Contains(proved(new_key, true)));
    CHECK_THAT(p_old.log_text(), Catch::Contains(proved(old_key, false)));
    CHECK_THAT(p_step2.log_text(), Catch::Contains(proved(old_key, true)));
    const auto text = http_get(metrics_port, "/metrics").body;
    INFO(text);
    CHECK(series(text, "ferry_peer_auth_total", {{"file", old_key}}) >= 1.0);
    CHECK(series(text, "ferry_peer_auth_total", {{"file", new_key}}) >= 1.0);
    cd.reset();
    CHECK(d.stop() == 0);
  }
  // A decode past step 3 (new alone) serves the step-2 prefill (new <-> old+new), and is
  // refused by the prefill that never took step 1 (old alone <-> new alone).
  daemon_proc d(dir, "decode-new", "decode", only_new);
  auto cd = d.connect();
  run_and_verify(*c_step2, *cd, p_step2.control(), room());
  CHECK_THAT(p_step2.log_text(), Catch::Contains(proved(new_key, false)));
  const auto r = room();
  stage(*c_old, *cd, r);
  prepare(*cd, p_old.control(), r);
  auto de = wait_done(*cd, r.room);
  CHECK(de.status == room_status::failed);
  CHECK_THAT(de.reason,
             Catch::Contains("failed the cluster-secret challenge (different secrets?)"));
}
