// The peer preamble (core/peer_preamble.hpp) without sockets: an accepting and a connecting side
// exchange frames in memory, in whole frames or byte by byte.

#include <catch2/catch.hpp>
#include <cstring>

#include "core/peer_preamble.hpp"

using namespace ferry::preamble;

namespace {

struct result {
  bool admitted = false;   // the accepting side finished
  bool connected = false;  // the connecting side finished
  std::string accept_error, connect_error;
  ferry::peer_wire::link_keys accept_keys, connect_keys;  // once both finished
};

/// Feed `frame` to `side` in slices of `slice` bytes (0: whole); the last step.
template <class Side>
step feed(Side& side, const std::vector<uint8_t>& frame, size_t slice) {
  step s;
  size_t pos = 0;
  while (pos < frame.size() && side.want() > 0) {
    size_t n = std::min(side.want(), frame.size() - pos);
    if (slice) n = std::min(n, slice);
    s = side.feed(frame.data() + pos, n);
    pos += n;
    if (s.next != outcome::reading) break;
  }
  return s;
}

result run(const ferry::cluster_secrets& accept_secret,
           const ferry::cluster_secrets& connect_secret, size_t slice) {
  acceptor a("prefill-0", accept_secret);
  dialer d("decode-0", connect_secret);
  result r;
  auto challenge = feed(a, d.hello(), slice);
  if (challenge.next == outcome::failed) r.accept_error = challenge.error;
  REQUIRE(challenge.out.size() == challenge_size);  // a challenge, or a refusal in its shape
  auto proof = feed(d, challenge.out, slice);
  if (proof.next == outcome::failed) {
    r.connect_error = proof.error;
    return r;
  }
  REQUIRE(proof.out.size() == proof_size);
  auto verdict = feed(a, proof.out, slice);
  r.admitted = verdict.next == outcome::finished;
  if (verdict.next == outcome::failed) r.accept_error = verdict.error;
  REQUIRE(verdict.out.size() == verdict_size);
  auto end = feed(d, verdict.out, slice);
  r.connected = end.next == outcome::finished;
  if (end.next == outcome::failed) r.connect_error = end.error;
  if (r.admitted && r.connected) {
    r.accept_keys = a.keys();
    r.connect_keys = d.keys();
  }
  CHECK(a.want() == 0);
  CHECK(d.want() == 0);
  return r;
}

const std::string secret = "correct horse battery staple";

}  // namespace

TEST_CASE("the preamble admits a peer with the same secret, or both without one", "[preamble]") {
  for (size_t slice : {0, 1, 7}) {
    INFO("slice " << slice);
    auto with = run(secret, secret, slice);
    CHECK(with.admitted);
    CHECK(with.connected);
    auto without = run("", "", slice);
    CHECK(without.admitted);
    CHECK(without.connected);
  }
}

TEST_CASE("the preamble refuses mismatched secrets with a reason on the connecting side",
          "[preamble]") {
  auto different = run(secret, "a different secret of the cluster", 0);
  CHECK_FALSE(different.admitted);
  CHECK(different.connect_error == "peer failed the cluster-secret challenge (different secrets?)");
  auto only_acceptor = run(secret, "", 0);
  CHECK_FALSE(only_acceptor.admitted);
  CHECK_THAT(only_acceptor.connect_error,
             Catch::StartsWith("peer refused the preamble: this daemon requires peers to prove "
                               "the cluster secret"));
  auto only_dialer = run("", secret, 0);
  CHECK_FALSE(only_dialer.admitted);
  CHECK_THAT(only_dialer.connect_error,
             Catch::StartsWith("peer refused the preamble: the peer requires a cluster secret but "
                               "this daemon has none"));
}

TEST_CASE("the preamble accepts either of two secrets while a cluster rotates", "[preamble]") {
  const std::string old_secret = secret, new_secret = "the new secret of the cluster";
  using ferry::cluster_secrets;
  // Step 1: every daemon accepts both and proves the old one; step 2: proves the new one.
  const cluster_secrets only_old(old_secret), step1(old_secret, new_secret),
      step2(new_secret, old_secret), only_new(new_secret);
  struct pairing {
    const char* what;
    cluster_secrets accept, connect;
    bool admitted;
  };
  const pairing pairs[] = {
      {"old -> step 1", only_old, step1, true},
      {"step 1 -> old", step1, only_old, true},
      {"step 1 -> step 2", step1, step2, true},
      {"step 2 -> step 1", step2, step1, true},
      {"step 2 -> new", step2, only_new, true},
      {"new -> step 2", only_new, step2, true},
      // Who skipped a step: one side cannot check the other's proof.
      {"old -> new", only_old, only_new, false},
      {"new -> old", only_new, only_old, false},
      {"old -> step 2", only_old, step2, false},
      {"step 2 -> old", step2, only_old, false},
      {"step 1 -> new", step1, only_new, false},
      {"new -> step 1", only_new, step1, false},
  };
  for (const auto& p : pairs) {
    INFO(p.what << " (accepting -> connecting)");
    auto r = run(p.accept, p.connect, 0);
    CHECK(r.admitted == p.admitted);
    CHECK(r.connected == p.admitted);
    // Both sides derive the channel's keys from the secrets each proved, mirrored.
    if (p.admitted) {
      CHECK(r.accept_keys.send == r.connect_keys.recv);
      CHECK(r.accept_keys.recv == r.connect_keys.send);
      CHECK(r.accept_keys.send != r.accept_keys.recv);
      CHECK(r.accept_keys.send.size() == 32);
    }
    // Refused by whichever side checks a proof it cannot match first, with the same words.
    if (!p.admitted) CHECK_THAT(r.connect_error, Catch::EndsWith("(different secrets?)"));
  }
}

TEST_CASE("the preamble rejects garbage at the first byte that differs from the magic",
          "[preamble]") {
  acceptor a("prefill-0", "");
  CHECK(a.want() == hello_size);
  const uint8_t good[] = {'F', 'E', 'R'};
  CHECK(a.feed(good, 3).next == outcome::reading);
  CHECK(a.want() == hello_size - 3);
  const uint8_t bad[] = {'X'};
  auto s = a.feed(bad, 1);
  CHECK(s.next == outcome::failed);
  CHECK(s.garbage);
  CHECK(s.out.empty());  // nothing is answered to garbage
  CHECK(a.want() == 0);

  // A BASP header claiming a 4 GiB payload is garbage at its first byte.
  acceptor b("prefill-0", secret);
  const uint8_t basp[32] = {1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
  auto t = b.feed(basp, sizeof basp);
  CHECK(t.next == outcome::failed);
  CHECK(t.garbage);
}

TEST_CASE("the preamble refuses a bad node name and another version with a status, naming it",
          "[preamble]") {
  dialer d("decode-0", "");
  auto hello = d.hello();
  auto name = hello;
  name[44] = '/';
  acceptor a("prefill-0", "");
  auto s = feed(a, name, 0);
  CHECK(s.next == outcome::failed);
  CHECK(s.error == "bad node name");
  CHECK(feed(d, s.out, 0).error == "peer refused the preamble: bad node name");

  auto version = hello;
  version[9] = 3;
  acceptor b("prefill-0", "");
  auto v = feed(b, version, 0);
  CHECK(v.next == outcome::failed);
  CHECK(v.error == "peer speaks preamble version 3, this daemon 2");
  dialer d2("decode-0", "");
  d2.hello();
  CHECK(feed(d2, v.out, 0).error ==
        "peer refused the preamble: preamble version not supported by the peer");

  // A daemon of the release before the peer channel (preamble 1, then CAF's BASP) is refused
  // by name on either side.
  auto old = hello;
  old[9] = 1;
  acceptor c("prefill-0", "");
  auto o = feed(c, old, 0);
  CHECK(o.next == outcome::failed);
  CHECK_THAT(o.error, Catch::StartsWith("peer speaks preamble version 1, this daemon 2 (version 1 "
                                        "is an earlier Ferry release, whose daemons talk over "
                                        "CAF's BASP"));
  auto old_refusal = o.out;  // what an old accepting daemon answers: its own version, 1
  old_refusal[9] = 1;
  dialer e("decode-0", "");
  e.hello();
  CHECK_THAT(feed(e, old_refusal, 0).error,
             Catch::StartsWith("peer speaks preamble version 1, this daemon 2 (version 1"));
  CHECK_FALSE(valid_node_name(std::string(129, 'a')));
  CHECK(valid_node_name(std::string(128, 'a')));
}
