// The daemon's Prometheus metrics (actors/metrics.hpp): prometheus-cpp's registry for what the
// actors count, and families built at each scrape for what is read then.

#include "actors/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <map>
#include <mutex>
#include <sstream>

namespace ferry {

const char* to_string(latency_phase p) {
  switch (p) {
    case latency_phase::bootstrapping:
      return "bootstrapping";
    case latency_phase::waiting:
      return "waiting";
    case latency_phase::transferring:
      return "transferring";
    case latency_phase::commit:
      return "commit";
  }
  return "?";
}

namespace {

using prometheus::Counter;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::MetricFamily;
using prometheus::MetricType;

const char* side_name(bool decode) { return decode ? "decode" : "prefill"; }

/// 100 µs to 60 s, about three buckets a decade: a small room's phases take well under a
/// millisecond on shm, a large room's transfer seconds.
Histogram::BucketBoundaries phase_buckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30,    60};
}

int64_t steady_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

MetricFamily family(std::string name, std::string help, MetricType type) {
  return MetricFamily{std::move(name), std::move(help), type, {}};
}

void add(MetricFamily& f, std::vector<prometheus::ClientMetric::Label> labels, double value) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (f.type == MetricType::Counter)
    m.counter.value = value;
  else
    m.gauge.value = value;
  f.metric.push_back(std::move(m));
}

}  // namespace

struct daemon_metrics::impl {
  prometheus::Registry registry;
  prometheus::Family<Counter>& rooms = prometheus::BuildCounter()
                                           .Name("ferry_rooms_total")
                                           .Help(
                                               "Rooms that reached a terminal state, by side, "
                                               "outcome and error code")
                                           .Register(registry);
  prometheus::Family<Counter>& room_bytes =
      prometheus::BuildCounter()
          .Name("ferry_room_bytes_total")
          .Help("Bytes of rooms that reached Success, by side")
          .Register(registry);
  prometheus::Family<Histogram>& phases =
      prometheus::BuildHistogram()
          .Name("ferry_room_phase_seconds")
          .Help(
              "Time rooms spent in each phase: bootstrapping, waiting (for the engine's "
              "input), transferring, commit (last write completed, or the totals announced, "
              "to Success)")
          .Register(registry);
  prometheus::Family<Counter>& writes =
      prometheus::BuildCounter()
          .Name("ferry_writes_total")
          .Help(
              "One-sided writes: posted and completed (prefill), failed, skipped (never "
              "posted: their room failed), landed (decode)")
          .Register(registry);
  prometheus::Family<Counter>& write_bytes = prometheus::BuildCounter()
                                                 .Name("ferry_write_bytes_total")
                                                 .Help(
                                                     "Bytes of one-sided writes posted and "
                                                     "completed (prefill)")
                                                 .Register(registry);
  prometheus::Family<Gauge>& in_flight = prometheus::BuildGauge()
                                             .Name("ferry_writes_in_flight")
                                             .Help("Writes posted and not yet completed")
                                             .Register(registry);
  prometheus::Family<Gauge>& in_flight_bytes =
      prometheus::BuildGauge()
          .Name("ferry_writes_in_flight_bytes")
          .Help("Bytes of the writes posted and not yet completed")
          .Register(registry);
  prometheus::Family<Counter>& peer_events =
      prometheus::BuildCounter()
          .Name("ferry_peer_events_total")
          .Help("Peer connections lost (heartbeat, closed, failed) and fenced, by peer node")
          .Register(registry);
  prometheus::Family<Counter>& peer_auth =
      prometheus::BuildCounter()
          .Name("ferry_peer_auth_total")
          .Help("Peer handshakes authenticated, by the cluster secret file the peer proved")
          .Register(registry);
  prometheus::Family<Counter>& verified_rooms =
      prometheus::BuildCounter()
          .Name("ferry_verified_rooms_total")
          .Help(
              "Rooms checked end to end (integrity.checksums, or a prepare's checksum) whose "
              "landed bytes digest as the prefill's did (decode)")
          .Register(registry);
  prometheus::Family<Gauge>& info = prometheus::BuildGauge()
                                        .Name("ferry_info")
                                        .Help("This daemon: node, instance_id, role, provider")
                                        .Register(registry);

  // Resolved once: the write path only adds to an atomic.
  Counter& posted = writes.Add({{"event", "posted"}});
  Counter& completed = writes.Add({{"event", "completed"}});
  Counter& failed = writes.Add({{"event", "failed"}});
  Counter& skipped = writes.Add({{"event", "skipped"}});
  Counter& landed = writes.Add({{"event", "landed"}});
  Counter& verified = verified_rooms.Add({});
  Counter& bytes_posted = write_bytes.Add({{"event", "posted"}});
  Counter& bytes_completed = write_bytes.Add({{"event", "completed"}});
  Gauge& writes_in_flight = in_flight.Add({});
  Gauge& bytes_in_flight = in_flight_bytes.Add({});
  std::array<std::array<Histogram*, latency_phase_count>, 2> phase{};
  std::array<Counter*, 2> side_bytes{};
  std::array<Counter*, 2> successes{};  // the common room end: no label lookup per room

  std::function<int64_t()> clock;  // steady, ms

  /// A peer's event counters, kept while any connection of it is ready and for
  /// departed_peer_retention_ms after it was last seen (ready, or an event).
  struct peer_series {
    Counter* lost = nullptr;
    Counter* fenced = nullptr;
    Counter* drained = nullptr;
    int64_t seen_ms = 0;
  };
  mutable std::mutex peers_mutex;
  std::vector<std::weak_ptr<peer_health>> peers;  // the Connections own them
  std::map<std::string, peer_series> peer_counters;

  /// `peer`'s counters, made at 0 the first time (so its first loss is an increase): under
  /// peers_mutex.
  peer_series& counters_of(const std::string& peer) {
    auto& p = peer_counters[peer];
    if (!p.lost) {
      p.lost = &peer_events.Add({{"peer", peer}, {"event", "lost"}});
      p.fenced = &peer_events.Add({{"peer", peer}, {"event", "fenced"}});
      p.drained = &peer_events.Add({{"peer", peer}, {"event", "drained"}});
    }
    p.seen_ms = clock();
    return p;
  }

  /// Each ready peer's heartbeat age (the youngest, when an old and a new connection of one
  /// node are both ready), and the counters of peers gone longer than the retention removed:
  /// under peers_mutex.
  std::map<std::string, double> heartbeat_ages() {
    const int64_t now = clock();
    std::map<std::string, double> ages;
    std::erase_if(peers, [](const auto& w) { return w.expired(); });
    for (const auto& w : peers)
      if (auto h = w.lock()) {
        const double age = static_cast<double>(now - h->last_heard_ms.load()) / 1000.0;
        auto [it, fresh] = ages.emplace(h->peer, age);
        if (!fresh) it->second = std::min(it->second, age);
      }
    for (auto it = peer_counters.begin(); it != peer_counters.end();) {
      if (ages.count(it->first)) it->second.seen_ms = now;
      if (now - it->second.seen_ms < departed_peer_retention_ms) {
        ++it;
        continue;
      }
      peer_events.Remove(it->second.lost);
      peer_events.Remove(it->second.fenced);
      peer_events.Remove(it->second.drained);
      it = peer_counters.erase(it);
    }
    return ages;
  }

  impl() {
    for (int d = 0; d < 2; ++d) {
      side_bytes[d] = &room_bytes.Add({{"side", side_name(d)}});
      successes[d] = &rooms.Add(
          {{"side", side_name(d)}, {"outcome", "success"}, {"code", to_string(errc::ok)}});
      for (int p = 0; p < latency_phase_count; ++p)
        phase[d][p] = &phases.Add(
            {{"side", side_name(d)}, {"phase", to_string(static_cast<latency_phase>(p))}},
            phase_buckets());
    }
  }
};

daemon_metrics::daemon_metrics(std::string node, std::string instance_id, std::string role,
                               std::string provider, std::function<int64_t()> clock_ms)
    : impl_(std::make_unique<impl>()) {
  impl_->clock = clock_ms ? std::move(clock_ms) : std::function<int64_t()>(steady_ms);
  // Not `instance`: Prometheus sets that label to the scrape target and renames ours.
  impl_->info
      .Add({{"node", std::move(node)},
            {"instance_id", std::move(instance_id)},
            {"role", std::move(role)},
            {"provider", std::move(provider)}})
      .Set(1);
}

daemon_metrics::~daemon_metrics() = default;

void daemon_metrics::room_ended(bool decode, room_status s, errc code, uint64_t bytes) {
  if (s == room_status::success) {
    impl_->successes[decode]->Increment();
    impl_->side_bytes[decode]->Increment(static_cast<double>(bytes));
    return;
  }
  impl_->rooms.Add({{"side", side_name(decode)}, {"outcome", "failed"}, {"code", to_string(code)}})
      .Increment();
}

void daemon_metrics::phase(bool decode, latency_phase p, double seconds) {
  impl_->phase[decode][static_cast<int>(p)]->Observe(seconds);
}

void daemon_metrics::writes_posted(uint64_t writes, uint64_t bytes) {
  impl_->posted.Increment(static_cast<double>(writes));
  impl_->bytes_posted.Increment(static_cast<double>(bytes));
  impl_->writes_in_flight.Increment(static_cast<double>(writes));
  impl_->bytes_in_flight.Increment(static_cast<double>(bytes));
}

void daemon_metrics::writes_completed(uint64_t completed, uint64_t failed, uint64_t skipped,
                                      uint64_t bytes) {
  impl_->completed.Increment(static_cast<double>(completed));
  if (failed) impl_->failed.Increment(static_cast<double>(failed));
  if (skipped) impl_->skipped.Increment(static_cast<double>(skipped));
  if (!failed && !skipped) impl_->bytes_completed.Increment(static_cast<double>(bytes));
  impl_->writes_in_flight.Decrement(static_cast<double>(completed + failed + skipped));
  impl_->bytes_in_flight.Decrement(static_cast<double>(bytes));
}

void daemon_metrics::writes_landed(uint64_t count) {
  impl_->landed.Increment(static_cast<double>(count));
}

void daemon_metrics::room_verified() { impl_->verified.Increment(); }

std::shared_ptr<peer_health> daemon_metrics::peer_ready(const std::string& peer) {
  auto h = std::make_shared<peer_health>();
  h->peer = peer;
  h->last_heard_ms = impl_->clock();
  std::lock_guard lock(impl_->peers_mutex);
  std::erase_if(impl_->peers, [](const auto& w) { return w.expired(); });
  impl_->peers.push_back(h);
  impl_->counters_of(peer);
  return h;
}

void daemon_metrics::peer_lost(const std::string& peer) {
  std::lock_guard lock(impl_->peers_mutex);
  impl_->counters_of(peer).lost->Increment();
}

void daemon_metrics::peer_drained(const std::string& peer) {
  std::lock_guard lock(impl_->peers_mutex);
  impl_->counters_of(peer).drained->Increment();
}

void daemon_metrics::peer_fenced(const std::string& peer) {
  std::lock_guard lock(impl_->peers_mutex);
  impl_->counters_of(peer).fenced->Increment();
}

void daemon_metrics::peer_authenticated(const std::string& secret_file) {
  impl_->peer_auth.Add({{"file", secret_file}}).Increment();
}

std::string daemon_metrics::exposition(const metrics_snapshot& s) const {
  std::map<std::string, double> ages;
  {
    std::lock_guard lock(impl_->peers_mutex);
    ages = impl_->heartbeat_ages();  // before the collection: departed peers' counters go
  }
  auto all = impl_->registry.Collect();

  auto active =
      family("ferry_rooms_active", "Rooms not yet terminal, by side and status", MetricType::Gauge);
  for (int d = 0; d < 2; ++d)
    for (auto st :
         {room_status::bootstrapping, room_status::waiting_for_input, room_status::transferring})
      add(active, {{"side", side_name(d)}, {"status", to_string(st)}},
          static_cast<double>(s.active[d][static_cast<int>(st)]));
  all.push_back(std::move(active));

  auto conns = family("ferry_connections", "Connected clients and ready peers", MetricType::Gauge);
  add(conns, {{"kind", "client"}}, static_cast<double>(s.clients));
  add(conns, {{"kind", "peer"}}, static_cast<double>(s.peers));
  all.push_back(std::move(conns));

  auto stray = family("ferry_stray_writes_total",
                      "Writes that landed for no active room (a late write of an ended room)",
                      MetricType::Counter);
  add(stray, {}, static_cast<double>(s.stray_writes));
  all.push_back(std::move(stray));

  auto items = family("ferry_pool_items",
                      "Pool items (pages, slots, rows): all, and held by "
                      "active decode rooms (state label)",
                      MetricType::Gauge);
  auto bytes = family("ferry_pool_bytes", "Pool sizes in bytes", MetricType::Gauge);
  auto registered =
      family("ferry_pool_registered",
             "1 when the pool's memory is registered (a client pool: a client's register_memory)",
             MetricType::Gauge);
  for (const auto& p : s.pools) {
    const char* memory = p.client ? "client" : "daemon";
    add(items, {{"pool", p.name}, {"state", "total"}}, static_cast<double>(p.items));
    add(items, {{"pool", p.name}, {"state", "in_use"}}, static_cast<double>(p.in_use));
    add(bytes, {{"memory", memory}, {"pool", p.name}}, static_cast<double>(p.bytes));
    add(registered, {{"memory", memory}, {"pool", p.name}}, p.registered ? 1 : 0);
  }
  all.push_back(std::move(items));
  all.push_back(std::move(bytes));
  all.push_back(std::move(registered));

  auto staging = family("ferry_staging_bytes", "Staging (fabric.staging_bytes): size and in use",
                        MetricType::Gauge);
  add(staging, {{"state", "total"}}, static_cast<double>(s.staging_bytes));
  add(staging, {{"state", "in_use"}}, static_cast<double>(s.staging_in_use));
  all.push_back(std::move(staging));
  auto waits =
      family("ferry_staging_waits_total",
             "Staging allocations that waited for a release (back-pressure)", MetricType::Counter);
  add(waits, {}, static_cast<double>(s.staging_waits));
  all.push_back(std::move(waits));
  auto copied = family("ferry_staging_copied_bytes_total",
                       "Bytes copied into staging before their writes (pack) and out of it into "
                       "the pages on commit (unpack)",
                       MetricType::Counter);
  add(copied, {{"direction", "pack"}}, static_cast<double>(s.staging_packed));
  add(copied, {{"direction", "unpack"}}, static_cast<double>(s.staging_unpacked));
  all.push_back(std::move(copied));

  // Writes and bytes in series of their own: a sum over one name never adds bytes to counts.
  auto rail_now = family("ferry_rail_in_flight",
                         "Writes posted and uncompleted on each fabric endpoint (a tcp marker is "
                         "a write)",
                         MetricType::Gauge);
  auto rail_now_bytes =
      family("ferry_rail_in_flight_bytes", "Bytes posted and uncompleted on each fabric endpoint",
             MetricType::Gauge);
  auto rail_all = family("ferry_rail_posted_total",
                         "Writes posted on each fabric endpoint since start (a tcp marker is a "
                         "write)",
                         MetricType::Counter);
  auto rail_all_bytes =
      family("ferry_rail_posted_bytes_total", "Bytes posted on each fabric endpoint since start",
             MetricType::Counter);
  for (const auto& r : s.rails) {
    add(rail_now, {{"rail", r.name}}, static_cast<double>(r.writes_in_flight));
    add(rail_now_bytes, {{"rail", r.name}}, static_cast<double>(r.bytes_in_flight));
    add(rail_all, {{"rail", r.name}}, static_cast<double>(r.writes_posted));
    add(rail_all_bytes, {{"rail", r.name}}, static_cast<double>(r.bytes_posted));
  }
  all.push_back(std::move(rail_now));
  all.push_back(std::move(rail_now_bytes));
  all.push_back(std::move(rail_all));
  all.push_back(std::move(rail_all_bytes));

  auto age =
      family("ferry_peer_heartbeat_age_seconds",
             "Time since anything was heard from each ready peer, by its node", MetricType::Gauge);
  for (const auto& [peer, seconds] : ages) add(age, {{"peer", peer}}, seconds);
  all.push_back(std::move(age));

  std::ostringstream out;
  prometheus::TextSerializer().Serialize(out, all);
  return out.str();
}

}  // namespace ferry
