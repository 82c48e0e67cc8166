// libFuzzer target: a pool its registration describes (core/registration.hpp), from a hostile
// or broken engine's register_memory body (v7) and descriptor sizes. Properties: no crash, no
// hang, no overflow; a description that describe_registration accepts goes through
// validate_config and make_layout, and is the same as itself.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "core/config.hpp"
#include "core/layout.hpp"
#include "core/registration.hpp"

using namespace ferry;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The first byte: how many descriptors (1..8); then a u64 size per descriptor; the rest is
  // the register_memory body, decoded as the daemon decodes it.
  if (size < 1) return 0;
  const size_t fds = static_cast<size_t>(data[0] % 8) + 1;
  if (size < 1 + fds * 8) return 0;
  std::vector<uint64_t> sizes(fds);
  for (size_t i = 0; i < fds; ++i) std::memcpy(&sizes[i], data + 1 + i * 8, 8);
  const auto body = std::span<const uint8_t>(data + 1 + fds * 8, size - 1 - fds * 8);
  auto d = proto::decode(static_cast<uint16_t>(proto::msg_type::register_memory), 1, body, 7);
  if (!d.msg) return 0;
  const auto* req = std::get_if<proto::register_memory>(&*d.msg);
  if (!req) std::abort();
  auto described = describe_registration(*req, sizes);
  if (!described) {
    if (described.message.empty()) std::abort();  // a refusal says why
    return 0;
  }
  ferry_config cfg;
  cfg.node_name = "fuzz";
  cfg.client_listen = "/tmp/fuzz.sock";
  cfg.pools = described.value.section;
  if (validate_config(cfg)) (void)make_layout(cfg.pools);
  if (registration_difference(req->pool, described.value, described.value)) std::abort();
  return 0;
}
