// ringctl inspect: what a model directory holds and whether this build can run it
// (models/inspect.h). Reads headers only.
//
//   ringctl inspect /models/GLM-5.2-mxfp4
//   ringctl inspect /models/Qwen3-8B-4bit --json
//
// Exit code 0 when the directory could be inspected (runnable or not; see "runnable" in
// the output), 1 for a missing directory, corrupt config.json or unreadable safetensors.
#include <iostream>

#include "models/inspect.h"
#include "server/ringctl_command.h"

namespace ring::ctl {
namespace {

struct InspectArgs {
  std::string dir;
  bool json = false;
};

int RunInspect(const InspectArgs& a) {
  absl::StatusOr<InspectReport> r = InspectCheckpoint(a.dir);
  if (!r.ok()) {
    std::cerr << "ringctl inspect: " << r.status().message() << "\n";
    return 1;
  }
  std::cout << (a.json ? r->ToJson() + "\n" : r->ToText());
  return 0;
}

Registration reg("inspect", "Summarise a checkpoint directory and what this build can run",
                 [](CLI::App* cmd) -> Handler {
                   auto a = std::make_shared<InspectArgs>();
                   cmd->add_option("dir", a->dir, "model directory")->required();
                   cmd->add_flag("--json", a->json, "machine-readable output");
                   return [a] { return RunInspect(*a); };
                 });

}  // namespace
}  // namespace ring::ctl
