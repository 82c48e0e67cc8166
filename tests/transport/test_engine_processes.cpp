// transport::engine writing into a target engine of another process (a forked child) over real
// libfabric on loopback, for tcp and shm: the bytes and the counted immediates the child reports.
#include <sys/wait.h>

#include <csignal>

#include "engine_pair.hpp"
#include "harness.hpp"
#include "transport/engine.hpp"

using namespace ferry::transport;
using namespace ferry::test;

namespace {

constexpr uint64_t fork_region = 8 << 20;
constexpr uint64_t fork_writes = 300;

/// Child side: an engine used only as a write target, reporting what arrived.
[[noreturn]] void fork_target_child(const std::string& provider, int fd) {
  auto fail = [fd](const std::string& text) {
    std::string frame = "E" + text;
    send_frame(fd, frame.data(), static_cast<uint32_t>(frame.size()));
    ::_exit(1);
  };
  engine_config cfg;
  cfg.provider = provider;
  auto opened = engine::open(cfg);
  if (!opened) fail(opened.message);
  auto& eng = *opened.value;
  std::vector<uint8_t> region(fork_region, 0);
  auto reg = eng.register_region(region.data(), region.size());
  if (!reg) fail(reg.message);
  imm_collector imms;
  imms.attach(&eng);
  eng.start(imms.callback());

  const region_desc desc = eng.describe(reg.value);
  const std::vector<uint8_t> addr = eng.local_address();
  std::vector<uint8_t> hello(1 + sizeof desc + addr.size());
  hello[0] = 'A';
  std::memcpy(hello.data() + 1, &desc, sizeof desc);
  std::memcpy(hello.data() + 1 + sizeof desc, addr.data(), addr.size());
  send_frame(fd, hello.data(), static_cast<uint32_t>(hello.size()));

  if (!imms.wait_total(fork_writes)) fail("timed out waiting for immediates");
  std::vector<uint8_t> report(1 + 8);
  report[0] = 'R';
  const uint64_t sum = fnv1a(region.data(), region.size());
  std::memcpy(report.data() + 1, &sum, 8);
  for (const auto& [imm, n] : imms.counts()) {
    const uint64_t pair[2] = {imm, n};
    report.insert(report.end(), reinterpret_cast<const uint8_t*>(pair),
                  reinterpret_cast<const uint8_t*>(pair) + sizeof pair);
  }
  send_frame(fd, report.data(), static_cast<uint32_t>(report.size()));
  std::vector<uint8_t> bye;
  recv_frame(fd, bye);  // keep the endpoint up until the parent is done with it
  eng.stop();
  // _exit skips destructors: close the endpoint first, or shm leaves its /dev/shm region behind.
  opened.value.reset();
  ::_exit(0);
}

void two_processes(const std::string& provider) {
  require_provider(provider);
  auto reap = fork_child([&](int fd) { fork_target_child(provider, fd); });
  const pid_t child = reap.pid;
  const int fd = reap.fd;

  std::vector<uint8_t> frame;
  REQUIRE(recv_frame(fd, frame));
  REQUIRE(!frame.empty());
  if (frame[0] == 'E') FAIL("child: " << std::string(frame.begin() + 1, frame.end()));
  REQUIRE(frame[0] == 'A');
  region_desc desc;
  std::memcpy(&desc, frame.data() + 1, sizeof desc);
  const std::vector<uint8_t> addr(frame.begin() + 1 + sizeof desc, frame.end());
  REQUIRE(desc.length == fork_region);

  batch_waiter done;  // outlives the engine's callbacks
  auto eng = open_engine(provider, 32);
  std::vector<uint8_t> src(fork_region);
  fill_pattern(src, 3);
  auto reg = eng->register_region(src.data(), src.size());
  REQUIRE(reg);
  auto peer = eng->insert_peer(addr);
  INFO(peer.message);
  REQUIRE(peer);
  eng->start(nullptr);

  // The expected target image: zeros plus the written ranges.
  std::vector<uint8_t> expected(fork_region, 0);
  std::map<uint64_t, uint64_t> expected_imms;
  const uint64_t sizes[] = {64, 4096, 20000, 65536};
  uint64_t off = 0;
  for (int b = 0; b < 3; ++b) {  // three requests, each its own imm
    write_batch batch;
    batch.peer = peer.value;
    for (uint64_t i = 0; i < fork_writes / 3; ++i) {
      const uint64_t len = sizes[i % 4];
      batch.ops.push_back(
          write_op{reg.value, off, len, desc.remote_base + off, desc.key, 77 + uint64_t(b)});
      std::memcpy(expected.data() + off, src.data() + off, len);
      off += len + 8;
    }
    expected_imms[77 + b] = fork_writes / 3;
    batch.done = done.callback();
    eng->submit(std::move(batch));
  }
  REQUIRE(off <= fork_region);
  REQUIRE(done.wait(3));
  for (const auto& r : done.results()) {
    INFO(r.message);
    CHECK(r.ok());
    CHECK(r.completed == fork_writes / 3);
  }

  REQUIRE(recv_frame(fd, frame));
  if (frame[0] == 'E') FAIL("child: " << std::string(frame.begin() + 1, frame.end()));
  REQUIRE(frame[0] == 'R');
  uint64_t sum = 0;
  std::memcpy(&sum, frame.data() + 1, 8);
  std::map<uint64_t, uint64_t> imms;
  for (size_t at = 9; at + 16 <= frame.size(); at += 16) {
    uint64_t pair[2];
    std::memcpy(pair, frame.data() + at, 16);
    imms[pair[0]] = pair[1];
  }
  CHECK(sum == fnv1a(expected.data(), expected.size()));
  CHECK(imms == expected_imms);

  eng->stop();
  const char bye = 'B';
  send_frame(fd, &bye, 1);
  REQUIRE(wait_eof(fd));
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  reap.pid = -1;
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}
FERRY_FABRIC_CASE("engine writes into a separate target process", two_processes)

}  // namespace
