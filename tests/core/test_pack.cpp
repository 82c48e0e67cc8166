// Packing small runs through staging (core/pack.hpp): the planner's decision on both sides, the
// gathered and scattered layouts, and a byte-for-byte comparison with the direct plan.

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>

#include "core/geometry.hpp"
#include "core/pack.hpp"
#include "core/plan.hpp"

using namespace ferry;
using Catch::Matchers::Contains;

namespace {

/// Qwen3-Next-like KV only: 2 layers (K and V: 4 buffers), 2 heads × 256 × bf16 = 1 KiB per
/// token and buffer.
pools_config kv_only(uint64_t pages = 512, uint32_t page_tokens = 1, uint32_t heads = 2,
                     uint32_t total_heads = 0) {
  pools_config c;
  c.kv = kv_pool_config{{3, 7}, page_tokens, heads, 256, 2, false, pages};
  c.kv->total_heads = total_heads;
  return c;
}

link_plan same_link(const pools_config& c) {
  rank_schema s{c};
  return make_link_plan(s, s).value;
}

constexpr uint64_t KiB = 1024;

kv_options gather(uint64_t threshold = 32 * KiB, uint64_t slice = 4 << 20) {
  kv_options o;
  o.threshold = threshold;
  o.slice_bytes = slice;
  return o;
}

/// Every byte of one daemon's memory spaces a plan touches.
struct memory {
  std::vector<uint8_t> kv, staging;
  std::vector<uint8_t>& operator[](space s) { return s == space::staging ? staging : kv; }
};

void copy_into(memory& to_mem, space to, uint64_t to_off, memory& from_mem, space from,
               uint64_t from_off, uint64_t len) {
  auto& dst = to_mem[to];
  auto& src = from_mem[from];
  REQUIRE(from_off + len <= src.size());
  REQUIRE(to_off + len <= dst.size());
  std::memcpy(dst.data() + to_off, src.data() + from_off, len);
}

/// The prefill's copies into its staging, then every write into the decode.
void execute(memory& pre, memory& dec, const std::vector<planned_copy>& copies,
             const std::vector<planned_write>& writes) {
  for (const auto& c : copies)
    copy_into(pre, c.to, c.to_offset, pre, c.from, c.from_offset, c.length);
  for (const auto& w : writes)
    copy_into(dec, w.dst, w.dst_offset, pre, w.src, w.src_offset, w.length);
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  // Eight bytes per draw: one draw per byte made this file's slowest test in the unoptimised
  // sanitized build.
  for (size_t at = 0; at < n; at += 8) {
    const uint64_t x = rng();
    std::memcpy(v.data() + at, &x, std::min<size_t>(8, n - at));
  }
  return v;
}

/// A page list of `n` pages from `pool` in runs of 1..3, shuffled.
std::vector<uint32_t> fragmented(uint32_t pool, uint32_t n, std::mt19937_64& rng) {
  std::vector<std::vector<uint32_t>> blocks;
  for (uint32_t p = 0; p < pool;) {
    const uint32_t len = std::min<uint32_t>(1 + rng() % 3, pool - p);
    std::vector<uint32_t> b;
    for (uint32_t i = 0; i < len; ++i) b.push_back(p + i);
    blocks.push_back(b);
    p += len;
  }
  std::shuffle(blocks.begin(), blocks.end(), rng);
  std::vector<uint32_t> out;
  for (const auto& b : blocks) out.insert(out.end(), b.begin(), b.end());
  out.resize(n);
  return out;
}

}  // namespace

TEST_CASE("small runs whose destinations follow each other are gathered into one write",
          "[unit][pack]") {
  const auto cfg = kv_only();
  const auto lay = make_layout(cfg);
  const auto link = same_link(cfg);
  const auto& bufs = lay[pool_kind::kv].buffers;
  REQUIRE(bufs.size() == 4);
  const std::vector<uint32_t> src{10, 11, 20, 30, 31, 32, 40};
  const std::vector<uint32_t> dst{0, 1, 2, 3, 4, 5, 6};
  auto plan = plan_kv(link, lay, lay, coalesce_runs(src, dst), gather());
  CHECK(plan.writes.empty());
  REQUIRE(plan.jobs.size() == 4 * 4);  // 4 runs, buffer by buffer
  // Buffer 1's first run: pages 10..11, two pages of 1 KiB, to destination pages 0..1.
  CHECK(plan.jobs[4] ==
        pack_job{bufs[1].offset + 10 * KiB, bufs[1].offset, 2, 1 * KiB, 1 * KiB, space::kv});
  CHECK(plan.jobs[7] == pack_job{bufs[1].offset + 40 * KiB, bufs[1].offset + 6 * KiB, 1, 1 * KiB,
                                 1 * KiB, space::kv});
  const auto& d = plan.decision;
  CHECK(d.runs == 4);
  CHECK(d.packed_runs == 4);
  CHECK(d.packed_bytes == 4 * 7 * KiB);
  CHECK(d.packed_writes == 4);
  CHECK(d.direct_writes == 0);
  CHECK(d.describe() ==
        "whole-pages to the decode's pages: 4 runs of 1.8 KiB per buffer on average; 4 gathered "
        "through staging (28.0 KiB copied) into 4 writes, 0 direct (threshold 32768 B; one write "
        "per run would be 16)");

  std::vector<planned_copy> copies;
  std::vector<planned_write> writes;
  expand_pack_jobs(plan.jobs, 4096, copies, writes);
  CHECK(copies.size() == 16);  // one per run and buffer: the pages of a run are contiguous
  REQUIRE(writes.size() == 4);
  for (size_t i = 0; i < 4; ++i)
    CHECK(writes[i] ==
          planned_write{space::staging, space::kv, 4096 + i * 7 * KiB, bufs[i].offset, 7 * KiB});
}

TEST_CASE("the planner packs only what saves more writes than it copies", "[unit][pack]") {
  const auto cfg = kv_only();
  const auto lay = make_layout(cfg);
  const auto link = same_link(cfg);

  SECTION("a run of at least the threshold goes direct and splits the group around it") {
    std::vector<uint32_t> src, dst;
    for (uint32_t i = 0; i < 40; ++i) src.push_back(i);  // 40 KiB per buffer
    for (uint32_t p : {100u, 200u, 300u}) src.push_back(p);
    for (uint32_t i = 0; i < src.size(); ++i) dst.push_back(i);
    auto plan = plan_kv(link, lay, lay, coalesce_runs(src, dst), gather());
    CHECK(plan.writes.size() == 4);    // the large run, one per buffer
    CHECK(plan.jobs.size() == 3 * 4);  // the three small ones
    CHECK(plan.decision.packed_runs == 3);
    CHECK(plan.decision.direct_writes == 4);
    CHECK(plan.decision.packed_writes == 4);
  }
  SECTION("runs whose destinations do not follow each other stay one write each") {
    const std::vector<uint32_t> src{10, 20, 30}, dst{5, 9, 13};
    auto plan = plan_kv(link, lay, lay, coalesce_runs(src, dst), gather());
    CHECK(plan.jobs.empty());
    CHECK(plan.writes.size() == 3 * 4);
    CHECK(plan.decision.packed_runs == 0);
  }
  SECTION("two runs of 3 KiB are not worth a 6 KiB copy at a threshold of 4 KiB") {
    const std::vector<uint32_t> src{10, 11, 12, 20, 21, 22}, dst{0, 1, 2, 3, 4, 5};
    auto plan = plan_kv(link, lay, lay, coalesce_runs(src, dst), gather(4 * KiB));
    CHECK(plan.jobs.empty());
    CHECK(plan.writes.size() == 2 * 4);
    SECTION("but three runs of 1 KiB are") {
      const std::vector<uint32_t> s{10, 20, 30}, d{0, 1, 2};
      auto p = plan_kv(link, lay, lay, coalesce_runs(s, d), gather(4 * KiB));
      CHECK(p.writes.empty());
      CHECK(p.decision.packed_runs == 3);
    }
  }
  SECTION("threshold 0 or no staging at the prefill: one write per run, as before") {
    const std::vector<uint32_t> src{10, 20, 30}, dst{0, 1, 2};
    for (auto o : {gather(0), gather(32 * KiB, 0)}) {
      auto plan = plan_kv(link, lay, lay, coalesce_runs(src, dst), o);
      CHECK(plan.jobs.empty());
      CHECK(plan.writes.size() == 3 * 4);
      std::vector<planned_write> direct;
      std::vector<planned_copy> none;
      plan_kv_chunk(link, lay, lay, coalesce_runs(src, dst), {}, none, direct);
      CHECK(plan.writes == direct);
    }
  }
  SECTION("jobs are cut to the slice, and slices make their own writes") {
    std::vector<uint32_t> src, dst;
    for (uint32_t i = 0; i < 6; ++i) src.push_back(10 * i), src.push_back(10 * i + 1);
    for (uint32_t i = 0; i < src.size(); ++i) dst.push_back(i);
    auto plan = plan_kv(link, lay, lay, coalesce_runs(src, dst), gather(32 * KiB, 3 * KiB));
    REQUIRE(plan.decision.packed_runs == 6);
    CHECK(plan.decision.packed_writes == 4 * 4);  // 12 KiB per buffer in slices of 3 KiB
    for (const auto& j : plan.jobs) CHECK(j.bytes() <= 3 * KiB);
  }
}

TEST_CASE("into the decode's landing block the destination is contiguous by position",
          "[unit][pack]") {
  const auto cfg = kv_only();
  const auto lay = make_layout(cfg);
  const auto link = same_link(cfg);
  // A chunk at positions 3..5 of a 10-page room; the decode's pages are scattered but land in
  // its block [buffer][position][page].
  const std::vector<uint32_t> src{10, 11, 20}, dst{50, 40, 41};
  auto o = gather();
  o.dst_staging = 1000;
  o.room_pages = 10;
  auto plan = plan_kv(link, lay, lay, coalesce_runs(src, dst, 3), o);
  CHECK(plan.decision.dst_staged);
  CHECK(plan.decision.runs == 2);  // only the source breaks: 10..11, then 20
  std::vector<planned_copy> copies;
  std::vector<planned_write> writes;
  expand_pack_jobs(plan.jobs, 0, copies, writes);
  REQUIRE(writes.size() == 4);
  for (uint64_t i = 0; i < 4; ++i)
    CHECK(writes[i] == planned_write{space::staging, space::staging, i * 3 * KiB,
                                     1000 + (i * 10 + 3) * KiB, 3 * KiB});
  SECTION("without gathering, source runs go straight into the block") {
    o.threshold = 0;
    auto direct = plan_kv(link, lay, lay, coalesce_runs(src, dst, 3), o);
    REQUIRE(direct.writes.size() == 2 * 4);
    CHECK(direct.writes[0] == planned_write{space::kv, space::staging,
                                            lay[pool_kind::kv].buffers[0].offset + 10 * KiB,
                                            1000 + 3 * KiB, 2 * KiB});
  }
}

TEST_CASE("head-sliced KV is always gathered, and without staging it goes token by token",
          "[unit][pack]") {
  // TP 1 -> 2 with 2 heads: decode rank 1 holds head 1, a 512-byte slice of the 1 KiB row.
  const auto p = kv_only(512, 16, 2, 2), d = kv_only(512, 16, 1, 2);
  const auto link = make_link_plan({p, 1, 0}, {d, 2, 1}).value;
  REQUIRE(link.kv == kv_mode::pack);
  const auto pl = make_layout(p), dl = make_layout(d);
  const std::vector<uint32_t> src{4, 9}, dst{7, 8};  // destination pages follow each other
  auto plan = plan_kv(link, pl, dl, coalesce_runs(src, dst), gather(0));
  CHECK(plan.writes.empty());
  CHECK(plan.decision.packed_runs == 2);
  REQUIRE(plan.jobs.size() == 2 * 4);
  CHECK(plan.jobs[0] == pack_job{pl[pool_kind::kv].buffers[0].offset + 4 * 16 * KiB + 512,
                                 dl[pool_kind::kv].buffers[0].offset + 7 * 8 * KiB, 16, 512, KiB,
                                 space::kv});
  std::vector<planned_copy> copies;
  std::vector<planned_write> writes;
  expand_pack_jobs(plan.jobs, 0, copies, writes);
  CHECK(copies.size() == 2 * 4 * 16);  // one per token
  CHECK(writes.size() == 4);           // both runs of a buffer in one write
  // What the Sender copies: one strided copy per job, over its tokens.
  std::vector<strided_copy> strided;
  writes.clear();
  expand_pack_jobs(plan.jobs, 0, strided, writes);
  REQUIRE(strided.size() == 2 * 4);
  CHECK(strided[0] == strided_copy{space::kv, space::staging,
                                   pl[pool_kind::kv].buffers[0].offset + 4 * 16 * KiB + 512, 0, 512,
                                   16, KiB, 512});
  CHECK(writes.size() == 4);
  SECTION("no staging at the prefill") {
    auto per_token = plan_kv(link, pl, dl, coalesce_runs(src, dst), gather(0, 0));
    CHECK(per_token.decision.per_token);
    CHECK(per_token.jobs.empty());
    CHECK(per_token.writes.size() == 2 * 16 * 4);
  }
}

TEST_CASE("the decode lands a fragmented list in staging when the copy is cheaper",
          "[unit][pack]") {
  const auto cfg = kv_only();
  const auto link = same_link(cfg);
  std::vector<uint32_t> contiguous, scattered;
  for (uint32_t i = 0; i < 64; ++i) contiguous.push_back(100 + i), scattered.push_back(3 * i);
  CHECK(plan_landing(link, contiguous, 32 * KiB, 64 << 20).bytes == 0);
  auto l = plan_landing(link, scattered, 32 * KiB, 64 << 20);
  CHECK(l.scatter);
  CHECK(l.runs == 64);
  CHECK(l.bytes == 4 * 64 * KiB);
  CHECK(l.describe() ==
        "64 runs over 64 pages (1.0 KiB per buffer on average): lands in 256.0 KiB of staging "
        "and is scattered on commit");
  SECTION("not when the block would take more than half of the staging area") {
    CHECK(plan_landing(link, scattered, 32 * KiB, 500 * KiB).bytes == 0);
    CHECK(plan_landing(link, scattered, 32 * KiB, 0).bytes == 0);
  }
  SECTION("not when runs are large enough or packing is off") {
    const auto big = kv_only(512, 64);  // 64 KiB pages
    CHECK(plan_landing(same_link(big), scattered, 32 * KiB, 1ull << 30).bytes == 0);
    CHECK(plan_landing(link, scattered, 0, 64 << 20).bytes == 0);
  }
  SECTION("head-sliced KV to unpack always lands in staging") {
    const auto p = kv_only(512, 1, 1, 2), d = kv_only(512, 1, 2, 2);
    const auto gl = make_link_plan({p, 2, 1}, {d, 1, 0}).value;
    REQUIRE(gl.kv == kv_mode::unpack);
    CHECK(plan_landing(gl, contiguous, 0, 0).bytes == gl.unpack_staging_bytes(64));
  }
}

TEST_CASE("the decode scatters its landing block one run of consecutive pages at a time",
          "[unit][pack]") {
  const auto cfg = kv_only();
  const auto lay = make_layout(cfg);
  const auto& bufs = lay[pool_kind::kv].buffers;
  const std::vector<uint32_t> dst{5, 6, 7, 20, 9};
  std::vector<planned_copy> out;
  plan_unpack(same_link(cfg), lay, dst, 512, out);
  REQUIRE(out.size() == 3 * 4);
  CHECK(out[0] == planned_copy{space::staging, space::kv, 512, bufs[0].offset + 5 * KiB, 3 * KiB});
  CHECK(out[1] ==
        planned_copy{space::staging, space::kv, 512 + 3 * KiB, bufs[0].offset + 20 * KiB, KiB});
  CHECK(out[4] == planned_copy{space::staging, space::kv, 512 + 5 * KiB + 3 * KiB,
                               bufs[1].offset + 20 * KiB, KiB});
}

TEST_CASE("the decode unpacks head-sliced rows as one strided copy per buffer and run of pages",
          "[unit][pack]") {
  // Rank 1 of a TP 2 prefill holds head 1 of 2: its 512-byte slices land packed in staging and
  // go a 1024-byte row apart in the decode's pages.
  const auto p = kv_only(512, 4, 1, 2), d = kv_only(512, 4, 2, 2);
  const auto link = make_link_plan({p, 2, 1}, {d, 1, 0}).value;
  REQUIRE(link.kv == kv_mode::unpack);
  const auto lay = make_layout(d);
  const auto& bufs = lay[pool_kind::kv].buffers;
  const std::vector<uint32_t> dst{5, 6, 7, 20, 9};
  std::vector<strided_copy> out;
  plan_unpack(link, lay, dst, 512, out);
  REQUIRE(out.size() == 3 * 4);  // pages 5-7, 20 and 9 for each of 4 buffers
  CHECK(out[0] == strided_copy{space::staging, space::kv, 512, bufs[0].offset + 5 * 4 * KiB + 512,
                               512, 12, 512, KiB});
  CHECK(out[1] == strided_copy{space::staging, space::kv, 512 + 12 * 512,
                               bufs[0].offset + 20 * 4 * KiB + 512, 512, 4, 512, KiB});
  // The same copies one by one, in the same order.
  std::vector<planned_copy> rows;
  plan_unpack(link, lay, dst, 512, rows);
  REQUIRE(rows.size() == 5 * 4 * 4);
  std::vector<planned_copy> expanded;
  for (const auto& c : out)
    for (uint64_t i = 0; i < c.count; ++i) expanded.push_back(c.at(i));
  CHECK(expanded == rows);
  CHECK(rows[12] == planned_copy{space::staging, space::kv, 512 + 12 * 512,
                                 bufs[0].offset + 20 * 4 * KiB + 512, 512});
}

TEST_CASE("gathered and scattered bytes land where the direct plan puts them", "[unit][pack]") {
  for (uint32_t page_tokens : {1u, 16u})
    for (uint64_t threshold : {uint64_t{0}, 4 * KiB, 32 * KiB, uint64_t{1} << 30})
      for (uint64_t seed : {1u, 2u, 3u}) {
        CAPTURE(page_tokens, threshold, seed);
        const auto cfg = kv_only(256, page_tokens);
        const auto lay = make_layout(cfg);
        const auto link = same_link(cfg);
        std::mt19937_64 rng(seed);
        const uint32_t pages = 100;
        const auto src = fragmented(256, pages, rng);
        // Seed 3: a contiguous destination, so only the prefill gathers.
        std::vector<uint32_t> dst;
        if (seed == 3)
          for (uint32_t i = 0; i < pages; ++i) dst.push_back(40 + i);
        else
          dst = fragmented(256, pages, rng);
        const uint64_t kv_bytes = lay[pool_kind::kv].total_bytes;

        // The reference: one write per run, straight into the pages.
        memory pre{random_bytes(kv_bytes, seed), {}};
        memory want{random_bytes(kv_bytes, seed + 100), {}};
        {
          std::vector<planned_copy> none;
          std::vector<planned_write> w;
          plan_kv_chunk(link, lay, lay, coalesce_runs(src, dst), {}, none, w);
          execute(pre, want, none, w);
        }

        // The packed path, in three chunks: the decode's landing decision, the prefill's plan
        // per chunk and its slices, then the scatter on commit.
        const uint64_t capacity = 64 << 20;
        const auto land = plan_landing(link, dst, threshold, capacity);
        memory dec{random_bytes(kv_bytes, seed + 100), random_bytes(land.bytes + 128, seed + 7)};
        const auto staging_before = dec.staging;
        const uint64_t at = 64;
        pre.staging.assign(8 << 20, 0);
        const uint64_t slice = 3 * KiB * page_tokens;  // several slices per buffer
        for (uint32_t first : {0u, 33u, 70u}) {
          const uint32_t end = first == 0 ? 33 : first == 33 ? 70 : pages;
          kv_options o;
          if (land.bytes) o.dst_staging = at;
          o.room_pages = pages;
          o.slice_bytes = slice;
          o.threshold = threshold;
          auto plan = plan_kv(link, lay, lay,
                              coalesce_runs(std::span(src).subspan(first, end - first),
                                            std::span(dst).subspan(first, end - first), first),
                              o);
          std::vector<planned_copy> none;
          execute(pre, dec, none, plan.writes);
          uint64_t cursor = 0;
          for (size_t a = 0; a < plan.jobs.size();) {
            size_t b = a;
            uint64_t n = 0;
            while (b < plan.jobs.size() && (b == a || n + plan.jobs[b].bytes() <= slice))
              n += plan.jobs[b++].bytes();
            std::vector<planned_copy> copies;
            std::vector<planned_write> writes;
            expand_pack_jobs(std::span(plan.jobs).subspan(a, b - a), cursor, copies, writes);
            CHECK(writes.size() <= b - a);
            execute(pre, dec, copies, writes);
            cursor += n;
            a = b;
          }
        }
        if (land.bytes) {
          std::vector<planned_copy> scatter;
          plan_unpack(link, lay, dst, at, scatter);
          for (const auto& c : scatter)
            copy_into(dec, c.to, c.to_offset, dec, c.from, c.from_offset, c.length);
          // Nothing outside the block was touched.
          CHECK(std::equal(dec.staging.begin(), dec.staging.begin() + at, staging_before.begin()));
          CHECK(std::equal(dec.staging.begin() + at + land.bytes, dec.staging.end(),
                           staging_before.begin() + at + land.bytes));
        }
        CHECK(dec.kv == want.kv);  // every page, and every byte around them
      }
}

TEST_CASE("a write merges only with one whose staging and destination it continues",
          "[unit][pack]") {
  std::vector<planned_copy> copies;
  std::vector<planned_write> writes{{space::kv, space::kv, 0, 100, 64}};  // a direct write
  const std::vector<pack_job> jobs{
      {1000, 164, 1, 64, 64, space::kv},      // continues the direct write's destination only
      {2000, 228, 2, 32, 100, space::kv},     // continues the previous one: merged
      {3000, 400, 1, 64, 64, space::kv},      // a gap in the destination
      {4000, 464, 1, 64, 64, space::staging}  // another space
  };
  expand_pack_jobs(jobs, 0, copies, writes);
  REQUIRE(writes.size() == 4);
  CHECK(writes[1] == planned_write{space::staging, space::kv, 0, 164, 128});
  CHECK(writes[2] == planned_write{space::staging, space::kv, 128, 400, 64});
  CHECK(writes[3] == planned_write{space::staging, space::staging, 192, 464, 64});
  CHECK(copies.size() == 5);  // the strided job copies piece by piece
  CHECK(copies[2] == planned_copy{space::kv, space::staging, 2100, 96, 32});
}
