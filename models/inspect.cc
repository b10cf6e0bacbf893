// Structural checkpoint report for `ringctl inspect`. See inspect.h.
#include "models/inspect.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "kernels/quant.h"
#include "kernels/status.h"
#include "models/safetensors.h"
#include "models/synth.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr size_t kMaxListed = 20;  // problems/warnings of one kind shown individually

absl::StatusOr<std::string> ReadFile(const fs::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", path.string()));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// "model.layers.12.mlp.gate.weight" -> 12; -1 when not a layer tensor.
int64_t LayerOf(const std::string& name) {
  static constexpr absl::string_view kPrefix = "model.layers.";
  if (!absl::StartsWith(name, kPrefix)) return -1;
  const size_t end = name.find('.', kPrefix.size());
  int64_t layer = -1;
  if (end == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(name).substr(kPrefix.size(), end - kPrefix.size()),
                        &layer)) {
    return -1;
  }
  return layer;
}

// Module path with the layer index replaced by '*'.
std::string KindOf(const std::string& module) {
  const int64_t layer = LayerOf(module + ".");
  if (layer < 0) return module;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  return "model.layers.*." + module.substr(std::min(prefix.size(), module.size()));
}

std::string ModuleOf(const std::string& name) {
  const size_t dot = name.rfind('.');
  return dot == std::string::npos ? name : name.substr(0, dot);
}

std::string HumanBytes(uint64_t b) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  return u == 0 ? absl::StrCat(b, " B") : absl::StrFormat("%.2f %s", v, kUnits[u]);
}

// [0,1,2,6,10,11] -> "0-2,6,10-11".
std::string Ranges(const std::vector<int64_t>& sorted) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    parts.push_back(i == j ? absl::StrCat(sorted[i]) : absl::StrCat(sorted[i], "-", sorted[j]));
    i = j + 1;
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ",");
}

// Groups "message about kind" lines by kind, listing the layers compactly.
void AddGrouped(const std::string& what, const std::map<std::string, std::vector<int64_t>>& by_kind,
                std::vector<std::string>* out) {
  for (const auto& [kind, layers] : by_kind) {
    std::vector<int64_t> l = layers;
    std::sort(l.begin(), l.end());
    l.erase(std::unique(l.begin(), l.end()), l.end());
    if (l.empty() || (l.size() == 1 && l[0] < 0)) {
      out->push_back(absl::StrCat(what, ": ", kind));
    } else {
      out->push_back(absl::StrCat(what, ": ", kind, " (layers ", Ranges(l), ")"));
    }
  }
}

bool SameFloatClass(DType a, DType b) { return a == b || (IsFloat(a) && IsFloat(b)); }

}  // namespace

absl::StatusOr<InspectReport> InspectCheckpoint(const std::string& dir) {
  InspectReport r;
  r.dir = dir;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no such directory"));
  }
  const fs::path root(dir);
  if (!fs::exists(root / "config.json", ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": no config.json (not a model directory)"));
  }
  RING_ASSIGN_OR_RETURN(std::string config_text, ReadFile(root / "config.json"));
  Json raw = Json::parse(config_text, nullptr, /*allow_exceptions=*/false);
  if (raw.is_discarded() || !raw.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat((root / "config.json").string(), ": corrupt config (not a JSON object)"));
  }
  if (raw.contains("model_type") && raw["model_type"].is_string()) {
    r.model_type = raw["model_type"].get<std::string>();
  }
  if (raw.contains("architectures") && raw["architectures"].is_array() &&
      !raw["architectures"].empty() && raw["architectures"][0].is_string()) {
    r.architecture = raw["architectures"][0].get<std::string>();
  }
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir);
  if (config.ok()) {
    r.config = *config;
  } else {
    r.problems.push_back(absl::StrCat("config: ", config.status().message()));
  }

  // Tokenizer and template.
  r.has_tokenizer_json = fs::exists(root / "tokenizer.json", ec);
  r.has_tokenizer_config = fs::exists(root / "tokenizer_config.json", ec);
  r.has_generation_config = fs::exists(root / "generation_config.json", ec);
  if (fs::exists(root / "chat_template.jinja", ec)) r.chat_template = "chat_template.jinja";
  if (r.has_tokenizer_config) {
    absl::StatusOr<std::string> text = ReadFile(root / "tokenizer_config.json");
    Json tc = text.ok() ? Json::parse(*text, nullptr, false) : Json();
    if (!tc.is_object()) {
      r.warnings.push_back("tokenizer_config.json is not a JSON object");
    } else if (r.chat_template.empty() && tc.contains("chat_template")) {
      r.chat_template = "tokenizer_config.json";
    }
  }
  if (r.has_tokenizer_json) {
    absl::StatusOr<std::string> text = ReadFile(root / "tokenizer.json");
    Json tj = text.ok() ? Json::parse(*text, nullptr, false) : Json();
    if (!tj.is_object()) {
      r.problems.push_back("tokenizer.json is not valid JSON");
    } else {
      int64_t max_id = -1;
      if (tj.contains("model") && tj["model"].is_object() && tj["model"].contains("vocab") &&
          tj["model"]["vocab"].is_object()) {
        for (const auto& [tok, id] : tj["model"]["vocab"].items()) {
          if (id.is_number_integer()) max_id = std::max<int64_t>(max_id, id.get<int64_t>());
        }
      }
      if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
        for (const Json& t : tj["added_tokens"]) {
          if (t.is_object() && t.contains("id") && t["id"].is_number_integer()) {
            max_id = std::max<int64_t>(max_id, t["id"].get<int64_t>());
          }
        }
      }
      r.tokenizer_vocab = max_id + 1;
      if (r.config && r.tokenizer_vocab > r.config->vocab_size) {
        r.problems.push_back(absl::StrCat("tokenizer.json has ids up to ", max_id,
                                          " but vocab_size is ", r.config->vocab_size));
      }
    }
  } else {
    r.warnings.push_back("no tokenizer.json: the checkpoint cannot be served as text");
  }
  if (r.has_tokenizer_json && r.chat_template.empty()) {
    r.warnings.push_back("no chat template (chat_template.jinja or tokenizer_config.json)");
  }

  // Tensors: headers only.
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (absl::EndsWith(e.path().filename().string(), ".safetensors")) ++r.num_files;
  }
  absl::StatusOr<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return ckpt.status();
  std::map<std::string, TensorEntry> entries;
  for (const std::string& name : (*ckpt)->Names()) {
    RING_ASSIGN_OR_RETURN(TensorEntry e, (*ckpt)->Describe(name));
    r.total_bytes += e.end - e.begin;
    entries.emplace(name, std::move(e));
  }
  r.num_tensors = static_cast<int64_t>(entries.size());

  const ModelConfig* cfg = r.config ? &*r.config : nullptr;
  if (cfg) {
    r.quantization = cfg->quantization.present ? cfg->quantization.default_spec.ToString()
                                               : std::string("none");
    size_t overrides = cfg->quantization.overrides.size();
    if (overrides > 0) {
      absl::StrAppend(&r.quantization, " (+", overrides, overrides == 1 ? " override)" : " overrides)");
    }
  } else {
    r.quantization = raw.contains("quantization") ? raw["quantization"].dump() : "none";
  }

  // Expected parameters (from the config, as mlx-lm would build the model).
  std::map<std::string, ModelParam> expected;  // by module path
  std::set<std::string> expected_names;
  if (cfg) {
    std::map<std::string, std::vector<int64_t>> missing, bad_spec;
    std::vector<std::string> mismatches;
    for (const ModelParam& p : ModelParams(*cfg)) {
      const std::string m = p.module();
      expected.emplace(p.name.substr(m.size() + 1) == "weight" ? m : p.name, p);
      const bool has_scales = entries.count(m + ".scales") > 0;
      QuantSpec spec;
      if (p.quantizable) spec = cfg->quantization.SpecFor(m, has_scales);
      if (spec.mode != QuantMode::kNone && !ValidateQuantSpec(spec).ok()) {
        bad_spec[absl::StrCat(KindOf(m), " as ", spec.ToString())].push_back(p.layer);
      }
      for (const StoredTensor& t : StoredTensorsFor(p, spec, p.dtype)) {
        expected_names.insert(t.name);
        auto it = entries.find(t.name);
        if (it == entries.end()) {
          missing[KindOf(ModuleOf(t.name)) + "." + t.name.substr(ModuleOf(t.name).size() + 1)]
              .push_back(p.layer);
          continue;
        }
        const TensorEntry& e = it->second;
        const bool dtype_ok = (t.dtype == DType::kU32 || t.dtype == DType::kU8)
                                  ? e.dtype == t.dtype
                                  : SameFloatClass(e.dtype, t.dtype);
        if (e.shape != t.shape || !dtype_ok) {
          mismatches.push_back(absl::StrCat(t.name, " is ", DTypeName(e.dtype),
                                            ShapeToString(e.shape), ", expected ",
                                            DTypeName(t.dtype), ShapeToString(t.shape),
                                            spec.mode != QuantMode::kNone
                                                ? absl::StrCat(" (", spec.ToString(), ")")
                                                : std::string()));
        }
      }
    }
    AddGrouped("missing tensor", missing, &r.problems);
    AddGrouped("unsupported quantization", bad_spec, &r.problems);
    for (size_t i = 0; i < mismatches.size() && i < kMaxListed; ++i) {
      r.problems.push_back("shape/dtype mismatch: " + mismatches[i]);
    }
    if (mismatches.size() > kMaxListed) {
      r.problems.push_back(absl::StrCat("... and ", mismatches.size() - kMaxListed,
                                        " more shape/dtype mismatches"));
    }
    std::map<std::string, std::vector<int64_t>> unexpected, beyond;
    for (const auto& [name, e] : entries) {
      if (expected_names.count(name)) continue;
      const int64_t layer = LayerOf(name);
      if (layer >= cfg->num_hidden_layers) {
        beyond[KindOf(ModuleOf(name))].push_back(layer);
      } else {
        unexpected[KindOf(ModuleOf(name)) + "." + name.substr(ModuleOf(name).size() + 1)]
            .push_back(layer);
      }
    }
    AddGrouped("unexpected tensor (ignored)", unexpected, &r.warnings);
    if (!beyond.empty()) {
      std::vector<int64_t> layers;
      for (const auto& [k, l] : beyond) layers.insert(layers.end(), l.begin(), l.end());
      std::sort(layers.begin(), layers.end());
      layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
      r.warnings.push_back(absl::StrCat("tensors of layers ", Ranges(layers),
                                        " >= num_hidden_layers (MTP) are ignored"));
    }
  }

  // Per layer.
  const int64_t num_layers = cfg ? cfg->num_hidden_layers : 0;
  std::map<int64_t, InspectLayer> layers;
  for (int64_t i = 0; i < num_layers; ++i) {
    InspectLayer l;
    l.index = i;
    l.mlp = cfg->is_moe_layer(i) ? "moe" : "dense";
    if (cfg->model_type == "glm_moe_dsa" || cfg->model_type == "deepseek_v32") {
      l.indexer = cfg->has_indexer_weights(i) ? "full" : "shared";
    }
    layers[i] = l;
  }
  for (const auto& [name, e] : entries) {
    const int64_t layer = LayerOf(name);
    if (layer < 0) {
      r.non_layer_bytes += e.end - e.begin;
      continue;
    }
    InspectLayer& l = layers[layer];
    l.index = layer;
    if (cfg && layer >= num_layers) l.mlp = "extra";  // e.g. an MTP layer
    if (!cfg) {  // infer from names
      if (absl::StrContains(name, ".switch_mlp.")) l.mlp = "moe";
      if (l.mlp.empty()) l.mlp = "dense";
      if (absl::StrContains(name, ".indexer.")) l.indexer = "full";
    }
    ++l.tensors;
    l.bytes += e.end - e.begin;
  }
  for (auto& [i, l] : layers) {
    if (l.mlp.empty()) l.mlp = "dense";
    r.layers.push_back(l);
  }

  // Storage per module kind.
  std::map<std::string, std::vector<const TensorEntry*>> modules;
  for (const auto& [name, e] : entries) modules[ModuleOf(name)].push_back(&e);
  std::map<std::tuple<std::string, std::string, std::string>, InspectGroup> groups;
  for (const auto& [module, tensors] : modules) {
    const TensorEntry* weight = nullptr;
    bool has_scales = false;
    uint64_t bytes = 0;
    std::vector<std::string> dtypes;
    for (const TensorEntry* t : tensors) {
      bytes += t->end - t->begin;
      const std::string leaf = t->name.substr(module.size() + 1);
      if (leaf == "weight") weight = t;
      if (leaf == "scales") has_scales = true;
      const std::string dn = DTypeName(t->dtype);
      if (std::find(dtypes.begin(), dtypes.end(), dn) == dtypes.end()) dtypes.push_back(dn);
    }
    std::sort(dtypes.begin(), dtypes.end());
    std::string storage, shape;
    const bool quantized = has_scales && weight && weight->dtype == DType::kU32;
    auto exp = expected.find(module);
    if (quantized) {
      storage = cfg ? cfg->quantization.SpecFor(module, true).ToString() : std::string("quantized");
      shape = exp != expected.end() ? ShapeToString(exp->second.shape)
                                    : ShapeToString(weight->shape) + " (packed)";
    } else {
      storage = absl::StrJoin(dtypes, "+");
      shape = weight ? ShapeToString(weight->shape)
                     : (tensors.empty() ? std::string() : ShapeToString(tensors[0]->shape));
    }
    InspectGroup& g = groups[{KindOf(module), storage, shape}];
    g.kind = KindOf(module);
    g.storage = storage;
    g.shape = shape;
    ++g.count;
    g.bytes += bytes;
    const int64_t layer = LayerOf(module + ".");
    if (layer >= 0) g.layers.push_back(layer);
  }
  for (auto& [key, g] : groups) {
    std::sort(g.layers.begin(), g.layers.end());
    r.groups.push_back(g);
  }
  return r;
}

std::string InspectReport::ToText() const {
  std::string s;
  absl::StrAppend(&s, "checkpoint  ", dir, "\n");
  if (config) {
    const ModelConfig& c = *config;
    absl::StrAppend(&s, "model       ", model_type,
                    architecture.empty() ? "" : absl::StrCat(" (", architecture, ")"), ", ",
                    c.num_hidden_layers, " layers, hidden ", c.hidden_size, ", vocab ",
                    c.vocab_size, "\n");
  } else {
    absl::StrAppend(&s, "model       ", model_type.empty() ? "(no model_type)" : model_type,
                    architecture.empty() ? "" : absl::StrCat(" (", architecture, ")"), "\n");
  }
  absl::StrAppend(&s, "quant       ", quantization, "\n");
  absl::StrAppend(&s, "weights     ", num_files, num_files == 1 ? " file, " : " files, ",
                  num_tensors, " tensors, ", HumanBytes(total_bytes), " (outside layers ",
                  HumanBytes(non_layer_bytes), ")\n");
  std::string eos;
  if (config && !config->eos_token_ids.empty()) {
    eos = absl::StrCat(", eos [", absl::StrJoin(config->eos_token_ids, ","), "]");
  }
  absl::StrAppend(&s, "tokenizer   tokenizer.json ", has_tokenizer_json ? "yes" : "NO",
                  tokenizer_vocab > 0 ? absl::StrCat(" (", tokenizer_vocab, " ids)") : "",
                  ", tokenizer_config.json ", has_tokenizer_config ? "yes" : "no",
                  ", chat template ", chat_template.empty() ? "NO" : chat_template,
                  ", generation_config.json ", has_generation_config ? "yes" : "no", eos,
                  "\n\n");

  absl::StrAppend(&s, absl::StrFormat("%-6s %-6s %-8s %8s %12s\n", "layer", "mlp", "indexer",
                                      "tensors", "bytes"));
  for (const InspectLayer& l : layers) {
    absl::StrAppend(&s, absl::StrFormat("%-6d %-6s %-8s %8d %12s\n", l.index, l.mlp,
                                        l.indexer.empty() ? "-" : l.indexer, l.tensors,
                                        HumanBytes(l.bytes)));
  }
  absl::StrAppend(&s, "\n");
  size_t kind_width = 10;
  for (const InspectGroup& g : groups) kind_width = std::max(kind_width, g.kind.size());
  absl::StrAppend(&s, absl::StrFormat("%-*s %-14s %-20s %-10s %12s\n", kind_width, "module",
                                      "storage", "shape", "layers", "bytes"));
  for (const InspectGroup& g : groups) {
    absl::StrAppend(&s, absl::StrFormat("%-*s %-14s %-20s %-10s %12s\n", kind_width, g.kind,
                                        g.storage, g.shape, Ranges(g.layers),
                                        HumanBytes(g.bytes)));
  }
  absl::StrAppend(&s, "\n");
  for (const std::string& w : warnings) absl::StrAppend(&s, "warning: ", w, "\n");
  if (runnable()) {
    absl::StrAppend(&s, "runnable    yes\n");
  } else {
    absl::StrAppend(&s, "runnable    NO\n");
    for (const std::string& p : problems) absl::StrAppend(&s, "  - ", p, "\n");
  }
  return s;
}

std::string InspectReport::ToJson() const {
  Json j;
  j["dir"] = dir;
  j["model_type"] = model_type;
  j["architecture"] = architecture;
  if (config) {
    j["num_hidden_layers"] = config->num_hidden_layers;
    j["hidden_size"] = config->hidden_size;
    j["vocab_size"] = config->vocab_size;
    j["eos_token_ids"] = config->eos_token_ids;
  }
  j["quantization"] = quantization;
  j["num_files"] = num_files;
  j["num_tensors"] = num_tensors;
  j["total_bytes"] = total_bytes;
  j["non_layer_bytes"] = non_layer_bytes;
  Json jl = Json::array();
  for (const InspectLayer& l : layers) {
    jl.push_back({{"index", l.index},
                  {"mlp", l.mlp},
                  {"indexer", l.indexer.empty() ? Json(nullptr) : Json(l.indexer)},
                  {"tensors", l.tensors},
                  {"bytes", l.bytes}});
  }
  j["layers"] = std::move(jl);
  Json jg = Json::array();
  for (const InspectGroup& g : groups) {
    jg.push_back({{"kind", g.kind},
                  {"storage", g.storage},
                  {"shape", g.shape},
                  {"layers", g.layers},
                  {"count", g.count},
                  {"bytes", g.bytes}});
  }
  j["modules"] = std::move(jg);
  j["tokenizer"] = {{"tokenizer_json", has_tokenizer_json},
                    {"tokenizer_config_json", has_tokenizer_config},
                    {"chat_template", chat_template.empty() ? Json(nullptr) : Json(chat_template)},
                    {"generation_config_json", has_generation_config},
                    {"ids", tokenizer_vocab}};
  j["runnable"] = runnable();
  j["problems"] = problems;
  j["warnings"] = warnings;
  return j.dump(2);
}

}  // namespace ring
