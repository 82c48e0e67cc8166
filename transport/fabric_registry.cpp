// Memory registrations: each gets its own remote key (random and never reused where the
// application chooses keys), so closing it fences exactly the peers holding that key.
#include <rdma/fi_domain.h>
#include <sys/random.h>

#include <cerrno>
#include <random>

#include "transport/fabric_engine.hpp"

namespace ferry::transport::detail {
namespace {

/// Attempts at finding a key the provider accepts (a random 64-bit key practically never
/// collides; a provider with a 1- or 2-byte key space can run out).
constexpr int key_attempts = 64;

}  // namespace

uint64_t random_u64() {
  uint64_t v = 0;
  for (int tries = 0; tries < 8; ++tries) {
    const ssize_t n = ::getrandom(&v, sizeof v, 0);
    if (n == static_cast<ssize_t>(sizeof v)) return v;
    if (n < 0 && errno != EINTR) break;
  }
  // getrandom unavailable (ENOSYS in an old sandbox): random_device reads the same pool.
  static std::mutex m;
  static std::random_device rd;
  std::lock_guard<std::mutex> lock(m);
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

result<region_id> fabric_engine::register_region(void* base, uint64_t length,
                                                 region_access access) {
  return run_exclusive<result<region_id>>(
      [this, base, length, access] { return do_register_region(base, length, access); });
}

result<uint64_t> fabric_engine::choose_key() const {
  result<uint64_t> out;
  for (int i = 0; i < key_attempts; ++i) {
    const uint64_t key = random_u64() & key_mask_;
    // 0 is what an unset key looks like; FI_KEY_NOTAVAIL is reserved.
    if (key == 0 || key == FI_KEY_NOTAVAIL || issued_keys_.count(key) != 0) continue;
    out.value = key;
    return out;
  }
  return error{errc::fabric_error,
               "register_region: no unused memory key after " + std::to_string(key_attempts) +
                   " random draws (key space of " + std::to_string(key_mask_) + ", " +
                   std::to_string(issued_keys_.size()) + " keys issued)"};
}

result<region_id> fabric_engine::register_region_keyed(void* base, uint64_t length,
                                                       region_access access, uint64_t key) {
  return run_exclusive<result<region_id>>(
      [this, base, length, access, key] { return do_register_region(base, length, access, key); });
}

result<region_id> fabric_engine::do_register_region(void* base, uint64_t length,
                                                    region_access access,
                                                    std::optional<uint64_t> chosen) {
  result<region_id> out;
  if (base == nullptr || length == 0) {
    return error{errc::invalid_request, "register_region: expected a non-empty region, got base=" +
                                            std::to_string(reinterpret_cast<uintptr_t>(base)) +
                                            " length=" + std::to_string(length)};
  }
  // Least privilege: FI_WRITE lets the region be the source of our writes (FI_READ the sink of
  // reads, kept for providers that check it on local descriptors); only a remote_write region
  // accepts peers' writes. No FI_REMOTE_READ: the engine issues no reads. (tcp;ofi_rxm and shm
  // on 1.17 enforce exactly these bits: see tests/transport/test_fencing.cpp.)
  uint64_t flags = FI_WRITE | FI_READ;
  if (access == region_access::remote_write) flags |= FI_REMOTE_WRITE;
  const bool prov_key = (mr_mode_ & FI_MR_PROV_KEY) != 0;
  if (chosen &&
      (prov_key || *chosen == 0 || (*chosen & ~key_mask_) != 0 || issued_keys_.count(*chosen) != 0))
    return error{errc::fabric_error,
                 "register_region: key " + std::to_string(*chosen) + " cannot be used on rail " +
                     label_ + (prov_key ? " (the provider issues keys)" : " (issued or too wide)")};

  fid_mr* raw = nullptr;
  int rc = 0;
  for (int attempt = 0;; ++attempt) {
    // Without FI_MR_PROV_KEY the application chooses keys, unique per domain: random ones, so
    // a peer cannot guess the key of a registration it was not given.
    uint64_t requested_key = chosen.value_or(0);
    if (!prov_key && !chosen) {
      auto key = choose_key();
      if (!key) {
        log_->error("{}", key.message);
        return std::move(key).error();
      }
      requested_key = key.value;
    }
    raw = nullptr;
    rc = fi_mr_reg(domain_.get(), base, length, flags, 0, requested_key, 0, &raw, nullptr);
    // -FI_ENOKEY: the key is taken in this domain (not by us): draw another.
    if (rc == -FI_ENOKEY && !prov_key && !chosen && attempt + 1 < key_attempts) continue;
    break;
  }
  if (rc != 0) {
    out = error{errc_of_fi(rc, errc::fabric_error),
                fi_error_text("fi_mr_reg", rc) + " (length " + std::to_string(length) + ")"};
    log_->error("{}", out.message);
    return out;
  }
  region r;
  r.mr.reset(raw);
  if (mr_mode_ & FI_MR_ENDPOINT) {
    if ((rc = fi_mr_bind(r.mr.get(), &ep_->fid, 0)) != 0) {
      out = fi_error("fi_mr_bind", rc, errc::fabric_error);
      log_->error("{}", out.message);
      return out;
    }
    if ((rc = fi_mr_enable(r.mr.get())) != 0) {
      out = fi_error("fi_mr_enable", rc, errc::fabric_error);
      log_->error("{}", out.message);
      return out;
    }
  }
  const uint64_t key = fi_mr_key(r.mr.get());
  if (key == FI_KEY_NOTAVAIL) {
    out = error{errc::fabric_unavailable,
                "fi_mr_key: key not available (provider needs FI_MR_RAW, unsupported)"};
    log_->error("{}", out.message);
    return out;
  }
  if (prov_key && issued_keys_.count(key) != 0) {
    // The provider recycled the key of a closed registration: a fenced peer holding the old
    // key could write into this one. Nothing in the contract lets us prevent it here.
    log_->warn("provider {} reissued memory key {:#x} of a closed registration", provider_, key);
  }
  issued_keys_.insert(key);
  r.base = base;
  r.length = length;
  r.desc = (mr_mode_ & FI_MR_LOCAL) ? fi_mr_desc(r.mr.get()) : nullptr;
  r.remote.remote_base = (mr_mode_ & FI_MR_VIRT_ADDR) ? reinterpret_cast<uint64_t>(base) : 0;
  r.remote.key = key;
  r.remote.length = length;

  std::lock_guard<std::mutex> lock(regions_mutex_);
  out.value = static_cast<region_id>(regions_.size());
  regions_.push_back(std::move(r));
  log_->debug("registered region={} length={} access={} key={:#x}", out.value, length,
              access == region_access::remote_write ? "remote_write" : "local", key);
  return out;
}

void fabric_engine::register_regions(std::vector<region_request> regions,
                                     std::function<void(result<std::vector<region_id>>)> done) {
  run_queued([this, regions = std::move(regions), done = std::move(done)]() mutable {
    do_register_regions(regions, {}, done);
  });
}

void fabric_engine::register_regions_keyed(
    std::vector<region_request> regions, std::vector<uint64_t> keys,
    std::function<void(result<std::vector<region_id>>)> done) {
  run_queued([this, regions = std::move(regions), keys = std::move(keys),
              done = std::move(done)]() mutable { do_register_regions(regions, keys, done); });
}

void fabric_engine::do_register_regions(const std::vector<region_request>& regions,
                                        const std::vector<uint64_t>& keys,
                                        std::function<void(result<std::vector<region_id>>)>& done) {
  result<std::vector<region_id>> out;
  for (size_t i = 0; i < regions.size(); ++i) {
    const auto& q = regions[i];
    auto r = do_register_region(q.base, q.length, q.access,
                                i < keys.size() ? std::optional<uint64_t>(keys[i]) : std::nullopt);
    if (!r) {
      // Undo what this call made; a failure to close is logged where it happens.
      for (auto id : out.value) (void)do_deregister_region(id);
      out = std::move(r).error();
      break;
    }
    out.value.push_back(r.value);
  }
  invoke_callback(*log_, "register_regions", done, std::move(out));
}

result<bool> fabric_engine::deregister_region(region_id id) {
  return run_exclusive<result<bool>>([this, id] { return do_deregister_region(id); });
}

result<bool> fabric_engine::do_deregister_region(region_id id) {
  result<bool> out;
  if (id >= regions_.size()) {
    const error unknown{errc::invalid_request, "deregister_region: unknown region " +
                                                   std::to_string(id) + " (never registered)"};
    log_->warn("{}", unknown.message);
    return unknown;
  }
  region& r = regions_[id];
  if (r.deregistered) {
    log_->warn("deregister_region: region {} is already deregistered; ignored", id);
    out.value = false;
    return out;
  }
  {
    std::lock_guard<std::mutex> lock(regions_mutex_);
    r.deregistered = true;
    r.remote = region_desc{};
  }
  out.value = true;
  // Posted writes from this region hold its local descriptor where the provider needs one;
  // closing the MR under them is undefined. Without FI_MR_LOCAL the provider reads the memory
  // directly and the MR only admits remote writes: close it now, which is the fence.
  if ((mr_mode_ & FI_MR_LOCAL) != 0 && r.posted > 0) {
    log_->debug("deregistered region={}; MR closes after its {} posted writes complete", id,
                r.posted);
    return out;
  }
  if (auto closed = close_region_mr(id); !closed) return std::move(closed).error();
  return out;
}

result<> fabric_engine::close_region_mr(region_id id) {
  region& r = regions_[id];
  if (!r.mr) return {};
  fid_mr* mr = r.mr.release();
  const int rc = fi_close(&mr->fid);
  if (rc != 0) {
    // The provider still knows the key: writes with it keep landing. Loud, and surfaced.
    const error why{errc_of_fi(rc, errc::fabric_error),
                    fi_error_text("fi_close(mr)", rc) + " (region " + std::to_string(id) +
                        "): the registration stays open in the provider"};
    log_->error("{}", why.message);
    return why;
  }
  log_->debug("deregistered region={} (MR closed)", id);
  return {};
}

region_desc fabric_engine::describe(region_id id) const {
  std::lock_guard<std::mutex> lock(regions_mutex_);
  if (id >= regions_.size()) return {};
  return regions_[id].remote;  // zeroed on deregistration
}

}  // namespace ferry::transport::detail
