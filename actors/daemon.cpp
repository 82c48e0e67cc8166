#include "actors/daemon.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

#include "actors/actors.hpp"
#include "actors/client_memory.hpp"
#include "actors/logging.hpp"
#include "actors/operator_endpoint.hpp"
#include "core/access.hpp"
#include "core/auth.hpp"
#include "core/exit_codes.hpp"
#include "os/daemon_locks.hpp"
#include "os/failpoint.hpp"
#include "os/sd_notify.hpp"
#include "transport/channels/client_gateway.hpp"
#include "transport/channels/peer_gate.hpp"

namespace ferry {

staging_area::~staging_area() {
  if (data) munmap(data, bytes);
}

namespace {

class daemon_system_config : public caf::actor_system_config {
 public:
  explicit daemon_system_config(uint32_t workers) {
    // No actor waits on the fabric or the network, so one worker per core suffices.
    // Work stealing, because a message one actor sends another from a worker stays in that
    // worker's own queue: a room's chain (Scheduler -> Receiver -> Connection -> ...) runs on
    // one thread without a wake-up. The sharing policy puts every such message on one shared
    // queue and signals a sleeping worker for each: on 2 cores that was a context switch per
    // hop, half of a small room's CPU (docs/performance.md section 13). Its polling is cut to
    // a short spin: no moderate phase (500 sleeps of 50 µs, a wake-up every 50 µs while
    // idle), so an idle worker blocks on its condition variable at once and a message from a
    // thread outside the pool (client gateway, progress thread, peer gate) wakes it, as fast
    // as sharing's. A blocked worker steals every relaxed-sleep-duration.
    set("scheduler.max-threads", static_cast<size_t>(workers));
    set("scheduler.policy", caf::atom("stealing"));
    set("work-stealing.aggressive-poll-attempts", size_t{100});
    set("work-stealing.aggressive-steal-interval", size_t{10});
    set("work-stealing.moderate-poll-attempts", size_t{0});
    set("work-stealing.relaxed-steal-interval", size_t{1});
    set("work-stealing.relaxed-sleep-duration", caf::timespan{std::chrono::milliseconds(10)});
    set("logger.verbosity", caf::atom("quiet"));
    // No middleman: daemons talk on Ferry's own peer channel (transport/channels/peer_gate.hpp), so
    // CAF opens no socket and parses no byte from the network.
  }
};

/// Raise the soft descriptor limit to the hard one: every peer, fabric connection and client
/// takes descriptors, and running out mid-transfer fails rooms. Returns the limit in force.
uint64_t raise_descriptor_limit(spdlog::logger& log) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    const auto was = rl.rlim_cur;
    rl.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0)
      log.info("file descriptors: soft limit raised from {} to the hard limit {}", was,
               rl.rlim_max);
    else
      getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur;
}

/// limits.max_clients, or what the descriptor limit `nofile` leaves for clients when it is 0
/// (auto).
uint32_t client_limit(const ferry_config& cfg, uint64_t nofile, spdlog::logger& log) {
  const uint32_t automatic = auto_max_clients(nofile);
  // The peer gate holds up to limits.max_pending_peers descriptors under a flood; with too few
  // left, accept() fails and the gate evicts or pauses, which delays honest peers (it never
  // spins or stops the daemon).
  const uint64_t clients = cfg.limits.max_clients ? cfg.limits.max_clients : automatic;
  if (clients + cfg.limits.max_pending_peers + 64 > nofile)
    log.warn(
        "limits.max_pending_peers {} plus {} clients leave little of the {} file descriptors; "
        "under a flood of the peer port, new peer connections are delayed",
        cfg.limits.max_pending_peers, clients, nofile);
  if (cfg.limits.max_clients == 0) {
    log.info("limits.max_clients: {} (auto: half of the {} file descriptors)", automatic, nofile);
    return automatic;
  }
  if (cfg.limits.max_clients > automatic)
    log.warn(
        "limits.max_clients {} leaves little of the {} file descriptors for peers and the "
        "fabric; when they run out, new peer connections fail (auto would be {})",
        cfg.limits.max_clients, nofile, automatic);
  return cfg.limits.max_clients;
}

/// The value a client's drain request queues SIGTERM with, which tells it from an operator's.
constexpr int drain_request_value = 0x46455259;  // "FERY"

bool is_drain_request(int code, pid_t pid, int value) {
  return code == SI_QUEUE && pid == getpid() && value == drain_request_value;
}

/// How many rooms are still active, asked of the Scheduler after everything sent it before
/// (the drain_msg included): its answer orders after them. -1 when it does not answer.
int64_t rooms_still_active(caf::actor_system& sys, const caf::actor& scheduler) {
  caf::scoped_actor self{sys};
  int64_t active = -1;
  self->request(scheduler, std::chrono::seconds(2), metrics_atom::value)
      .receive(
          [&](metrics_snapshot& m) {
            active = 0;
            for (const auto& side : m.active)
              for (const auto n : side) active += static_cast<int64_t>(n);
          },
          [&](caf::error&) {});
  return active;
}

/// The stop's drain, after the first stop signal: the Scheduler refuses new rooms and tells the
/// peers; this returns once the rooms accepted before it finished, a second stop signal came,
/// or timeouts.stop_ms passed, whichever is first. `signals` are blocked in every thread.
/// Returns how many rooms the stop cut short: 0 when the drain finished (or had nothing to
/// wait for, as when both stop signals come at once to an idle daemon).
int64_t drain_before_stop(caf::actor_system& sys, const caf::actor& scheduler,
                          const ferry_config& cfg, const sigset_t& signals, spdlog::logger& log) {
  if (cfg.timeouts.stop_ms == 0) {
    log.info("timeouts.stop_ms is 0: stopping at once");
    return 0;
  }
  auto done = std::make_shared<stop_notice>();
  const int sfd = signalfd(-1, &signals, SFD_CLOEXEC);
  if (done->fd < 0 || sfd < 0) {
    log.warn("cannot wait for the drain ({}): stopping at once", std::strerror(errno));
    if (sfd >= 0) close(sfd);
    return 0;
  }
  caf::anon_send(scheduler, drain_msg{done});
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(cfg.timeouts.stop_ms);
  bool forced = false;
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          until - std::chrono::steady_clock::now())
                          .count();
    pollfd fds[2] = {{done->fd, POLLIN, 0}, {sfd, POLLIN, 0}};
    const int n = left > 0 ? ::poll(fds, 2, static_cast<int>(left)) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      log.warn(
          "timeouts.stop_ms ({} ms) passed with rooms still active: stopping at once; "
          "their peers see them fail",
          cfg.timeouts.stop_ms);
      forced = true;
      break;
    }
    if (fds[0].revents) break;  // drained: the Scheduler logged it
    signalfd_siginfo si{};
    if (read(sfd, &si, sizeof si) != sizeof si) continue;
    if (si.ssi_signo == SIGHUP) {
      log.info("SIGHUP received while draining: ignored");
      continue;
    }
    if (is_drain_request(si.ssi_code, static_cast<pid_t>(si.ssi_pid), si.ssi_int))
      continue;  // a client's drain, asked for as the operator's signal came: already draining
    log.warn("signal {} received again while draining: stopping at once", si.ssi_signo);
    forced = true;
    break;
  }
  close(sfd);
  if (!forced) return 0;
  // Two signals sent together reach an idle daemon before its Scheduler has seen the drain:
  // once it answered, the drain has been checked, and `done` says whether it finished.
  const int64_t active = rooms_still_active(sys, scheduler);
  pollfd drained{done->fd, POLLIN, 0};
  if (::poll(&drained, 1, 0) == 1) return 0;
  return active < 0 ? 1 : active;
}

/// The test hook that makes a start slow on purpose (docs/operations.md, "Metrics and health"):
/// with FERRY_FAILPOINTS=start_hold_creating_pools, ferryd holds before it creates its first
/// pool until it gets SIGUSR1 (bounded: 60 s), so a test sees the endpoint of a daemon that is
/// starting without racing it. SIGUSR1 is blocked before any thread exists; false when unset.
constexpr const char* hold_failpoint = "start_hold_creating_pools";

bool block_hold_signal() {
  if (os::active_failpoints().find(hold_failpoint) == std::string::npos) return false;
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &usr1, nullptr);
  return true;
}

void hold_start(spdlog::logger& log) {
  if (!os::failpoint(hold_failpoint)) return;
  log.warn("failpoint {}: holding the start before the pools until SIGUSR1 (a test hook)",
           hold_failpoint);
  sigset_t usr1;
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  const timespec bound{60, 0};
  while (sigtimedwait(&usr1, nullptr, &bound) < 0 && errno == EINTR) {
  }
  log.info("failpoint {}: released", hold_failpoint);
}

std::string random_instance() {
  std::random_device rd;
  return fmt::format("{:08x}", rd());
}

}  // namespace

bool request_drain(daemon_context& ctx) {
  if (ctx.drain_begun.exchange(true)) return false;
  sigval value{};
  value.sival_int = drain_request_value;
  // The main thread waits for SIGTERM (blocked in every thread): this one it tells apart.
  sigqueue(getpid(), SIGTERM, value);
  return true;
}

int run_daemon(const ferry_config& cfg, const daemon_options& options) {
  logging::configure(cfg.log);
  auto log = logging::get("ferryd");
  if (const auto bad = os::failpoints_invalid(); !bad.empty()) {
    log->error("{}", bad);  // a test hook set wrong: the test would prove nothing
    return exit_code::usage;
  }
  const auto instance = cfg.instance == "auto" ? random_instance() : cfg.instance;
  // Before anything is touched: a second ferryd with this config finds the first and leaves.
  // The locks outlive everything below (the socket and the pools go first at a stop).
  auto config_lock = lock_config(cfg.client_listen, cfg.node_name, instance);
  if (!config_lock) {
    log->error("{}", config_lock.message);
    return exit_code::could_not_start;
  }
  auto instance_lock = lock_instance(cfg.node_name, instance);
  if (!instance_lock) {
    log->error("{}", instance_lock.message);
    return exit_code::could_not_start;
  }
  const uint64_t nofile = raise_descriptor_limit(*log);
  for (const auto& r : reclaim_dead_instances(cfg.node_name))
    log->warn("reclaimed {} shared-memory objects of dead instance {} of node {} ({} bytes): {}",
              r.objects.size(), r.instance, cfg.node_name, r.bytes, fmt::join(r.objects, ", "));
  auto ctx = std::make_shared<daemon_context>();
  ctx->config = cfg;
  ctx->instance = instance;
  ctx->config_yaml = to_yaml(cfg);
  ctx->peer_config_yaml = to_yaml(cfg, yaml_for::peers);
  ctx->layout = make_layout(cfg.pools);
  ctx->log_sched = logging::get("scheduler");
  ctx->log_room = logging::get("room");
  ctx->log_peer = logging::get("peer");
  ctx->digest.configure(cfg.log);
  ctx->digest.start(ctx->log_sched);
  log->info("starting node={} instance={} role={}", cfg.node_name, ctx->instance,
            to_string(cfg.role));
  // A record per line of the YAML: the text format writes a record's newlines escaped.
  log->info("effective config:");
  for (size_t at = 0; at < ctx->config_yaml.size();) {
    const size_t end = std::min(ctx->config_yaml.find('\n', at), ctx->config_yaml.size());
    log->info("| {}", std::string_view(ctx->config_yaml).substr(at, end - at));
    at = end + 1;
  }
  if (const auto& sec = cfg.security; !sec.cluster_secret_file.empty()) {
    auto secret = read_secret_file(sec.cluster_secret_file);
    if (!secret) {
      log->error("{}", secret.message);
      return exit_code::could_not_start;
    }
    ctx->secret_files = {sec.cluster_secret_file};
    std::string second;
    if (!sec.accepted_cluster_secret_file.empty()) {
      auto accepted = read_secret_file(sec.accepted_cluster_secret_file,
                                       "security.accepted_cluster_secret_file");
      if (!accepted) {
        log->error("{}", accepted.message);
        return exit_code::could_not_start;
      }
      second = std::move(accepted.value);
      ctx->secret_files.push_back(sec.accepted_cluster_secret_file);
      log->info(
          "peers must prove the cluster secret of {} or, while the cluster rotates, the one of {} "
          "(security.accepted_cluster_secret_file); this daemon proves the first",
          sec.cluster_secret_file, sec.accepted_cluster_secret_file);
    } else {
      log->info("peers must prove the cluster secret ({})", sec.cluster_secret_file);
    }
    ctx->secrets = cluster_secrets(std::move(secret.value), std::move(second));
  } else {
    log->warn("security.cluster_secret_file is not set: peers are not authenticated");
  }

  // Who may use the client socket and map the pools beside ferryd's user and root.
  auto access = resolve_client_access(cfg.security);
  if (!access) {
    log->error("{}", access.message);
    return exit_code::could_not_start;
  }
  log->info("clients: {}", describe_access(cfg.security, access.value, geteuid()));

  // Block the stop signals (and SIGHUP) in every thread; main waits for them with sigwait.
  // A daemon told to stop otherwise (options.wait_for_stop) leaves its process's signals be.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGHUP);
  if (!options.wait_for_stop) pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const bool hold_in_pools = block_hold_signal();

  // /healthz and /readyz from the first moment: a probe tells a daemon that is starting (its
  // pools may take minutes) from one that is not there.
  auto status = std::make_shared<operator_status>();
  std::unique_ptr<http_server> operator_http;
  if (!cfg.metrics_listen.empty()) {
    auto served = serve_operator_endpoint(status, ctx);
    if (!served) {
      log->error("listen.metrics: {}", served.message);
      return exit_code::could_not_start;
    }
    operator_http = std::move(served.value);
  }
  status->phase(fmt::format("opening the fabric ({})", cfg.fabric.provider));

  transport::engine_config engine_cfg;
  engine_cfg.provider = cfg.fabric.provider;
  engine_cfg.address = cfg.fabric.address;
  engine_cfg.max_inflight_writes = cfg.fabric.max_inflight_writes;
  engine_cfg.max_inflight_bytes = cfg.fabric.max_inflight_bytes;
  engine_cfg.rails = cfg.fabric.rails;
  engine_cfg.express_bytes = cfg.fabric.express_bytes;
  // Prefills write into a decode by the addresses it announced: only a prefill may renew them.
  engine_cfg.keep_address = cfg.role != node_role::prefill;
  auto opened =
      options.make_engine ? options.make_engine(engine_cfg) : transport::engine::open(engine_cfg);
  if (!opened) {
    log->error("{}", opened.message);
    return exit_code::could_not_start;
  }
  ctx->engine = std::move(opened.value);
  ctx->metrics = std::make_unique<daemon_metrics>(cfg.node_name, instance, to_string(cfg.role),
                                                  ctx->engine->provider_name());
  if (auto reserved = reserve_client_pools(*ctx); !reserved) {
    log->error("{}", reserved.message);
    return exit_code::could_not_start;
  }
  for (int k = 0; k < pool_kind_count; ++k) {
    const auto& pool = ctx->layout.pools[k];
    if (!pool.present) continue;
    if (ctx->client_memory(k) && !ctx->client_pools[k].base) {
      log->info(
          "pool {}: client memory described by the engine's register_memory (rooms and "
          "peers wait for it)",
          to_string(static_cast<pool_kind>(k)));
      continue;
    }
    if (ctx->client_memory(k)) {
      log->info(
          "pool {}: client memory ({} bytes, {} buffers; rooms wait for a client's "
          "register_memory)",
          to_string(static_cast<pool_kind>(k)), pool.total_bytes, pool.buffers.size());
      continue;
    }
    status->phase(fmt::format("creating pool {}", to_string(static_cast<pool_kind>(k))));
    if (hold_in_pools) hold_start(*log);
    auto name = fmt::format("/ferry.{}.{}.{}", cfg.node_name, ctx->instance,
                            to_string(static_cast<pool_kind>(k)));
    auto created = shm_region::create(name, pool.total_bytes,
                                      [&](int fd) { return share_shm_object(access.value, fd); });
    if (!created) {
      uint64_t all = 0;
      for (const auto& p : ctx->layout.pools) all += p.present ? p.total_bytes : 0;
      log->error("pool {}: {} (the pools of this config need {} bytes in all)",
                 to_string(static_cast<pool_kind>(k)), created.message, all);
      return exit_code::could_not_start;
    }
    ctx->pools[k] = std::move(created.value);
    // Local access only: peers write through their own per-connection registrations
    // (actors/connection.cpp), which are closed when a peer is lost.
    auto reg = ctx->engine->register_region(ctx->pools[k].data(), pool.total_bytes,
                                            transport::region_access::local);
    if (!reg) {
      log->error("pool {}: memory registration of {} bytes failed: {}",
                 to_string(static_cast<pool_kind>(k)), pool.total_bytes, reg.message);
      return exit_code::could_not_start;
    }
    ctx->regions[k] = reg.value;
    log->info("pool {}: {} ({} bytes, {} buffers)", to_string(static_cast<pool_kind>(k)), name,
              pool.total_bytes, pool.buffers.size());
  }
  if (cfg.fabric.staging_bytes) {
    status->phase("mapping fabric.staging_bytes");
    auto st = std::make_unique<staging_area>(cfg.fabric.staging_bytes);
    void* mem = mmap(nullptr, cfg.fabric.staging_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) {
      log->error("fabric.staging_bytes: cannot map {} bytes: {}", cfg.fabric.staging_bytes,
                 std::strerror(errno));
      return exit_code::could_not_start;
    }
    st->data = static_cast<uint8_t*>(mem);
    auto reg = ctx->engine->register_region(st->data, st->bytes, transport::region_access::local);
    if (!reg) {
      log->error("staging: memory registration of {} bytes failed: {}", st->bytes, reg.message);
      return exit_code::could_not_start;
    }
    st->region = reg.value;
    ctx->staging = std::move(st);
  }
  status->phase("listening for clients, peers and the actor system");
  auto gateway =
      client_gateway::listen(cfg.client_listen, client_limit(cfg, nofile, *log),
                             cfg.limits.client_frame_ms, access.value, logging::get("client"));
  if (!gateway) {
    log->error("{}", gateway.message);
    return exit_code::could_not_start;
  }
  ctx->gateway = std::move(gateway.value);

  int rc = 0;
  int64_t cut_short = 0;  // rooms a forced stop ended unfinished
  ctx->timers = std::make_unique<timer_service>();
  {
    const uint32_t workers = cfg.runtime.workers
                                 ? cfg.runtime.workers
                                 : auto_workers(std::thread::hardware_concurrency());
    log->info("actor workers: {}{}", workers, cfg.runtime.workers ? "" : " (one per core)");
    daemon_system_config sys_cfg(workers);
    caf::actor_system sys{sys_cfg};
    auto scheduler = spawn_scheduler(sys, ctx);
    const auto colon = cfg.control_listen.rfind(':');
    auto host = cfg.control_listen.substr(0, colon);
    auto port = static_cast<uint16_t>(std::stoi(cfg.control_listen.substr(colon + 1)));
    ctx->peer_port = std::make_shared<peer_gate>(
        cfg.node_name, ctx->secrets,
        peer_gate::limits{cfg.limits.max_pending_peers, cfg.limits.max_pending_peers_per_source, 32,
                          cfg.limits.peer_preamble_ms},
        ctx->log_peer);
    // Runs on the gate thread: the link's first message goes to the Scheduler, which spawns its
    // Connection; the link reads nothing more until that Connection binds it.
    auto err = ctx->peer_port->listen(
        host, port, [scheduler, log = ctx->log_peer](const peer_link_ptr& link) {
          std::weak_ptr<peer_link> weak = link;
          link->bind(
              [scheduler, weak](peer_wire::message&& m) {
                if (auto l = weak.lock())
                  caf::anon_send(scheduler, peer_link_first{l, std::move(m)});
              },
              [log, source = link->source(), node = link->peer_node()](const std::string& why) {
                log->warn("peer port: {} ({}) ended before its hello: {}", source, node, why);
              },
              true);
        });
    if (!err.empty())
      err = fmt::format("cannot listen for peers on {}: {}", cfg.control_listen, err);
    status->attach(sys, scheduler);
    if (!err.empty()) {
      log->error("{}", err);
      rc = exit_code::could_not_start;
    } else {
      ctx->peer_port->start();
      // Each room's landed writes go from the progress thread straight to its actor; only
      // those with no route (a room that ended: late writes, counted and logged) go to the
      // Scheduler, which then returns the credit.
      ctx->engine->start([scheduler, c = ctx.get()](transport::immediate_counts counts) {
        transport::immediate_counts rest;
        uint64_t routed = 0;
        for (auto [token, n] : counts)
          if (auto room = c->routes.decode(token)) {
            caf::anon_send(room, landed_msg{token, n});
            routed += n;
          } else {
            rest.emplace_back(token, n);
          }
        if (routed) c->metrics->writes_landed(routed);
        if (rest.empty())
          c->engine->return_immediate_credit();
        else
          caf::anon_send(scheduler, immediates_msg{std::move(rest)});
      });
      ctx->drain_on_request = !options.wait_for_stop;
      // Refusals by a request's own fields are answered on the gateway's thread (the context
      // outlives the gateway it holds).
      ctx->gateway->start(
          {[scheduler](client_request r) { caf::anon_send(scheduler, std::move(r)); },
           [scheduler](client_gone g) { caf::anon_send(scheduler, g); }},
          &ctx->board, [c = ctx.get()](const proto::message& m, uint64_t conn) {
            return refuse_at_once(*c, m, conn);
          });
      if (const auto fp = os::active_failpoints(); !fp.empty())
        log->warn("FERRY_FAILPOINTS={} is set: this daemon fails on purpose (a test hook)", fp);
      ctx->serving = true;
      status->started();
      log->info("ready: provider {}, peers on {}, clients on {}{}", ctx->engine->provider_name(),
                cfg.control_listen, cfg.client_listen,
                operator_http ? fmt::format(", metrics on http://{}/metrics", cfg.metrics_listen)
                              : std::string());
      if (options.ready_fd >= 0) {
        [[maybe_unused]] auto n = write(options.ready_fd, "ready\n", 6);
        close(options.ready_fd);
      }
      notify_ready(
          *log, fmt::format("serving: provider {}, peers on {}, clients on {}",
                            ctx->engine->provider_name(), cfg.control_listen, cfg.client_listen));
      if (options.on_ready) options.on_ready();
      if (options.wait_for_stop) {
        options.wait_for_stop();
        log->info("asked to stop; shutting down");
      } else {
        // SIGHUP (a closed terminal, a log rotation) must not stop a daemon that rooms depend
        // on. ferryd writes its log to stderr, which it does not own, so there is nothing to
        // reopen: the signal is logged and ignored.
        siginfo_t si{};
        int sig = 0;
        while ((sig = sigwaitinfo(&stop_signals, &si)) == SIGHUP || (sig < 0 && errno == EINTR))
          if (sig == SIGHUP)
            log->info("SIGHUP received: ignored (ferryd logs to stderr; nothing to reopen)");
        ctx->drain_begun = true;
        if (is_drain_request(si.si_code, si.si_pid, si.si_value.sival_int))
          log->info("a client asked for a drain; stopping (a stop signal stops at once)");
        else
          log->info("signal {} received; stopping (a second signal stops at once)", sig);
        ctx->serving = false;
        notify_stopping(*log, "stopping: draining the rooms accepted before the signal");
        cut_short = drain_before_stop(sys, scheduler, cfg, stop_signals, *log);
        if (cut_short > 0) rc = exit_code::forced_stop;
        log->info("shutting down");
      }
      ctx->serving = false;
      ctx->gateway->stop();
    }
    operator_http.reset();  // its routes ask the Scheduler: gone before the actor system
    // Inside the actor system's scope: the gate's callbacks hold actor handles, and a socket it
    // hands over now goes to a broker that is still there (or is closed with its scribe).
    ctx->peer_port->stop();
    const auto& gs = ctx->peer_port->stats();
    log->info(
        "peer port: {} connections accepted, {} admitted, {} not a preamble, {} refused, {} timed "
        "out, {} evicted, {} closed by the peer",
        gs.accepted.load(), gs.admitted.load(), gs.garbage.load(), gs.refused.load(),
        gs.timed_out.load(), gs.evicted.load(), gs.peer_closed.load());
    caf::anon_send_exit(scheduler, caf::exit_reason::user_shutdown);
    ctx->engine->stop();
    ctx->timers->stop();  // its deadlines hold actor addresses: gone before the system is
  }                       // the actor system waits for every actor here
  ctx->gateway.reset();
  ctx->peer_port.reset();
  ctx->digest.stop();  // the last interval's summary: every room has ended by now
  if (rc == exit_code::forced_stop)
    log->warn("stopped, forced: {} room{} ended unfinished (exit code {})", cut_short,
              cut_short == 1 ? "" : "s", rc);
  else
    log->info("stopped");
  return rc;
}

}  // namespace ferry
