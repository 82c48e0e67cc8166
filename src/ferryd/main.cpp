// ferryd: the Ferry transfer daemon. See README.md and docs/architecture.md.

#include <CLI/CLI.hpp>
#include <spdlog/spdlog.h>

#include <iostream>

#include "actors/daemon.hpp"
#include "core/config.hpp"

int main(int argc, char** argv) {
  CLI::App app{"ferryd: moves KV pages, Mamba state and aux rows between prefill and decode workers"};
  std::string config_path, check_path, log_level;
  app.add_option("-c,--config", config_path, "YAML config file to run with")->check(CLI::ExistingFile);
  app.add_option("--check-config", check_path, "validate a config file, print the effective config, and exit");
  app.add_option("--log-level", log_level, "override log.level: trace, debug, info, warn, error");
  int ready_fd = -1;
  app.add_option("--ready-fd", ready_fd, "write 'ready' to this file descriptor once serving");
  app.footer("Example: ferryd --config configs/decode.yaml");
  CLI11_PARSE(app, argc, argv);

  if (!check_path.empty()) {
    auto r = ferry::load_config_file(check_path);
    if (!r) {
      std::cerr << "ferryd: invalid config: " << r.error->what << "\n";
      return 1;
    }
    std::cout << ferry::to_yaml(*r.config);
    return 0;
  }
  if (config_path.empty()) {
    std::cerr << "ferryd: --config FILE is required (or --check-config FILE); see --help\n";
    return 1;
  }
  auto r = ferry::load_config_file(config_path);
  if (!r) {
    std::cerr << "ferryd: invalid config: " << r.error->what << "\n";
    return 1;
  }
  auto cfg = *r.config;
  if (!log_level.empty()) cfg.log.level = log_level;
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ [%n] %v");
  spdlog::set_level(spdlog::level::from_str(cfg.log.level));
  return ferry::run_daemon(cfg, ready_fd);
}
