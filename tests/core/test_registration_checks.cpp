// core/registration_checks.hpp: what a register_memory is refused for, in the order a client
// sees the refusals, against a daemon whose aux pool (two buffers of 8 rows) is engine memory
// laid out by its config; then a pool the registration describes, whose later registrations
// must repeat the first.

#include <catch2/catch.hpp>

#include "core/registration_checks.hpp"

using namespace ferry;

namespace {

/// A daemon with an aux pool of two buffers (rows of 64 and 32 bytes, 8 rows) in engine memory.
ferry_config aux_daemon() {
  ferry_config cfg;
  cfg.node_name = "n";
  cfg.client_listen = "/tmp/ferry-n.sock";
  aux_pool_config a;
  a.rows = 8;
  a.row_bytes = 64;
  a.more_row_bytes = {32};
  a.memory = pool_memory::client;
  cfg.pools.aux = a;
  return cfg;
}

pool_standings client_aux() {
  pool_standings s;
  s[static_cast<int>(pool_kind::aux)].client = true;
  return s;
}

/// The table the layout asks for: both buffers in fd 0, one page apart.
proto::register_memory aux_table() {
  proto::register_memory r;
  r.pool = pool_kind::aux;
  r.fd_count = 1;
  r.buffers = {{0, 0, 64, 8, 0, 0, buffer_kind::aux}, {0, 4096, 32, 8, 0, 0, buffer_kind::aux}};
  return r;
}

template <class T>
std::string refusal(const result<T>& r) {
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::invalid_request);
  return r.message;
}

}  // namespace

TEST_CASE("registration: the pool, its standing and the memory kind come first",
          "[unit][registration_checks]") {
  const auto cfg = aux_daemon();
  const auto layout = make_layout(cfg.pools);
  auto pools = client_aux();
  auto req = aux_table();
  CHECK(check_registration_request(cfg, layout, pools, req));

  auto kv = req;
  kv.pool = pool_kind::kv;
  CHECK(refusal(check_registration_request(cfg, layout, pools, kv)) ==
        "pool kv is not configured on this daemon");

  auto daemon_memory = pools;
  daemon_memory[static_cast<int>(pool_kind::aux)].client = false;
  CHECK(refusal(check_registration_request(cfg, layout, daemon_memory, req)) ==
        "pool aux is daemon memory (pools.aux.memory: daemon); there is nothing to register");

  auto typed = req;
  typed.state = state_type::swa;
  CHECK(refusal(check_registration_request(cfg, layout, pools, typed)) ==
        "pool aux: state_type swa applies to the state pool only");

  for (auto [now, text] :
       {std::pair{client_pool_state::registering,
                  "pool aux is already registered by another "
                  "connection"},
        std::pair{client_pool_state::registered,
                  "pool aux is already registered by another "
                  "connection"},
        std::pair{client_pool_state::releasing,
                  "pool aux is still being released (the rooms and peers of its previous "
                  "registration are ending); register it again once that is done"}}) {
    auto standing = pools;
    standing[static_cast<int>(pool_kind::aux)].now = now;
    CHECK(refusal(check_registration_request(cfg, layout, standing, req)) == text);
  }

  auto dmabuf = req;
  dmabuf.kind = proto::memory_kind::cuda_dmabuf;
  CHECK_THAT(refusal(check_registration_request(cfg, layout, pools, dmabuf)),
             Catch::StartsWith("memory kind cuda_dmabuf: this ferryd's libfabric 1.17 has no "
                               "FI_MR_DMABUF"));
  auto unknown = req;
  unknown.kind = static_cast<proto::memory_kind>(9);
  CHECK(refusal(check_registration_request(cfg, layout, pools, unknown)) ==
        "memory kind 9 is unknown (0 host, 1 cuda_dmabuf, 2 cuda_ipc, 3 cuda_vmm_fd)");
}

TEST_CASE("registration: a configured pool's table must be its layout, within its descriptors",
          "[unit][registration_checks]") {
  const auto cfg = aux_daemon();
  const auto layout = make_layout(cfg.pools);
  const auto pools = client_aux();
  const auto req = aux_table();
  const auto plan = check_registration_layout(cfg, layout, pools, req, {8192});
  REQUIRE(plan);
  CHECK_FALSE(plan.value.described);  // the config describes it

  auto one = req;
  one.buffers.pop_back();
  CHECK(refusal(check_registration_layout(cfg, layout, pools, one, {8192})) ==
        "pool aux: the table lists 1 buffers, the pool has 2 (see the hello_reply's layout)");

  auto rows = req;
  rows.buffers[1].items = 9;
  CHECK(refusal(check_registration_layout(cfg, layout, pools, rows, {8192})) ==
        "pool aux: buffer 1 is aux rows with 8 items of 32 bytes, but the table says aux rows "
        "with 9 items of 32 bytes");

  auto fd = req;
  fd.buffers[1].fd_index = 1;
  CHECK(refusal(check_registration_layout(cfg, layout, pools, fd, {8192})) ==
        "pool aux: buffer 1 (aux rows with 8 items of 32 bytes) names fd 1, but 1 came with the "
        "frame");

  auto unaligned = req;
  unaligned.buffers[1].fd_offset = 4000;
  CHECK(refusal(check_registration_layout(cfg, layout, pools, unaligned, {8192})) ==
        "pool aux: buffer 1 (aux rows with 8 items of 32 bytes) starts at fd offset 4000, not a "
        "multiple of 4096");

  CHECK(refusal(check_registration_layout(cfg, layout, pools, req, {4200})) ==
        "pool aux: buffer 1 (aux rows with 8 items of 32 bytes) needs 256 bytes at fd 0 offset "
        "4096, but the fd has 4200");

  auto overlap = req;
  overlap.buffers[1].fd_offset = 0;
  CHECK(refusal(check_registration_layout(cfg, layout, pools, overlap, {8192})) ==
        "pool aux: buffers 0 and 1 overlap in fd 0");

  CHECK(refusal(check_registration_layout(cfg, layout, pools, req, {8192, 4096})) ==
        "pool aux: fd 1 came with the frame but no buffer uses it");
}

TEST_CASE("registration: a pool the registration describes is fixed by its first",
          "[unit][registration_checks]") {
  auto cfg = aux_daemon();
  cfg.pools.aux->placement.registered = true;
  cfg.pools.aux->rows = 0;
  cfg.pools.aux->row_bytes = 0;
  cfg.pools.aux->more_row_bytes.clear();
  const auto layout = make_layout(cfg.pools);
  auto pools = client_aux();
  CHECK(registered_pool(cfg, static_cast<int>(pool_kind::aux)));
  CHECK_FALSE(registered_pool(cfg, static_cast<int>(pool_kind::kv)));

  const auto req = aux_table();
  auto first = check_registration_layout(cfg, layout, pools, req, {8192});
  REQUIRE(first);
  REQUIRE(first.value.described);
  CHECK(first.value.described->section.aux->rows == 8);

  // Once made, a later registration must describe the same pool.
  pools[static_cast<int>(pool_kind::aux)].described = &*first.value.described;
  CHECK(check_registration_layout(cfg, layout, pools, req, {8192}));
  auto more_rows = req;
  for (auto& b : more_rows.buffers) b.items = 16;
  CHECK_THAT(refusal(check_registration_layout(cfg, layout, pools, more_rows, {16384})),
             Catch::StartsWith("pool aux: this registration differs from the first one: ") &&
                 Catch::EndsWith("restart ferryd to change it"));
}
