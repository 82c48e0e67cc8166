// Engine-owned memory (`memory: client`, docs/protocol.md register_memory): an engine lends
// ferryd memfds holding its KV, state and aux buffers; rooms land in them and are sent from
// them, with no shm pool and no copy. Bad registrations are refused by name and change nothing;
// a registration lasts as long as its connection, and the pool can be registered again after.

#include <fcntl.h>
#include <sys/mman.h>

#include "harness.hpp"

using namespace ferry;
using namespace ferry::test;

namespace {

/// One memfd per pool, holding every buffer at its layout offset: what an engine that carves
/// its tensors out of one allocation per pool would lend.
struct engine_pools {
  struct pool {
    int fd = -1;
    uint8_t* base = nullptr;
    uint64_t bytes = 0;
  };
  pool pools[pool_kind_count];

  /// Create (and seal against shrinking, unless `seal` is false) the memfds for `c`'s daemon.
  explicit engine_pools(const client::client& c, bool seal = true) {
    for (int k = 0; k < pool_kind_count; ++k) {
      const auto& p = c.daemon().pools[k];
      if (!p.present) continue;
      auto& m = pools[k];
      m.bytes = (p.layout.total_bytes + 4095) / 4096 * 4096;
      m.fd = memfd_create(("engine-" + std::to_string(k)).c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
      REQUIRE(m.fd >= 0);
      REQUIRE(ftruncate(m.fd, static_cast<off_t>(m.bytes)) == 0);
      if (seal) REQUIRE(fcntl(m.fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
      void* at = mmap(nullptr, m.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
      REQUIRE(at != MAP_FAILED);
      m.base = static_cast<uint8_t*>(at);
    }
  }
  ~engine_pools() {
    for (auto& m : pools) {
      if (m.base) munmap(m.base, m.bytes);
      if (m.fd >= 0) close(m.fd);
    }
  }
  engine_pools(const engine_pools&) = delete;
  engine_pools& operator=(const engine_pools&) = delete;

  /// The table of pool `k` as the daemon's layout lists it, every buffer in fd 0.
  static proto::register_memory table(const client::client& c, pool_kind k) {
    proto::register_memory r;
    r.pool = k;
    for (const auto& b : c.daemon().pools[static_cast<int>(k)].layout.buffers)
      r.buffers.push_back({0, b.offset, b.item_bytes, b.items, b.layer_id, b.tensor, b.kind});
    return r;
  }

  /// Register every pool with `c` and let `c`'s helpers reach the memory.
  void lend(client::client& c) {
    for (int k = 0; k < pool_kind_count; ++k) {
      if (pools[k].fd < 0) continue;
      auto ok = c.register_memory(table(c, static_cast<pool_kind>(k)), {pools[k].fd});
      INFO(ok.message);
      REQUIRE(ok);
      c.attach_pool(static_cast<pool_kind>(k), pools[k].base);
    }
  }
};

shape client_shape() {
  shape s;
  s.client_memory = true;
  s.pages = 512;
  return s;
}

/// register_memory's refusal text (the call must fail).
std::string refusal(client::client& c, const proto::register_memory& r,
                    const std::vector<int>& fds) {
  auto res = c.register_memory(r, fds);
  REQUIRE_FALSE(res);
  CHECK(res.code == errc::invalid_request);
  return res.message;
}

}  // namespace

TEST_CASE(
    "engine memory: rooms go from the prefill engine's memfds to the decode engine's, "
    "byte-exact, with no shm pool",
    "[e2e][memory]") {
  temp_dir dir;
  const auto s = client_shape();
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  auto p = prefill.connect();
  auto d = decode.connect();
  for (auto* c : {p.get(), d.get()})
    for (const auto& pool : c->daemon().pools) {
      CHECK(pool.present);
      CHECK(pool.shm_name.empty());  // the client's memory, not a daemon shm object
    }
  CHECK(shm_names("/ferry.decode-0.").empty());
  CHECK(shm_names("/ferry.prefill-0.").empty());
  engine_pools pe(*p), de(*d);
  pe.lend(*p);
  de.lend(*d);
  for (uint64_t i = 0; i < 4; ++i) {
    room_spec r;
    r.room = 40 + i;
    r.src_pages = range(static_cast<uint32_t>(i * 64), 64);
    r.dst_pages = range(static_cast<uint32_t>(300 - i * 64), 64);
    r.chunks = {40, 24};
    r.src_slot = static_cast<uint32_t>(i), r.dst_slot = static_cast<uint32_t>(7 - i);
    r.src_row = static_cast<uint32_t>(i), r.dst_row = static_cast<uint32_t>(9 + i);
    run_and_verify(*p, *d, prefill.control(), r);
  }
  // The bytes are in the decode engine's own memfd, where its kernels would read them.
  const auto& kv = d->daemon().pools[0].layout.buffers[0];
  CHECK(d->item(pool_kind::kv, 0, 300) == de.pools[0].base + kv.offset + 300 * kv.item_bytes);
}

TEST_CASE("engine memory: rooms are refused until the pools are registered, naming the pool",
          "[e2e][memory]") {
  temp_dir dir;
  const auto s = client_shape();
  daemon_proc decode(dir, "decode-0", "decode", s);
  auto d = decode.connect();
  auto refused = d->prepare({5, {"127.0.0.1:9"}, {1, 2}, 1, 1});
  CHECK_FALSE(refused);
  CHECK(refused.message == "room 5: pool kv is client memory and no client has registered it");
  engine_pools e(*d);
  REQUIRE(d->register_memory(engine_pools::table(*d, pool_kind::kv), {e.pools[0].fd}));
  refused = d->prepare({5, {"127.0.0.1:9"}, {1, 2}, 1, 1});
  CHECK(refused.message == "room 5: pool state is client memory and no client has registered it");
}

TEST_CASE("engine memory: bad registrations are refused by name and change nothing",
          "[e2e][memory]") {
  temp_dir dir;
  auto s = client_shape();
  daemon_proc decode(dir, "decode-0", "decode", s);
  auto d = decode.connect();
  engine_pools e(*d);
  const auto kv = engine_pools::table(*d, pool_kind::kv);
  const int fd = e.pools[0].fd;

  auto wrong = kv;
  wrong.buffers[3].item_bytes *= 2;
  CHECK(refusal(*d, wrong, {fd}) ==
        "pool kv: buffer 3 is K of layer 15 with 512 items of 1024 bytes, but the table says K "
        "of layer 15 with 512 items of 2048 bytes");
  auto fewer = kv;
  fewer.buffers.pop_back();
  CHECK(refusal(*d, fewer, {fd}) ==
        "pool kv: the table lists 7 buffers, the pool has 8 (see the hello_reply's layout)");
  auto unaligned = kv;
  unaligned.buffers[1].fd_offset += 100;
  CHECK_THAT(
      refusal(*d, unaligned, {fd}),
      Catch::EndsWith("starts at fd offset " + std::to_string(unaligned.buffers[1].fd_offset) +
                      ", not a multiple of 4096"));
  // A memfd too small for its buffers.
  engine_pools small(*d, false);
  REQUIRE(ftruncate(small.pools[0].fd, 4096) == 0);
  REQUIRE(fcntl(small.pools[0].fd, F_ADD_SEALS, F_SEAL_SHRINK) == 0);
  CHECK_THAT(refusal(*d, kv, {small.pools[0].fd}),
             Catch::StartsWith("pool kv: buffer 0 (K of layer 3 with 512 items of 1024 bytes) "
                               "needs 524288 bytes at fd 0 offset 0, but the fd has 4096"));
  // Not sealed: the engine could shrink it under ferryd's mapping.
  engine_pools unsealed(*d, false);
  CHECK(refusal(*d, kv, {unsealed.pools[0].fd}) ==
        "pool kv: fd 0 is not sealed against shrinking (F_SEAL_SHRINK): a shrink would crash "
        "ferryd");
  // Not a memfd at all.
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  CHECK(refusal(*d, kv, {pipefd[0]}) == "pool kv: fd 0 is a pipe, not a memfd");
  close(pipefd[0]);
  close(pipefd[1]);
  // A buffer naming a descriptor that did not come.
  auto beyond = kv;
  beyond.buffers[2].fd_index = 1;
  CHECK_THAT(refusal(*d, beyond, {fd}), Catch::EndsWith("names fd 1, but 1 came with the frame"));
  // Two buffers over the same bytes.
  auto overlap = kv;
  overlap.buffers[1].fd_offset = overlap.buffers[0].fd_offset;
  CHECK(refusal(*d, overlap, {fd}) == "pool kv: buffers 0 and 1 overlap in fd 0");
  // GPU kinds: nothing pretends to support them.
  auto gpu = kv;
  gpu.kind = proto::memory_kind::cuda_dmabuf;
  CHECK(refusal(*d, gpu, {fd}) ==
        "memory kind cuda_dmabuf: this ferryd's libfabric 1.17 has no FI_MR_DMABUF (it needs "
        "1.20), and this build has no CUDA (docs/gpu.md)");

  // None of that changed anything: the good table registers, once.
  REQUIRE(d->register_memory(kv, {fd}));
  auto other = decode.connect();
  CHECK(refusal(*other, kv, {fd}) == "pool kv is already registered by another connection");

  // A pool the config keeps as daemon memory.
  temp_dir dir2;
  shape plain;
  daemon_proc daemon_owned(dir2, "decode-1", "decode", plain);
  auto c = daemon_owned.connect();
  engine_pools e2(*c);
  CHECK(refusal(*c, engine_pools::table(*c, pool_kind::kv), {e2.pools[0].fd}) ==
        "pool kv is daemon memory (pools.kv.memory: daemon); there is nothing to register");
  // The daemon serves on.
  CHECK(status_of(*d)["role"] == "decode");
}

TEST_CASE(
    "engine memory: when the registering connection closes, its rooms are cancelled, "
    "its peers fenced, and the pool can be registered again",
    "[e2e][memory]") {
  temp_dir dir;
  const auto s = client_shape();
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  auto p = prefill.connect();
  engine_pools pe(*p);
  pe.lend(*p);
  auto watcher = decode.connect();  // a second connection of the decode engine, for polls
  {
    auto d = decode.connect();
    engine_pools de(*d);
    de.lend(*d);
    room_spec first;
    first.room = 60;
    first.src_pages = range(0, 16);
    first.dst_pages = range(16, 16);
    first.chunks = {16};
    run_and_verify(*p, *d, prefill.control(), first);
    // A room that waits for its chunks when the engine goes away.
    REQUIRE(d->prepare({61, {prefill.control()}, range(100, 8), 3, 3}));
    wait_status(*d, 61, room_status::waiting_for_input);
  }  // the engine's connection closes; its memfds are unmapped and closed here too
  auto gone = wait_done(*watcher, 61);
  CHECK(gone.status == room_status::failed);
  CHECK(gone.reason == "cancelled: the connection that registered pool kv closed");
  CHECK(gone.code == errc::cancelled);

  // The engine comes back with new memory: the registration is accepted once the old one is
  // released (bounded retries; each refusal says why).
  auto d = decode.connect();
  engine_pools de(*d);
  const auto until = std::chrono::steady_clock::now() + 30s;
  for (int k = 0; k < pool_kind_count; ++k) {
    for (;;) {
      auto ok =
          d->register_memory(engine_pools::table(*d, static_cast<pool_kind>(k)), {de.pools[k].fd});
      if (ok) break;
      INFO(ok.message);
      REQUIRE_THAT(ok.message, Catch::Contains("is still being released"));
      REQUIRE(std::chrono::steady_clock::now() < until);
      std::this_thread::yield();
    }
    d->attach_pool(static_cast<pool_kind>(k), de.pools[k].base);
  }
  room_spec next;
  next.room = 62;
  next.src_pages = range(0, 32);
  next.dst_pages = range(100, 32);
  next.chunks = {32};
  run_and_verify(*p, *d, prefill.control(), next);
}

TEST_CASE(
    "engine memory: descriptors are credited to their register_memory frame even when one "
    "read also brings the tail of an earlier frame",
    "[e2e][memory]") {
  // A read stops right after the message carrying descriptors but may begin with the rest of
  // an earlier frame: here a hello sent in two pieces, then the register_memory frame with its
  // fd in one sendmsg, all before the daemon reads.
  temp_dir dir;
  const auto s = client_shape();
  daemon_proc decode(dir, "decode-0", "decode", s);
  auto d = decode.connect();
  engine_pools e(*d);
  auto table = engine_pools::table(*d, pool_kind::kv);
  table.fd_count = 1;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, decode.socket().c_str(), sizeof(a.sun_path) - 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  const auto hello = proto::encode(proto::hello{4, "split", true, 3}, 1, 4);
  REQUIRE(::send(fd, hello.data(), 5, MSG_NOSIGNAL) == 5);
  REQUIRE(::send(fd, hello.data() + 5, hello.size() - 5, MSG_NOSIGNAL) ==
          static_cast<ssize_t>(hello.size() - 5));
  const auto frame = proto::encode(table, 2, 4);
  iovec iov{const_cast<uint8_t*>(frame.data()), frame.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* h = CMSG_FIRSTHDR(&msg);
  h->cmsg_level = SOL_SOCKET;
  h->cmsg_type = SCM_RIGHTS;
  h->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(h), &e.pools[0].fd, sizeof(int));
  REQUIRE(sendmsg(fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(frame.size()));
  proto::frame_reader r;
  std::vector<proto::decoded> got;
  uint8_t buf[65536];
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (got.size() < 2 && std::chrono::steady_clock::now() < until) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    auto n = recv(fd, buf, sizeof buf, 0);
    REQUIRE(n > 0);
    r.feed(std::span<const uint8_t>(buf, static_cast<size_t>(n)));
    while (auto f = r.next()) got.push_back(*f);
  }
  close(fd);
  REQUIRE(got.size() == 2);
  REQUIRE(got[1].msg);
  CHECK(got[1].seq == 2);
  auto* err = std::get_if<proto::error>(&*got[1].msg);
  INFO((err ? err->message : std::string()));
  CHECK(std::holds_alternative<proto::ok>(*got[1].msg));
}

TEST_CASE("engine memory: an engine that outlives a ferryd restart lends the same memory again",
          "[e2e][memory]") {
  temp_dir dir;
  const auto s = client_shape();
  daemon_proc prefill(launch_only, dir, "prefill-0", "prefill", s);
  daemon_proc decode(launch_only, dir, "decode-0", "decode", s);
  await_ready(prefill, decode);
  auto p = prefill.connect();
  engine_pools pe(*p);
  pe.lend(*p);
  std::unique_ptr<engine_pools> de;
  {
    auto d = decode.connect();
    de = std::make_unique<engine_pools>(*d);
    de->lend(*d);
    room_spec r;
    r.room = 70;
    r.src_pages = range(0, 16);
    r.dst_pages = range(0, 16);
    r.chunks = {16};
    run_and_verify(*p, *d, prefill.control(), r);
    decode.signal(SIGKILL);  // the daemon dies under the engine
  }
  decode.restart();
  // The same memfds, lent to the new ferryd.
  auto d = decode.connect();
  de->lend(*d);
  room_spec r;
  r.room = 71;
  r.src_pages = range(16, 16);
  r.dst_pages = range(0, 16);
  r.chunks = {16};
  // The prefill may still hold its connection to the killed instance; a room that fails for
  // that (the restart is noticed) is retried once, as an engine would.
  stage(*p, *d, r);
  for (int attempt = 0;; ++attempt) {
    REQUIRE(attempt < 3);
    prepare(*d, prefill.control(), r);
    send_rest(*p, r, 0);
    auto de_ev = wait_done(*d, r.room);
    auto pe_ev = wait_done(*p, r.room);
    if (de_ev.status == room_status::success && pe_ev.status == room_status::success) break;
    INFO(de_ev.reason << " / " << pe_ev.reason);
    REQUIRE(attempt == 0);
  }
  CHECK(client::verify_room(*d, r.room, r.dst_pages, r.dst_slot, r.dst_row).message == "");
}
