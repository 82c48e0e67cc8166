#include "core/auth.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ferry {

bytes random_bytes(size_t n) {
  bytes out(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = getrandom(out.data() + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error(std::string("getrandom: ") + std::strerror(errno));
    got += static_cast<size_t>(r);
  }
  return out;
}

bytes auth_proof(std::string_view secret, std::string_view label, const bytes& a, const bytes& b,
                 std::string_view c) {
  // Length-prefix each field so no two different inputs concatenate to the same message.
  bytes msg;
  auto put = [&](const void* p, size_t n) {
    for (int i = 0; i < 4; ++i) msg.push_back(static_cast<uint8_t>(n >> (8 * i)));
    msg.insert(msg.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
  };
  put(label.data(), label.size());
  put(a.data(), a.size());
  put(b.data(), b.size());
  put(c.data(), c.size());
  return hmac_sha256(secret, msg);
}

bytes hmac_sha256(std::string_view key, const bytes& message) {
  bytes out(EVP_MAX_MD_SIZE);
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), message.data(), message.size(),
            out.data(), &len))
    throw std::runtime_error("HMAC-SHA256 failed");
  out.resize(len);
  return out;
}

bool proofs_equal(const bytes& x, const bytes& y) {
  return x.size() == y.size() && !x.empty() && CRYPTO_memcmp(x.data(), y.data(), x.size()) == 0;
}

cluster_secrets::cluster_secrets(std::string proving, std::string also_accepted) {
  if (proving.empty()) return;
  accepted.push_back(std::move(proving));
  if (!also_accepted.empty()) accepted.push_back(std::move(also_accepted));
}

int matching_secret(const cluster_secrets& secrets, const bytes& proof, std::string_view label,
                    const bytes& a, const bytes& b, std::string_view c) {
  // No early exit: each candidate costs the same whether an earlier one matched or not.
  int found = -1;
  for (size_t i = 0; i < secrets.accepted.size(); ++i) {
    const bool ok = proofs_equal(proof, auth_proof(secrets.accepted[i], label, a, b, c));
    found = ok && found < 0 ? static_cast<int>(i) : found;
  }
  return found;
}

result<std::string> read_secret_file(const std::string& path, std::string_view key) {
  const std::string what = std::string(key) + " '" + path + "': ";
  auto invalid = [&](const std::string& why) { return error{errc::config_invalid, what + why}; };
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return invalid(std::strerror(errno));
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return invalid("not a regular file");
  }
  if (sb.st_mode & (S_IRWXG | S_IRWXO)) {
    close(fd);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(sb.st_mode & 07777));
    return invalid(std::string("mode ") + mode + " lets group or others access it; chmod 600 it");
  }
  std::string secret;
  char buf[4096];
  ssize_t n = 0;
  while ((n = read(fd, buf, sizeof buf)) > 0 && secret.size() < 65536)
    secret.append(buf, static_cast<size_t>(n));
  close(fd);
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (secret.size() < min_secret_bytes)
    return invalid("holds " + std::to_string(secret.size()) + " bytes; at least " +
                   std::to_string(min_secret_bytes) + " are required");
  return secret;
}

}  // namespace ferry
