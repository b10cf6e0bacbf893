// File: models/safetensors.h
//
// Memory-mapped safetensors checkpoints, single file or sharded
// (model.safetensors.index.json), plus a writer for `ringctl synth` and tests.
//
// Every header field is validated before any tensor byte is touched: the 8-byte length
// (bounded by kMaxHeaderBytes and the file size), JSON well-formedness, each entry's
// dtype, shape (non-negative, no overflow), shape x dtype size == byte range, ranges
// inside the data section, no two ranges overlapping. A corrupt, truncated or lying file
// yields InvalidArgument/DataLoss naming the file and the tensor; never a crash or an
// out-of-bounds read.
//
// A Checkpoint opens shard files lazily: asking only for one stage's tensors maps only the
// shards that hold them, and mmap pages are read only when used.
#ifndef RINGSERVE_MODELS_SAFETENSORS_H_
#define RINGSERVE_MODELS_SAFETENSORS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "kernels/tensor.h"

namespace ring {

inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // 100 MiB, as the HF reference

struct TensorEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin = 0;  // offsets relative to the start of the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;                     // 8 + header length
};

// Parses and validates the header of a file whose first bytes are `prefix` (at least the
// 8 length bytes and the JSON) and whose total size is `file_size`. `file_name` is used in
// error messages. Pure function; the fuzz target drives it.
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view prefix,
                                                         uint64_t file_size,
                                                         absl::string_view file_name);

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const SafetensorsHeader& header() const { return header_; }
  // NotFound naming the file if absent. The view lives as long as this object.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;

 private:
  SafetensorsFile() = default;
  std::string path_;
  SafetensorsHeader header_;
  const uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
};

// A model directory: model.safetensors, or shards listed by model.safetensors.index.json,
// or (no index) every *.safetensors file in the directory.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // All tensor names (sorted). For an indexed checkpoint this reads only the index.
  std::vector<std::string> Names() const;
  bool Has(absl::string_view name) const;
  // Maps the shard holding `name` on first use. Thread-safe.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  // Header entry (dtype, shape, byte range) without mapping data where possible.
  absl::StatusOr<TensorEntry> Describe(absl::string_view name) const;
  // Number of shard files mapped so far (tests check lazy loading).
  int NumFilesOpened() const;

 private:
  Checkpoint() = default;
  absl::StatusOr<const SafetensorsFile*> FileFor(absl::string_view name) const;
  std::string dir_;
  std::map<std::string, std::string, std::less<>> weight_map_;  // tensor -> file name
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;
};

// Writes safetensors files the way mlx-lm's save_model does: tensors sorted by name,
// header metadata {"format": "mlx"}, shards of at most `max_shard_bytes` (tensors kept
// whole) named model-0000i-of-0000N.safetensors plus model.safetensors.index.json, or a
// single model.safetensors when everything fits. Tensors are buffered per shard, so a
// checkpoint larger than memory can be written tensor by tensor.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string dir, uint64_t max_shard_bytes = 5ull << 30);
  // Takes ownership of the bytes; size must equal numel(shape) * DTypeSize(dtype).
  absl::Status Add(const std::string& name, DType dtype, const Shape& shape,
                   std::vector<uint8_t> bytes);
  // Writes all files. total_parameters is recorded in the index metadata.
  absl::Status Finish(uint64_t total_parameters = 0);

 private:
  struct Pending {
    DType dtype;
    Shape shape;
    std::string spill_path;  // bytes spilled to a temp file when large
    std::vector<uint8_t> bytes;
  };
  std::string dir_;
  uint64_t max_shard_bytes_;
  std::map<std::string, Pending> pending_;
};

// Writes one safetensors file with the given tensors (all in memory). For tests and tools.
struct TensorBytes {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, TensorBytes>& tensors,
                              const std::map<std::string, std::string>& metadata);

}  // namespace ring

#endif  // RINGSERVE_MODELS_SAFETENSORS_H_
