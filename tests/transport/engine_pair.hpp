#pragma once
/// The rig of the engine tests (test_engine.cpp, test_engine_processes.cpp): one test body per
/// provider, and an initiator and a target engine in this process with a buffer each.

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "harness.hpp"
#include "transport/engine.hpp"

namespace ferry::test {

/// Register one test body for each provider, as separate test cases so a missing provider skips
/// only its own case.
#define FERRY_FABRIC_CASE(title, body)                                  \
  TEST_CASE("fabric " title " (tcp)", "[fabric][tcp]") { body("tcp"); } \
  TEST_CASE("fabric " title " (shm)", "[fabric][shm]") { body("shm"); }

/// An initiator and a target engine in this process, with registered buffers and the target
/// inserted as the initiator's peer.
struct engine_pair {
  engine_pair(const std::string& provider, size_t bytes, uint32_t max_inflight = 64)
      : src(bytes), dst(bytes, 0) {
    require_provider(provider);
    fill_pattern(src, 7);
    initiator = open_engine(provider, max_inflight);
    target = open_engine(provider);
    src_region = must(initiator->register_region(src.data(), src.size()));
    auto d = target->register_region(dst.data(), dst.size());
    INFO(d.message);
    REQUIRE(d);
    dst_desc = target->describe(d.value);
    REQUIRE(dst_desc.length == dst.size());
    peer = must(initiator->insert_peer(target->local_address()));
  }
  void start_both() {
    imms.attach(target.get());
    target->start(imms.callback());
    initiator->start(nullptr);
  }
  transport::write_op op(uint64_t src_off, uint64_t dst_off, uint64_t len, uint64_t imm) const {
    return {src_region, src_off, len, dst_desc.remote_base + dst_off, dst_desc.key, imm};
  }
  bool same_bytes(uint64_t src_off, uint64_t dst_off, uint64_t len) const {
    return std::memcmp(src.data() + src_off, dst.data() + dst_off, len) == 0;
  }

  std::vector<uint8_t> src, dst;
  imm_collector imms;
  // Declared after the buffers: closed before them.
  std::unique_ptr<transport::engine> initiator, target;
  transport::region_id src_region = 0;
  transport::region_desc dst_desc;
  transport::peer_handle peer = 0;
};

}  // namespace ferry::test
