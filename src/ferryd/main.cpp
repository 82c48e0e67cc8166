// ferryd: the Ferry transfer daemon. See README.md and docs/architecture.md.

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <optional>

#include "actors/daemon.hpp"
#include "core/auth.hpp"
#include "core/config.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "ferryd: moves KV pages, Mamba state and aux rows between prefill and decode workers"};
  std::string config_path, check_path, log_level;
  app.add_option("-c,--config", config_path, "YAML config file to run with")
      ->check(CLI::ExistingFile);
  app.add_option("--check-config", check_path,
                 "validate a config file, print the effective config, and exit");
  app.add_option("--log-level", log_level, "override log.level: trace, debug, info, warn, error");
  int ready_fd = -1;
  app.add_option("--ready-fd", ready_fd, "write 'ready' to this file descriptor once serving");
  app.footer("Example: ferryd --config configs/decode.yaml");
  CLI11_PARSE(app, argc, argv);

  if (config_path.empty() && check_path.empty()) {
    std::cerr << "ferryd: --config FILE is required (or --check-config FILE); see --help\n";
    return 1;
  }
  auto r = ferry::parse_config_file(check_path.empty() ? config_path : check_path);
  ferry::result<> valid = r ? ferry::result<>() : r.error();
  if (r) {
    if (!log_level.empty()) r.value.log.level = log_level;  // validated like log.level
    valid = ferry::validate_config(r.value);
  }
  if (!valid) {
    std::cerr << "ferryd: invalid config: " << valid.message << "\n";
    return 1;
  }
  ferry::fill_derived(r.value);
  // What the daemon would refuse at start because of its config, --check-config refuses too.
  if (const auto& f = r.value.security.cluster_secret_file; !f.empty()) {
    if (auto secret = ferry::read_secret_file(f); !secret) {
      std::cerr << "ferryd: invalid config: " << secret.message << "\n";
      return 1;
    }
  }
  if (!check_path.empty()) {
    std::cout << ferry::to_yaml(r.value);
    return 0;
  }
  const auto& cfg = r.value;
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  spdlog::set_level(spdlog::level::from_str(cfg.log.level));
  ferry::daemon_options options;
  options.ready_fd = ready_fd;
  return ferry::run_daemon(cfg, options);
}
