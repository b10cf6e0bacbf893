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
// error messages. Trailing spaces (the HF writer's padding) and NUL bytes (MLX's writer
// terminates the JSON with one) after the JSON are accepted. Pure function; the fuzz
// target drives it.
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
  // Reads the index (checking that every shard it names exists) or, without an index, the
  // header of every *.safetensors file; maps nothing. Two files of an index-less directory
  // holding the same tensor name is an error.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  // All tensor names (sorted). For an indexed checkpoint this reads only the index.
  std::vector<std::string> Names() const;
  bool Has(absl::string_view name) const;
  // Maps the shard holding `name` on first use. Thread-safe.
  absl::StatusOr<TensorView> Get(absl::string_view name) const;
  // Header entry (dtype, shape, byte range). Reads only the shard's header (cached); never
  // maps the shard, so it does not count in NumFilesOpened.
  absl::StatusOr<TensorEntry> Describe(absl::string_view name) const;
  // Number of shard files mapped so far (tests check lazy loading).
  int NumFilesOpened() const;

 private:
  Checkpoint() = default;
  // Both require mu_ held. FileFor maps the shard; HeaderFor only reads its header.
  absl::StatusOr<const SafetensorsFile*> FileFor(absl::string_view name) const;
  absl::StatusOr<const SafetensorsHeader*> HeaderFor(const std::string& file) const;
  // Where a tensor-to-file mapping came from, for errors ("<dir>/model.safetensors.index.json").
  std::string MapSource() const;

  std::string dir_;
  std::string index_path_;  // empty when the directory has no index
  std::map<std::string, std::string, std::less<>> weight_map_;  // tensor -> file name
  mutable std::mutex mu_;
  mutable std::map<std::string, std::unique_ptr<SafetensorsFile>> files_;  // mapped shards
  mutable std::map<std::string, SafetensorsHeader> headers_;  // headers read without mapping
};

// Writes one safetensors file with the given tensors (all in memory). For tests and tools.
// The header lists tensors sorted by name, data follows in the same order, and the JSON is
// padded with spaces so the data section starts 8-byte aligned (as the HF writer does).
// `metadata` becomes "__metadata__" (omitted when empty).
struct TensorBytes {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};
absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, TensorBytes>& tensors,
                              const std::map<std::string, std::string>& metadata);

// Writes a checkpoint directory the way mlx-lm's save_model does: header metadata
// {"format": "mlx"}, shards of at most `max_shard_bytes` of tensor data (tensors kept
// whole; a tensor larger than the budget gets a shard of its own) named
// model-0000i-of-0000N.safetensors plus model.safetensors.index.json
// ({"metadata": {"total_size", "total_parameters"}, "weight_map"}), or a single
// model.safetensors (still with the index, as mlx-lm) when everything fits in one shard.
//
// Memory: only the shard being filled is held. A shard is written to disk (under a
// temporary name, renamed by Finish once N is known) as soon as its budget is reached, so
// a checkpoint larger than memory can be written tensor by tensor. Consequently tensors
// are distributed over shards in Add order; within each shard, header and data are
// sorted by name. (mlx-lm sorts globally before sharding; the index is sorted either way.)
// If Finish is never reached, the destructor removes the temporary shards.
class CheckpointWriter {
 public:
  explicit CheckpointWriter(std::string dir, uint64_t max_shard_bytes = 5ull << 30);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Takes ownership of the bytes; size must equal numel(shape) * DTypeSize(dtype).
  absl::Status Add(const std::string& name, DType dtype, const Shape& shape,
                   std::vector<uint8_t> bytes);
  // Writes all files. total_parameters is recorded in the index metadata.
  absl::Status Finish(uint64_t total_parameters = 0);

 private:
  absl::Status FlushShard();

  std::string dir_;
  uint64_t max_shard_bytes_;
  std::map<std::string, TensorBytes> shard_;  // the shard being filled
  uint64_t shard_bytes_ = 0;
  std::vector<std::string> shard_paths_;        // flushed shards, temporary names
  std::map<std::string, size_t> tensor_shard_;  // every tensor -> index in shard_paths_
  uint64_t total_bytes_ = 0;
  bool finished_ = false;
};

}  // namespace ring

#endif  // RINGSERVE_MODELS_SAFETENSORS_H_
