// The cluster-secret proof (HMAC-SHA256 through OpenSSL) and the secret file checks.

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/auth.hpp"

using namespace ferry;

namespace {

std::string hex(const bytes& b) {
  std::string s;
  char buf[3];
  for (auto x : b) {
    std::snprintf(buf, sizeof buf, "%02x", x);
    s += buf;
  }
  return s;
}

struct temp_file {
  std::string path;
  temp_file(const std::string& text, mode_t mode) {
    char tmpl[] = "/tmp/ferry-secret-XXXXXX";
    int fd = mkstemp(tmpl);
    REQUIRE(fd >= 0);
    close(fd);
    path = tmpl;
    std::ofstream(path) << text;
    REQUIRE(chmod(path.c_str(), mode) == 0);
  }
  ~temp_file() { std::filesystem::remove(path); }
};

}  // namespace

TEST_CASE("auth proofs are HMAC-SHA256 over length-prefixed fields", "[unit][auth]") {
  const bytes a{1, 2, 3}, b{4, 5};
  const auto p = auth_proof("a cluster secret!", "ferry-accept", a, b, "node/instance");
  REQUIRE(p.size() == 32);
  // Deterministic, and every input matters.
  CHECK(proofs_equal(p, auth_proof("a cluster secret!", "ferry-accept", a, b, "node/instance")));
  CHECK_FALSE(
      proofs_equal(p, auth_proof("a cluster secreT!", "ferry-accept", a, b, "node/instance")));
  CHECK_FALSE(
      proofs_equal(p, auth_proof("a cluster secret!", "ferry-connect", a, b, "node/instance")));
  CHECK_FALSE(
      proofs_equal(p, auth_proof("a cluster secret!", "ferry-accept", b, a, "node/instance")));
  CHECK_FALSE(proofs_equal(p, auth_proof("a cluster secret!", "ferry-accept", a, b, "node/other")));
  // Field boundaries are part of the message: moving a byte between fields changes the proof.
  CHECK_FALSE(proofs_equal(auth_proof("s", "l", bytes{1, 2}, bytes{3}, ""),
                           auth_proof("s", "l", bytes{1}, bytes{2, 3}, "")));
  CHECK_FALSE(proofs_equal(p, bytes{}));
  CHECK_FALSE(proofs_equal(bytes{}, bytes{}));
}

TEST_CASE("the HMAC is the standard one (RFC 4231 test case 2)", "[unit][auth]") {
  const std::string data = "what do ya want for nothing?";
  CHECK(hex(hmac_sha256("Jefe", bytes(data.begin(), data.end()))) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  CHECK(random_bytes(auth_nonce_bytes).size() == auth_nonce_bytes);
  CHECK(random_bytes(32) != random_bytes(32));
}

TEST_CASE("the cluster secret file must be private and long enough", "[unit][auth]") {
  SECTION("good") {
    temp_file f("0123456789abcdef-secret\n", 0600);
    auto r = read_secret_file(f.path);
    CHECK(r.code == errc::ok);
    CHECK(r.value == "0123456789abcdef-secret");
  }
  SECTION("readable by others") {
    temp_file f("0123456789abcdef-secret\n", 0644);
    auto r = read_secret_file(f.path);
    CHECK(r.code == errc::config_invalid);
    CHECK(r.message == "security.cluster_secret_file '" + f.path +
                           "': mode 0644 lets group or others access it; chmod 600 it");
    CHECK(r.value.empty());
  }
  SECTION("too short") {
    temp_file f("short\n", 0600);
    CHECK(read_secret_file(f.path).message ==
          "security.cluster_secret_file '" + f.path + "': holds 5 bytes; at least 16 are required");
  }
  SECTION("missing") {
    CHECK(read_secret_file("/nonexistent/ferry-secret").message ==
          "security.cluster_secret_file '/nonexistent/ferry-secret': No such file or directory");
  }
  SECTION("the accepted one is named by its own key") {
    temp_file f("short\n", 0600);
    CHECK(read_secret_file(f.path, "security.accepted_cluster_secret_file").message ==
          "security.accepted_cluster_secret_file '" + f.path +
              "': holds 5 bytes; at least 16 are required");
  }
}
