// File: server/ringctl_command.h
//
// ringctl subcommands register themselves here, one file per subcommand
// (server/ringctl_<name>.cc), so adding a command never edits main():
//
//   static ring::ctl::Registration reg("logits", "Run the CPU engine and write logits",
//                                      [](CLI::App* cmd) { ...; return handler; });
//
// The setup function adds options to `cmd` and returns the function that runs the
// command; its int result is the process exit code (0 ok, 1 failure, 2 usage error).
#ifndef RINGSERVE_SERVER_RINGCTL_COMMAND_H_
#define RINGSERVE_SERVER_RINGCTL_COMMAND_H_

#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"

namespace ring::ctl {

using Handler = std::function<int()>;
using Setup = std::function<Handler(CLI::App*)>;

struct Command {
  std::string name;
  std::string help;
  Setup setup;
};
std::vector<Command>& Commands();

struct Registration {
  Registration(std::string name, std::string help, Setup setup) {
    Commands().push_back({std::move(name), std::move(help), std::move(setup)});
  }
};

}  // namespace ring::ctl

#endif  // RINGSERVE_SERVER_RINGCTL_COMMAND_H_
