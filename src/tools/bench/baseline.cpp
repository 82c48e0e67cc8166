#include "tools/bench/baseline.hpp"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "tools/bench/raw_fabric.hpp"

namespace ferry::bench {
namespace {

void* map_buffer(uint64_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE,
                 -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

}  // namespace

baseline_result run_baseline(const std::string& provider, const std::vector<planned_write>& request,
                             uint32_t concurrency, uint32_t waves, uint32_t window, bool paced,
                             uint32_t warmup_waves) {
  baseline_result out;
  uint64_t per_request = 0;
  for (const auto& w : request) per_request += w.length;
  const uint64_t region = per_request * concurrency;
  std::vector<raw_write> writes;
  if (paced) warmup_waves = 0;  // paced: timed from the start
  writes.reserve(request.size() * concurrency * (waves + warmup_waves));
  // Untimed waves first (raw_options::warmup_writes): Ferry's pools are touched by earlier
  // rooms, and so must the reference's buffers be.
  for (uint32_t w = 0; w < waves + warmup_waves; ++w)
    for (uint32_t c = 0; c < concurrency; ++c) {
      uint64_t off = c * per_request;
      for (const auto& x : request) {
        writes.push_back({off, off, x.length});
        off += x.length;
      }
    }
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
    out.error = std::string("socketpair: ") + std::strerror(errno);
    return out;
  }
  raw_options opts;
  opts.provider = provider;
  opts.timeout_ms = 120000;
  if (paced) {
    opts.room_writes = static_cast<uint32_t>(request.size());
    opts.rooms_in_flight = concurrency;
  } else {
    opts.warmup_writes = request.size() * concurrency * warmup_waves;
  }
  pid_t pid = fork();
  if (pid < 0) {
    out.error = std::string("fork: ") + std::strerror(errno);
    return out;
  }
  if (pid == 0) {
    close(sv[0]);
    void* buf = map_buffer(region);
    auto r = raw_target(opts, sv[1], buf, region, false);
    _exit(r.error.empty() ? 0 : 1);
  }
  close(sv[1]);
  void* src = map_buffer(region);
  if (src) std::memset(src, 0x5a, region);
  auto r = raw_initiator(opts, sv[0], src, region, writes, window);
  close(sv[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (src) munmap(src, region);
  out.error = r.error;
  out.seconds = r.seconds;
  out.bytes = r.bytes;
  out.provider = r.provider;
  out.gbps = r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0;
  return out;
}

}  // namespace ferry::bench
