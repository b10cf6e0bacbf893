// File: models/inspect.h
//
// A structural report on a model directory, for `ringctl inspect`: family, per-layer
// type (dense/MoE, DSA indexer full/shared), storage per module kind (quant mode or
// dtype), bytes per layer and in total, tokenizer/template presence, and what this build
// can or cannot run (unsupported model_type or quant mode, missing or mis-shaped
// tensors). It reads config files and safetensors headers only, never tensor data
// (Checkpoint::Describe).
//
//   RING_ASSIGN_OR_RETURN(InspectReport r, InspectCheckpoint(dir));
//   std::cout << r.ToText();
#ifndef RINGSERVE_MODELS_INSPECT_H_
#define RINGSERVE_MODELS_INSPECT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "models/config.h"

namespace ring {

struct InspectLayer {
  int64_t index = 0;
  std::string mlp;      // "dense" | "moe"
  std::string indexer;  // "full" | "shared" | "" (no DSA indexer in this family)
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

// All modules of one kind (layer index replaced by '*') stored the same way.
struct InspectGroup {
  std::string kind;             // e.g. "model.layers.*.mlp.switch_mlp.gate_proj"
  std::string storage;          // "mxfp4/g32/b4", "affine/g64/b8", "BF16", "BF16+F32"
  std::string shape;            // logical shape of one module's weight, e.g. "[256,2048,6144]"
  std::vector<int64_t> layers;  // layers holding it (empty for non-layer modules)
  int64_t count = 0;            // modules in the group
  uint64_t bytes = 0;
};

struct InspectReport {
  std::string dir;
  std::string model_type;    // as written in config.json
  std::string architecture;  // config.json "architectures"[0]
  std::optional<ModelConfig> config;  // absent when this build cannot parse the config
  std::string quantization;  // "mxfp4/g32/b4 (+1 override)", "none"

  int64_t num_files = 0;     // *.safetensors files
  int64_t num_tensors = 0;
  uint64_t total_bytes = 0;
  uint64_t non_layer_bytes = 0;  // embeddings, final norm, head
  std::vector<InspectLayer> layers;
  std::vector<InspectGroup> groups;

  bool has_tokenizer_json = false;
  bool has_tokenizer_config = false;
  std::string chat_template;  // "chat_template.jinja", "tokenizer_config.json" or ""
  bool has_generation_config = false;
  int64_t tokenizer_vocab = 0;  // highest token id + 1 in tokenizer.json (0: unknown)

  std::vector<std::string> problems;  // reasons this build cannot run the checkpoint
  std::vector<std::string> warnings;  // oddities that do not stop it

  bool runnable() const { return problems.empty(); }
  std::string ToText() const;
  std::string ToJson() const;  // pretty-printed
};

// NotFound for a missing directory or config.json, InvalidArgument for a config.json that
// is not a JSON object, and the Checkpoint::Open/Describe error for unreadable or corrupt
// safetensors. A config this build does not support is not an error: it is a problem in
// the report.
absl::StatusOr<InspectReport> InspectCheckpoint(const std::string& dir);

}  // namespace ring

#endif  // RINGSERVE_MODELS_INSPECT_H_
