// ringctl: the operator's CLI. Subcommands live in server/ringctl_<name>.cc.
#include <algorithm>
#include <iostream>
#include <map>

#include "server/ringctl_command.h"
#include "worker/mutex_mode.h"

namespace ring::ctl {
std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace ring::ctl

int main(int argc, char** argv) {
  ring::worker::UseServingMutexMode();
  CLI::App app{"ringctl: manage and inspect a RingServe ring, its models and checkpoints"};
  app.require_subcommand(1);
  auto& commands = ring::ctl::Commands();
  std::sort(commands.begin(), commands.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  std::map<CLI::App*, ring::ctl::Handler> handlers;
  for (auto& c : commands) {
    CLI::App* sub = app.add_subcommand(c.name, c.help);
    handlers[sub] = c.setup(sub);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  for (auto& [sub, handler] : handlers) {
    if (sub->parsed()) return handler();
  }
  return 2;
}
