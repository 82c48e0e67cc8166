// ferryd: the Ferry transfer daemon. See README.md, docs/architecture.md and docs/cli.md (its
// options and exit codes).

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "actors/daemon.hpp"
#include "actors/messages.hpp"
#include "cli/common.hpp"
#include "core/auth.hpp"
#include "core/config.hpp"
#include "core/model_catalogue.hpp"

namespace {

/// A config ferryd cannot run with is a usage error: the operator's to fix.
int invalid_config(const std::string& message) {
  std::cerr << "ferryd: invalid config: " << message << "\n";
  return ferry::exit_code::usage;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ferryd: moves KV pages, Mamba state and aux rows between prefill and decode workers"};
  ferry::cli::add_version(
      app, "ferryd",
      fmt::format("peer protocol versions {}-{}", ferry::peer_protocol_min_version,
                  ferry::peer_protocol_version));
  std::string config_path, check_path, log_level;
  std::vector<std::string> sets;
  app.add_option("-c,--config", config_path, "YAML config file to run with")
      ->check(CLI::ExistingFile);
  app.add_option("--check-config", check_path,
                 "validate a config file, print the effective config, and exit");
  app.add_option("--set", sets,
                 "override a config key after the file is read, e.g. --set fabric.provider=shm "
                 "--set pools.mamba.tensors[0].shape=[4096,3] (repeatable; checked like the "
                 "file's keys)")
      ->type_name("KEY=VALUE")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--log-level", log_level, "override log.level: trace, debug, info, warn, error");
  bool catalogue = false;
  app.add_flag(
      "--catalogue", catalogue,
      "list the model catalogue's architectures and engine conventions (model.config_json, "
      "model.engine), and exit");
  int ready_fd = -1;
  app.add_option("--ready-fd", ready_fd, "write 'ready' to this file descriptor once serving");
  app.footer(
      "Examples:\n"
      "  ferryd --config configs/decode.yaml\n"
      "  ferryd --check-config configs/decode.yaml --set fabric.provider=shm --set tp.rank=0\n"
      "Exit codes: 0 stopped cleanly, 2 bad options or config, 5 could not start, 6 stopped "
      "before the drain finished (docs/cli.md)");
  if (auto rc = ferry::cli::parse(app, argc, argv)) return *rc;
  if (catalogue) {
    std::cout << ferry::catalogue_listing();
    return ferry::exit_code::ok;
  }

  if (config_path.empty() && check_path.empty()) {
    std::cerr << "ferryd: --config FILE is required (or --check-config FILE); see --help\n";
    return ferry::exit_code::usage;
  }
  std::vector<ferry::config_override> overrides;
  for (const auto& s : sets) {
    auto o = ferry::parse_override(s);
    if (!o) {
      std::cerr << "ferryd: " << o.message << "\n";
      return ferry::exit_code::usage;
    }
    overrides.push_back(std::move(o.value));
  }
  auto r = ferry::parse_config_file(check_path.empty() ? config_path : check_path, overrides);
  ferry::result<> valid = r ? ferry::result<>() : r.error();
  if (r) {
    if (!log_level.empty()) r.value.log.level = log_level;  // validated like log.level
    valid = ferry::validate_config(r.value);
  }
  if (!valid) return invalid_config(valid.message);
  ferry::fill_derived(r.value);
  // What the daemon would refuse at start because of its config, --check-config refuses too.
  if (const auto& f = r.value.security.cluster_secret_file; !f.empty()) {
    if (auto secret = ferry::read_secret_file(f); !secret) return invalid_config(secret.message);
  }
  if (const auto& f = r.value.security.accepted_cluster_secret_file; !f.empty()) {
    if (auto secret = ferry::read_secret_file(f, "security.accepted_cluster_secret_file"); !secret)
      return invalid_config(secret.message);
  }
  if (!check_path.empty()) {
    std::cout << ferry::to_yaml(r.value);
    return ferry::exit_code::ok;
  }
  const auto& cfg = r.value;
  ferry::daemon_options options;
  options.ready_fd = ready_fd;
  return ferry::run_daemon(cfg, options);
}
