#include "core/peer_preamble.hpp"

#include <algorithm>
#include <cstring>

namespace ferry::preamble {
namespace {

constexpr char magic[8] = {'F', 'E', 'R', 'R', 'Y', '-', 'P', 'P'};
constexpr size_t nonce_size = auth_nonce_bytes, mac_size = 32;
static_assert(auth_nonce_bytes == 32, "the frame layout holds 32-byte nonces");

void put16(uint8_t* p, uint16_t v) {
  p[0] = uint8_t(v >> 8);
  p[1] = uint8_t(v);
}
void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = uint8_t(v >> (24 - 8 * i));
}
uint16_t get16(const uint8_t* p) { return uint16_t((p[0] << 8) | p[1]); }
uint32_t get32(const uint8_t* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}

std::vector<uint8_t> frame(size_t size, char type, uint8_t flags) {
  std::vector<uint8_t> f(size, 0);
  std::memcpy(f.data(), magic, sizeof magic);
  put16(f.data() + 8, version);
  f[10] = uint8_t(type);
  f[11] = flags;
  return f;
}

void put_node(uint8_t* p, const std::string& node) {
  std::memcpy(p, node.data(), std::min(node.size(), node_bytes));
}

/// A NUL-padded name field: a valid name, then only NULs.
bool get_node(const uint8_t* p, std::string& out) {
  size_t n = 0;
  while (n < node_bytes && p[n] != 0) ++n;
  for (size_t i = n; i < node_bytes; ++i)
    if (p[i] != 0) return false;
  std::string name(reinterpret_cast<const char*>(p), n);
  if (!valid_node_name(name)) return false;
  out = std::move(name);
  return true;
}

/// Append input to a frame buffer; false when the bytes so far cannot start a preamble frame.
bool take(uint8_t* buf, size_t& got, const uint8_t* data, size_t n) {
  const size_t before = got;
  std::memcpy(buf + got, data, n);
  got += n;
  const size_t checked = std::min(got, sizeof magic);
  return before >= checked || std::memcmp(buf, magic, checked) == 0;
}

step fail(std::string why, bool garbage = false) {
  step s;
  s.next = outcome::failed;
  s.error = std::move(why);
  s.garbage = garbage;
  return s;
}

uint8_t flags_for(const cluster_secrets& secrets) { return secrets.empty() ? 0 : 1; }

/// The secret a side proved with: its own proving one, or the peer's match among ours.
std::string_view secret(const cluster_secrets& secrets, int index) {
  if (secrets.empty() || index < 0) return {};
  return secrets.accepted[static_cast<size_t>(index)];
}

}  // namespace

const char* status_text(uint32_t s) {
  switch (static_cast<status>(s)) {
    case status::ok:
      return "accepted";
    case status::version:
      return "preamble version not supported by the peer";
    case status::secret_required:
      return "this daemon requires peers to prove the cluster secret, and the peer offered no "
             "challenge (set security.cluster_secret_file on both sides)";
    case status::secret_unexpected:
      return "the peer requires a cluster secret but this daemon has none (set "
             "security.cluster_secret_file on both sides)";
    case status::auth:
      return "cluster-secret proof rejected (different secrets?)";
    case status::name:
      return "bad node name";
  }
  return "refused";
}

std::string version_mismatch(uint16_t theirs) {
  std::string s = "peer speaks preamble version " + std::to_string(theirs) + ", this daemon " +
                  std::to_string(version);
  if (theirs == 1)
    s += " (version 1 is an earlier Ferry release, whose daemons talk over CAF's BASP; it does not "
         "interoperate with this one: upgrade both sides of a prefill/decode pair)";
  return s;
}

bool valid_node_name(const std::string& node) {
  if (node.empty() || node.size() > node_bytes) return false;
  return std::all_of(node.begin(), node.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

// --- accepting side ---

acceptor::acceptor(std::string node, cluster_secrets secrets)
    : node_(std::move(node)), secrets_(std::move(secrets)) {}

step acceptor::feed(const uint8_t* data, size_t n) {
  n = std::min(n, want());
  if (done_) return fail("preamble already over");
  if (!take(in_, got_, data, n)) {
    done_ = true;
    return fail("peer does not speak Ferry's peer preamble (bad magic)", true);
  }
  if (got_ < need_) return {};
  return have_hello_ ? on_proof() : on_hello();
}

step acceptor::refuse(status s, char type) {
  done_ = true;
  auto f = frame(type == 'C' ? challenge_size : verdict_size, type, flags_for(secrets_));
  put32(f.data() + 12, static_cast<uint32_t>(s));
  step r = fail(status_text(static_cast<uint32_t>(s)));
  r.out = std::move(f);
  return r;
}

step acceptor::on_hello() {
  if (in_[10] != 'H') {
    done_ = true;
    return fail("peer sent a preamble frame other than HELLO first", true);
  }
  if (get16(in_ + 8) != version) {
    auto r = refuse(status::version, 'C');
    r.error = version_mismatch(get16(in_ + 8));
    return r;
  }
  // The name first, so a refusal below can be logged with it.
  if (!get_node(in_ + 44, peer_node_)) return refuse(status::name, 'C');
  const bool peer_secret = (in_[11] & 1) != 0;
  if (!peer_secret && !secrets_.empty()) return refuse(status::secret_required, 'C');
  if (peer_secret && secrets_.empty()) return refuse(status::secret_unexpected, 'C');
  peer_nonce_.assign(in_ + 12, in_ + 12 + nonce_size);
  nonce_ = random_bytes(nonce_size);
  auto f = frame(challenge_size, 'C', flags_for(secrets_));
  put32(f.data() + 12, static_cast<uint32_t>(status::ok));
  std::memcpy(f.data() + 16, nonce_.data(), nonce_size);
  put_node(f.data() + 48, node_);
  if (!secrets_.empty()) {
    auto p = auth_proof(secrets_.proving(), "ferry-pp-accept", peer_nonce_, nonce_, node_);
    std::memcpy(f.data() + 176, p.data(), mac_size);
  }
  have_hello_ = true;
  need_ = proof_size;
  got_ = 0;
  step s;
  s.out = std::move(f);
  return s;
}

step acceptor::on_proof() {
  if (in_[10] != 'P' || get16(in_ + 8) != version) {
    done_ = true;
    return fail("peer sent a preamble frame other than PROOF second", true);
  }
  if (!secrets_.empty()) {
    bytes got(in_ + 16, in_ + 16 + mac_size);
    peer_secret_ =
        matching_secret(secrets_, got, "ferry-pp-connect", nonce_, peer_nonce_, peer_node_);
    if (peer_secret_ < 0) return refuse(status::auth, 'V');
  }
  done_ = true;
  auto f = frame(verdict_size, 'V', 0);
  put32(f.data() + 12, static_cast<uint32_t>(status::ok));
  step s;
  s.next = outcome::finished;
  s.out = std::move(f);
  return s;
}

peer_wire::link_keys acceptor::keys() const {
  return peer_wire::derive_keys(secret(secrets_, 0), secret(secrets_, peer_secret_), peer_nonce_,
                                nonce_, true);
}

// --- connecting side ---

dialer::dialer(std::string node, cluster_secrets secrets)
    : node_(std::move(node)), secrets_(std::move(secrets)) {}

std::vector<uint8_t> dialer::hello() {
  nonce_ = random_bytes(nonce_size);
  auto f = frame(hello_size, 'H', flags_for(secrets_));
  std::memcpy(f.data() + 12, nonce_.data(), nonce_size);
  put_node(f.data() + 44, node_);
  return f;
}

step dialer::feed(const uint8_t* data, size_t n) {
  n = std::min(n, want());
  if (done_) return fail("preamble already over");
  if (!take(in_, got_, data, n)) {
    done_ = true;
    return fail(
        "the peer port does not speak Ferry's peer preamble (not a ferryd, or an older "
        "one?)",
        true);
  }
  if (got_ < need_) return {};
  return have_challenge_ ? on_verdict() : on_challenge();
}

step dialer::on_challenge() {
  done_ = true;  // until proven otherwise
  if (in_[10] != 'C') return fail("peer answered the preamble with an unexpected frame", true);
  if (get16(in_ + 8) != version) return fail(version_mismatch(get16(in_ + 8)));
  if (auto s = get32(in_ + 12); s != static_cast<uint32_t>(status::ok))
    return fail(std::string("peer refused the preamble: ") + status_text(s));
  if (((in_[11] & 1) != 0) != !secrets_.empty())
    return fail("the peer accepted the preamble with a different cluster-secret setting");
  if (!get_node(in_ + 48, peer_node_)) return fail("peer sent a bad node name in the preamble");
  peer_nonce_.assign(in_ + 16, in_ + 16 + nonce_size);
  auto f = frame(proof_size, 'P', 0);
  if (!secrets_.empty()) {
    bytes got(in_ + 176, in_ + 176 + mac_size);
    // Mutual: our socket goes to our own CAF only if the other side proved the secret.
    peer_secret_ =
        matching_secret(secrets_, got, "ferry-pp-accept", nonce_, peer_nonce_, peer_node_);
    if (peer_secret_ < 0)
      return fail("peer failed the cluster-secret challenge (different secrets?)");
    auto p = auth_proof(secrets_.proving(), "ferry-pp-connect", peer_nonce_, nonce_, node_);
    std::memcpy(f.data() + 16, p.data(), mac_size);
  }
  done_ = false;
  have_challenge_ = true;
  need_ = verdict_size;
  got_ = 0;
  step s;
  s.out = std::move(f);
  return s;
}

step dialer::on_verdict() {
  done_ = true;
  if (in_[10] != 'V') return fail("peer answered the preamble with an unexpected frame", true);
  if (auto s = get32(in_ + 12); s != static_cast<uint32_t>(status::ok))
    return fail(std::string("peer refused the preamble: ") + status_text(s));
  step s;
  s.next = outcome::finished;
  return s;
}

peer_wire::link_keys dialer::keys() const {
  return peer_wire::derive_keys(secret(secrets_, peer_secret_), secret(secrets_, 0), nonce_,
                                peer_nonce_, false);
}

}  // namespace ferry::preamble
