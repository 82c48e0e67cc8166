// An engine's smallest use of the installed C++ client (tests/install/run.sh): connect to a
// prefill and a decode ferryd, move one room (KV pages, one Mamba state slot, one aux row)
// and check every destination byte. Only <ferry/...> headers of the install prefix are used.
//
// Usage: ferry_install_probe PREFILL_SOCKET DECODE_SOCKET PREFILL_CONTROL
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ferry/client.hpp>
#include <string>
#include <vector>

namespace {

using ferry::pool_kind;
using ferry::client::client;

constexpr uint64_t room = 7;
const std::vector<uint32_t> src_pages{0, 1, 2, 5, 6};
const std::vector<uint32_t> dst_pages{40, 41, 30, 31, 12};
constexpr uint32_t src_slot = 1, dst_slot = 2, src_row = 3, dst_row = 4;

int fail(const std::string& what) {
  std::fprintf(stderr, "ferry_install_probe: %s\n", what.c_str());
  return 1;
}

/// The byte at `offset` of request position `position` of buffer `buffer` in pool `k`.
uint8_t expected(pool_kind k, size_t buffer, size_t position, uint64_t offset) {
  uint64_t x = (room << 40) ^ (uint64_t{static_cast<uint8_t>(k)} << 32) ^ (buffer << 16) ^
               (position << 8) ^ offset;
  x ^= x >> 29;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 32;
  return static_cast<uint8_t>(x);
}

/// Every buffer's item `items[position]` of pool `k`, for each position.
template <class F>
bool for_each_item(const client& c, pool_kind k, const std::vector<uint32_t>& items, F&& f) {
  const auto& pool = c.daemon().pools[static_cast<int>(k)];
  if (!pool.present) return true;
  for (size_t b = 0; b < pool.layout.buffers.size(); ++b)
    for (size_t pos = 0; pos < items.size(); ++pos) {
      uint8_t* p = c.item(k, b, items[pos]);
      if (!p) return false;
      if (!f(b, pos, p, pool.layout.buffers[b].item_bytes)) return false;
    }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return fail("usage: ferry_install_probe PREFILL_SOCKET DECODE_SOCKET CONTROL");
  auto p = client::connect(argv[1], "install-probe-prefill");
  if (!p) return fail(std::string("prefill: ") + p.message);
  auto d = client::connect(argv[2], "install-probe-decode");
  if (!d) return fail(std::string("decode: ") + d.message);
  for (auto* c : {&p, &d})
    if (auto m = c->value->map_pools(); !m) return fail("map_pools: " + m.message);

  // The prefill engine writes its sources; the decode's destination starts zeroed, so a match
  // proves the bytes were moved.
  const std::vector<uint32_t> src_slots{src_slot}, dst_slots{dst_slot};
  const std::vector<uint32_t> src_rows{src_row}, dst_rows{dst_row};
  auto fill = [](pool_kind k) {
    return [k](size_t b, size_t pos, uint8_t* item, uint64_t bytes) {
      for (uint64_t i = 0; i < bytes; ++i) item[i] = expected(k, b, pos, i);
      return true;
    };
  };
  auto zero = [](size_t, size_t, uint8_t* item, uint64_t bytes) {
    std::memset(item, 0, bytes);
    return true;
  };
  if (!for_each_item(*p.value, pool_kind::kv, src_pages, fill(pool_kind::kv)) ||
      !for_each_item(*p.value, pool_kind::state, src_slots, fill(pool_kind::state)) ||
      !for_each_item(*p.value, pool_kind::aux, src_rows, fill(pool_kind::aux)) ||
      !for_each_item(*d.value, pool_kind::kv, dst_pages, zero) ||
      !for_each_item(*d.value, pool_kind::state, dst_slots, zero) ||
      !for_each_item(*d.value, pool_kind::aux, dst_rows, zero))
    return fail("an item is outside the daemons' pools");
  // An aux row starts with its room id (ferryd checks it on send).
  std::memcpy(p.value->item(pool_kind::aux, 0, src_row), &room, sizeof room);

  ferry::proto::prepare prep;
  prep.room = room;
  prep.prefill_peers = {argv[3]};
  prep.dst_pages = dst_pages;
  prep.state_slot = dst_slot;
  prep.aux_row = dst_row;
  if (auto r = d.value->prepare(prep); !r) return fail("prepare: " + r.message);
  if (auto s = d.value->subscribe(room); !s) return fail("subscribe: " + s.message);
  ferry::proto::send snd;
  snd.room = room;
  snd.src_pages = src_pages;
  snd.last = true;
  snd.state_slot = src_slot;
  snd.aux_row = src_row;
  if (auto r = p.value->send(snd); !r) return fail("send: " + r.message);
  auto ev = d.value->wait_terminal(room, std::chrono::seconds(60));
  if (!ev) return fail("wait: " + ev.message);
  if (ev.value.status != ferry::room_status::success)
    return fail(std::string("room ended ") + ferry::to_string(ev.value.status) + ": " +
                ev.value.reason);

  uint64_t checked = 0;
  std::string mismatch;
  auto check = [&](pool_kind k) {
    return [&, k](size_t b, size_t pos, uint8_t* item, uint64_t bytes) {
      for (uint64_t i = 0; i < bytes; ++i) {
        uint8_t want = expected(k, b, pos, i);
        if (k == pool_kind::aux && i < sizeof room)
          want = reinterpret_cast<const uint8_t*>(&room)[i];
        if (item[i] != want) {
          mismatch = std::string("pool ") + ferry::to_string(k) + " buffer " + std::to_string(b) +
                     " position " + std::to_string(pos) + " byte " + std::to_string(i) + ": got " +
                     std::to_string(item[i]) + ", expected " + std::to_string(want);
          return false;
        }
      }
      checked += bytes;
      return true;
    };
  };
  if (!for_each_item(*d.value, pool_kind::kv, dst_pages, check(pool_kind::kv)) ||
      !for_each_item(*d.value, pool_kind::state, dst_slots, check(pool_kind::state)) ||
      !for_each_item(*d.value, pool_kind::aux, dst_rows, check(pool_kind::aux)))
    return fail("destination differs: " + mismatch);
  std::printf("ferry_install_probe: room %llu moved, %llu destination bytes verified\n",
              static_cast<unsigned long long>(room), static_cast<unsigned long long>(checked));
  return checked ? 0 : fail("nothing was checked (the daemons have no pools?)");
}
