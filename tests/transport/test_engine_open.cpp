// What opening a transport::engine reports: a missing provider, a bad config, and shm without
// cross-memory attach refused by name; the provider in use; and libfabric's return codes mapped
// onto Ferry's error vocabulary.
#include "harness.hpp"
#include "transport/engine.hpp"
#include "transport/fabric_handles.hpp"

using namespace ferry::transport;
using ferry::errc;
using namespace ferry::test;

TEST_CASE("fabric engine names a missing provider", "[fabric]") {
  engine_config cfg;
  cfg.provider = "nope";
  auto r = engine::open(cfg);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::fabric_unavailable);
  CHECK_THAT(r.message, Catch::StartsWith("fabric provider 'nope' is not available on this machine "
                                          "(fi_getinfo: "));
  CHECK(r.value == nullptr);
}

TEST_CASE("fabric engine rejects max_inflight_writes of zero", "[fabric]") {
  engine_config cfg;
  cfg.max_inflight_writes = 0;
  auto r = engine::open(cfg);
  REQUIRE_FALSE(r);
  CHECK(r.code == errc::config_invalid);
  CHECK_THAT(r.message, Catch::Contains("max_inflight_writes"));
}

TEST_CASE("libfabric codes map onto the error vocabulary", "[fabric][errors]") {
  // What a caller can act on has its own code, whichever sign the provider reports it with.
  for (long long rc : {-FI_ENODATA, FI_ENOSYS, -FI_EOPNOTSUPP, -FI_ENODEV})
    CHECK(errc_of_fi(rc, errc::fabric_error) == errc::fabric_unavailable);
  for (long long rc : {-FI_ECONNREFUSED, FI_ECONNRESET, -FI_ECONNABORTED, -FI_ENOTCONN,
                       -FI_EHOSTUNREACH, -FI_ENETUNREACH, -FI_ESHUTDOWN})
    CHECK(errc_of_fi(rc, errc::fabric_write_failed) == errc::peer_lost);
  CHECK(errc_of_fi(-FI_ETIMEDOUT, errc::fabric_error) == errc::timed_out);
  CHECK(errc_of_fi(FI_ECANCELED, errc::fabric_error) == errc::cancelled);
  CHECK(errc_of_fi(-FI_ENOMEM, errc::fabric_error) == errc::system_error);
  // Anything else is the call's own failure.
  CHECK(errc_of_fi(-FI_EINVAL, errc::fabric_error) == errc::fabric_error);
  CHECK(errc_of_fi(FI_EIO, errc::fabric_write_failed) == errc::fabric_write_failed);
  const auto e = fi_error("fi_mr_reg", -FI_EINVAL, errc::fabric_error);
  CHECK(e.code == errc::fabric_error);
  CHECK(e.message == std::string("fi_mr_reg: ") + fi_strerror(FI_EINVAL) + " (-22)");
}

TEST_CASE("fabric engine reports the provider in use (tcp resolves to rxm)", "[fabric][tcp]") {
  require_provider("tcp");
  auto e = open_engine("tcp");
  CHECK_THAT(e->provider_name(), Catch::StartsWith("tcp"));
  CHECK_FALSE(e->local_address().empty());
}

// The engine sends small shm writes with delivery completion, which needs cross-memory attach
// (why: the rejected small writes of test_fencing.cpp).
TEST_CASE("fabric engine refuses shm without cross-memory attach, naming why", "[fabric][shm]") {
  require_provider("shm");
  ::setenv("FI_SHM_DISABLE_CMA", "1", 1);
  engine_config cfg;
  cfg.provider = "shm";
  auto r = engine::open(cfg);
  ::unsetenv("FI_SHM_DISABLE_CMA");
  REQUIRE_FALSE(r);
  CHECK_THAT(r.message, Catch::StartsWith("fabric provider 'shm' needs cross-memory attach "
                                          "(process_vm_writev), and FI_SHM_DISABLE_CMA=1 is set"));
}
