#include "models/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/status.h"
#include "nlohmann/json.hpp"

namespace ring {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr char kIndexName[] = "model.safetensors.index.json";
constexpr char kSingleName[] = "model.safetensors";

absl::Status Invalid(absl::string_view file, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
}
absl::Status InvalidTensor(absl::string_view file, absl::string_view tensor,
                           absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", tensor, "': ", what));
}

uint64_t LoadLe64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  return v;
}

// A JSON integer >= 0. Floats ("2.0") and negatives are rejected: safetensors writes
// plain unsigned integers.
std::optional<uint64_t> AsUint(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer() && v.get<int64_t>() >= 0) return v.get<int64_t>();
  return std::nullopt;
}

absl::StatusOr<TensorEntry> ParseEntry(absl::string_view file, const std::string& name,
                                       const json& v, uint64_t data_size) {
  if (!v.is_object()) return InvalidTensor(file, name, "entry is not a JSON object");
  auto dtype_it = v.find("dtype");
  if (dtype_it == v.end() || !dtype_it->is_string()) {
    return InvalidTensor(file, name, "missing or non-string \"dtype\"");
  }
  std::optional<DType> dtype = ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype) {
    return InvalidTensor(
        file, name,
        absl::StrCat("unknown dtype \"", dtype_it->get_ref<const std::string&>(), "\""));
  }
  TensorEntry e;
  e.name = name;
  e.dtype = *dtype;

  auto shape_it = v.find("shape");
  if (shape_it == v.end() || !shape_it->is_array()) {
    return InvalidTensor(file, name, "missing or non-array \"shape\"");
  }
  int64_t numel = 1;
  for (const json& d : *shape_it) {
    std::optional<uint64_t> dim = AsUint(d);
    if (!dim || *dim > static_cast<uint64_t>(INT64_MAX)) {
      return InvalidTensor(file, name, "shape entries must be integers in [0, 2^63)");
    }
    e.shape.push_back(static_cast<int64_t>(*dim));
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(*dim), &numel)) {
      return InvalidTensor(file, name, "element count overflows int64");
    }
  }
  int64_t nbytes = 0;
  if (__builtin_mul_overflow(numel, static_cast<int64_t>(DTypeSize(e.dtype)), &nbytes)) {
    return InvalidTensor(file, name, "byte size overflows int64");
  }

  auto off_it = v.find("data_offsets");
  if (off_it == v.end() || !off_it->is_array() || off_it->size() != 2) {
    return InvalidTensor(file, name, "\"data_offsets\" must be an array [begin, end]");
  }
  std::optional<uint64_t> begin = AsUint((*off_it)[0]);
  std::optional<uint64_t> end = AsUint((*off_it)[1]);
  if (!begin || !end)
    return InvalidTensor(file, name, "data_offsets must be non-negative integers");
  e.begin = *begin;
  e.end = *end;
  if (e.begin > e.end) {
    return InvalidTensor(file, name,
                         absl::StrCat("data_offsets [", e.begin, ", ", e.end, "] has begin > end"));
  }
  if (e.end - e.begin != static_cast<uint64_t>(nbytes)) {
    return InvalidTensor(file, name,
                         absl::StrCat("shape ", ShapeToString(e.shape), " x ", DTypeName(e.dtype),
                                      " is ", nbytes, " bytes but data_offsets [", e.begin, ", ",
                                      e.end, "] span ", e.end - e.begin));
  }
  if (e.end > data_size) {
    return absl::DataLossError(absl::StrCat(file, ": tensor '", name, "': data_offsets end ", e.end,
                                            " is past the data section (", data_size,
                                            " bytes); truncated file?"));
  }
  return e;
}

absl::StatusOr<std::map<std::string, std::string>> ParseMetadata(absl::string_view file,
                                                                 const json& v) {
  std::map<std::string, std::string> out;
  if (v.is_null()) return out;
  if (!v.is_object()) return Invalid(file, "\"__metadata__\" must be an object of strings");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return Invalid(file,
                     absl::StrCat("\"__metadata__\" value for \"", key, "\" is not a string"));
    }
    out[key] = value.get<std::string>();
  }
  return out;
}

// Zero-length tensors share no bytes with anything, so only non-empty ranges are compared.
absl::Status CheckNoOverlap(absl::string_view file, const SafetensorsHeader& h) {
  std::vector<const TensorEntry*> ranges;
  for (const auto& [name, e] : h.tensors) {
    if (e.end > e.begin) ranges.push_back(&e);
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const TensorEntry* a, const TensorEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i]->begin < ranges[i - 1]->end) {
      return Invalid(file, absl::StrCat("tensors '", ranges[i - 1]->name, "' and '",
                                        ranges[i]->name, "' have overlapping data_offsets"));
    }
  }
  return absl::OkStatus();
}

absl::Status ErrnoError(absl::string_view what, absl::string_view path) {
  return absl::ErrnoToStatus(errno, absl::StrCat(what, " ", path));
}

// Reads and parses only the header of a safetensors file (two preads), without mapping it.
absl::StatusOr<SafetensorsHeader> ReadHeaderOnly(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    absl::Status s = ErrnoError("cannot stat", path);
    close(fd);
    return s;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string buf(8, '\0');
  if (size >= 8 && pread(fd, buf.data(), 8, 0) == 8) {
    const uint64_t n = LoadLe64(buf.data());
    // Bound the allocation before trusting n; the parser re-checks with the full message.
    if (n <= kMaxHeaderBytes && n <= size - 8) {
      buf.resize(8 + n);
      if (pread(fd, buf.data() + 8, n, 8) != static_cast<ssize_t>(n)) buf.resize(8);
    }
  } else {
    buf.clear();
  }
  close(fd);
  return ParseSafetensorsHeader(buf, size, path);
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat("cannot read ", path, ": ", ec.message()));
  if (size > max_bytes)
    return Invalid(path, absl::StrCat("file is larger than ", max_bytes, " bytes"));
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (!in) return absl::DataLossError(absl::StrCat("cannot read ", path));
  return ss.str();
}

// A shard name from an index must stay inside the checkpoint directory.
bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view prefix,
                                                         uint64_t file_size,
                                                         absl::string_view file_name) {
  if (file_size < 8 || prefix.size() < 8) {
    return absl::DataLossError(
        absl::StrCat(file_name, ": ", file_size, " bytes is too short for a safetensors file"));
  }
  const uint64_t n = LoadLe64(prefix.data());
  if (n > kMaxHeaderBytes) {
    return Invalid(file_name, absl::StrCat("header length ", n, " exceeds the limit of ",
                                           kMaxHeaderBytes, " bytes"));
  }
  if (n > file_size - 8) {
    return absl::DataLossError(absl::StrCat(file_name, ": header length ", n,
                                            " runs past the end of the ", file_size, "-byte file"));
  }
  if (prefix.size() - 8 < n) {
    return Invalid(file_name, absl::StrCat("only ", prefix.size(), " bytes available for a ", n,
                                           "-byte header"));
  }
  // The HF writer pads the JSON with spaces, MLX's writer terminates it with a NUL. Strip
  // both; any NUL left is rejected explicitly because nlohmann would treat it as end of
  // input and silently ignore what follows.
  absl::string_view text = prefix.substr(8, n);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\0')) text.remove_suffix(1);
  if (text.find('\0') != absl::string_view::npos) {
    return Invalid(file_name, "header contains a NUL byte");
  }
  const json root = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Invalid(file_name, "header is not valid JSON");
  if (!root.is_object()) return Invalid(file_name, "header is not a JSON object");

  SafetensorsHeader h;
  h.data_offset = 8 + n;
  const uint64_t data_size = file_size - h.data_offset;
  for (const auto& [name, value] : root.items()) {
    if (name == "__metadata__") {
      RING_ASSIGN_OR_RETURN(h.metadata, ParseMetadata(file_name, value));
      continue;
    }
    RING_ASSIGN_OR_RETURN(TensorEntry e, ParseEntry(file_name, name, value, data_size));
    h.tensors.emplace(name, std::move(e));
  }
  RING_RETURN_IF_ERROR(CheckNoOverlap(file_name, h));
  return h;
}

// ---------------------------------------------------------------------------------------
// SafetensorsFile

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError("cannot open", path);
  struct stat st;
  absl::Status stat_status;
  if (fstat(fd, &st) != 0) {
    stat_status = ErrnoError("cannot stat", path);
  } else if (!S_ISREG(st.st_mode)) {
    stat_status = Invalid(path, "not a regular file");
  }
  if (!stat_status.ok()) {
    close(fd);
    return stat_status;
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < 8) {
    close(fd);
    return absl::DataLossError(
        absl::StrCat(path, ": ", size, " bytes is too short for a safetensors file"));
  }
  // MAP_PRIVATE + PROT_READ: we never write, and a private mapping keeps our view stable
  // against anyone else writing the file through a shared mapping.
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  close(fd);
  if (map == MAP_FAILED) return absl::ErrnoToStatus(map_errno, absl::StrCat("cannot mmap ", path));

  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = static_cast<const uint8_t*>(map);
  file->size_ = size;
  RING_ASSIGN_OR_RETURN(
      file->header_,
      ParseSafetensorsHeader(absl::string_view(reinterpret_cast<const char*>(file->map_), size),
                             size, path));
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) munmap(const_cast<uint8_t*>(map_), size_);
}

absl::StatusOr<TensorView> SafetensorsFile::Get(absl::string_view name) const {
  auto it = header_.tensors.find(std::string(name));
  if (it == header_.tensors.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  const TensorEntry& e = it->second;
  TensorView v;
  v.dtype = e.dtype;
  v.shape = e.shape;
  v.data = map_ + header_.data_offset + e.begin;
  return v;
}

// ---------------------------------------------------------------------------------------
// Checkpoint

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(absl::StrCat(dir, ": not a checkpoint directory"));
  }
  std::unique_ptr<Checkpoint> ckpt(new Checkpoint());
  ckpt->dir_ = dir;
  const std::string index_path = (fs::path(dir) / kIndexName).string();

  if (fs::exists(index_path, ec)) {
    ckpt->index_path_ = index_path;
    RING_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(index_path, kMaxHeaderBytes));
    const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object()) {
      return Invalid(index_path, "not a valid JSON object");
    }
    auto wm = root.find("weight_map");
    if (wm == root.end() || !wm->is_object() || wm->empty()) {
      return Invalid(index_path, "missing or empty \"weight_map\" object");
    }
    std::set<std::string> checked;
    for (const auto& [tensor, file] : wm->items()) {
      if (!file.is_string() || !IsPlainFileName(file.get_ref<const std::string&>())) {
        return Invalid(index_path, absl::StrCat("weight_map entry for '", tensor,
                                                "' is not a file name in the directory"));
      }
      const std::string& name = file.get_ref<const std::string&>();
      if (checked.insert(name).second && !fs::is_regular_file(fs::path(dir) / name, ec)) {
        return absl::NotFoundError(absl::StrCat(index_path, ": shard '", name, "' (holding '",
                                                tensor, "') does not exist"));
      }
      ckpt->weight_map_.emplace(tensor, name);
    }
    return ckpt;
  }

  std::vector<std::string> files;
  fs::directory_iterator it(dir, ec);
  for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
    std::error_code entry_ec;
    if (it->path().extension() == ".safetensors" && it->is_regular_file(entry_ec)) {
      files.push_back(it->path().filename().string());
    }
  }
  if (ec) return absl::NotFoundError(absl::StrCat(dir, ": cannot list: ", ec.message()));
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no ", kIndexName, " and no *.safetensors file"));
  }
  std::sort(files.begin(), files.end());
  for (const std::string& file : files) {
    RING_ASSIGN_OR_RETURN(SafetensorsHeader header,
                          ReadHeaderOnly((fs::path(dir) / file).string()));
    for (const auto& [tensor, entry] : header.tensors) {
      auto [it, inserted] = ckpt->weight_map_.emplace(tensor, file);
      if (!inserted) {
        return Invalid(dir, absl::StrCat("tensor '", tensor, "' is in both ", it->second, " and ",
                                         file, " (and there is no index to choose)"));
      }
    }
    ckpt->headers_.emplace(file, std::move(header));
  }
  return ckpt;
}

std::string Checkpoint::MapSource() const { return index_path_.empty() ? dir_ : index_path_; }

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(weight_map_.size());
  for (const auto& [name, file] : weight_map_) names.push_back(name);
  return names;
}

bool Checkpoint::Has(absl::string_view name) const {
  return weight_map_.find(name) != weight_map_.end();
}

absl::StatusOr<const SafetensorsHeader*> Checkpoint::HeaderFor(const std::string& file) const {
  if (auto it = files_.find(file); it != files_.end()) return &it->second->header();
  if (auto it = headers_.find(file); it != headers_.end()) return &it->second;
  RING_ASSIGN_OR_RETURN(SafetensorsHeader header, ReadHeaderOnly((fs::path(dir_) / file).string()));
  return &headers_.emplace(file, std::move(header)).first->second;
}

absl::StatusOr<const SafetensorsFile*> Checkpoint::FileFor(absl::string_view name) const {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor '", name, "' in the checkpoint"));
  }
  const std::string& file = it->second;
  auto open = files_.find(file);
  if (open == files_.end()) {
    RING_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> f,
                          SafetensorsFile::Open((fs::path(dir_) / file).string()));
    headers_.erase(file);  // the mapped file's header supersedes the cached copy
    open = files_.emplace(file, std::move(f)).first;
  }
  if (!open->second->header().tensors.contains(std::string(name))) {
    return absl::NotFoundError(absl::StrCat(MapSource(), ": lists tensor '", name, "' in ", file,
                                            ", but that file has no such tensor"));
  }
  return open->second.get();
}

absl::StatusOr<TensorView> Checkpoint::Get(absl::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  RING_ASSIGN_OR_RETURN(const SafetensorsFile* file, FileFor(name));
  return file->Get(name);
}

absl::StatusOr<TensorEntry> Checkpoint::Describe(absl::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": no tensor '", name, "' in the checkpoint"));
  }
  RING_ASSIGN_OR_RETURN(const SafetensorsHeader* header, HeaderFor(it->second));
  auto entry = header->tensors.find(std::string(name));
  if (entry == header->tensors.end()) {
    return absl::NotFoundError(absl::StrCat(MapSource(), ": lists tensor '", name, "' in ",
                                            it->second, ", but that file has no such tensor"));
  }
  return entry->second;
}

int Checkpoint::NumFilesOpened() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(files_.size());
}

// ---------------------------------------------------------------------------------------
// Writing

namespace {

absl::StatusOr<int64_t> CheckedByteSize(absl::string_view name, DType dtype, const Shape& shape) {
  int64_t n = DTypeSize(dtype);
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "': invalid shape ", ShapeToString(shape)));
    }
  }
  return n;
}

absl::Status WriteAll(std::FILE* f, const void* data, size_t size, const std::string& path) {
  if (size != 0 && std::fwrite(data, 1, size, f) != size) return ErrnoError("cannot write", path);
  return absl::OkStatus();
}

absl::Status WriteFileContents(const std::string& path, const std::string& header,
                               const std::map<std::string, TensorBytes>& tensors) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return ErrnoError("cannot create", path);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  absl::Status s = WriteAll(f, len, 8, path);
  if (s.ok()) s = WriteAll(f, header.data(), header.size(), path);
  for (auto it = tensors.begin(); s.ok() && it != tensors.end(); ++it) {
    s = WriteAll(f, it->second.bytes.data(), it->second.bytes.size(), path);
  }
  if (std::fclose(f) != 0 && s.ok()) s = ErrnoError("cannot write", path);
  if (!s.ok()) std::remove(path.c_str());
  return s;
}

std::string ShardName(size_t i, size_t n) {
  return absl::StrFormat("model-%05d-of-%05d.safetensors", i + 1, n);
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path,
                              const std::map<std::string, TensorBytes>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json root = json::object();
  if (!metadata.empty()) root["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    RING_ASSIGN_OR_RETURN(int64_t nbytes, CheckedByteSize(name, t.dtype, t.shape));
    if (name.empty() || name == "__metadata__") {
      return absl::InvalidArgumentError(absl::StrCat(path, ": invalid tensor name '", name, "'"));
    }
    if (static_cast<uint64_t>(nbytes) != t.bytes.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": tensor '", name, "': ", t.bytes.size(), " bytes given, shape ",
                       ShapeToString(t.shape), " x ", DTypeName(t.dtype), " needs ", nbytes));
    }
    root[name] = {{"dtype", DTypeName(t.dtype)},
                  {"shape", t.shape},
                  {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string header;
  try {
    header = root.dump();
  } catch (const json::exception&) {  // only invalid UTF-8 in a name can make dump throw
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": tensor names and metadata must be UTF-8"));
  }
  header.append((8 - header.size() % 8) % 8, ' ');
  return WriteFileContents(path, header, tensors);
}

CheckpointWriter::CheckpointWriter(std::string dir, uint64_t max_shard_bytes)
    : dir_(std::move(dir)), max_shard_bytes_(max_shard_bytes) {}

CheckpointWriter::~CheckpointWriter() {
  if (finished_) return;
  for (const std::string& path : shard_paths_) std::remove(path.c_str());
}

absl::Status CheckpointWriter::Add(const std::string& name, DType dtype, const Shape& shape,
                                   std::vector<uint8_t> bytes) {
  if (finished_) return absl::FailedPreconditionError("CheckpointWriter: Add after Finish");
  RING_ASSIGN_OR_RETURN(int64_t nbytes, CheckedByteSize(name, dtype, shape));
  if (static_cast<uint64_t>(nbytes) != bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': ", bytes.size(),
                                                   " bytes given, shape ", ShapeToString(shape),
                                                   " x ", DTypeName(dtype), " needs ", nbytes));
  }
  if (name.empty() || name == "__metadata__") {
    return absl::InvalidArgumentError(absl::StrCat("invalid tensor name '", name, "'"));
  }
  if (tensor_shard_.contains(name)) {
    return absl::AlreadyExistsError(absl::StrCat("tensor '", name, "' added twice"));
  }
  if (!shard_.empty() && shard_bytes_ + bytes.size() > max_shard_bytes_) {
    RING_RETURN_IF_ERROR(FlushShard());
  }
  tensor_shard_[name] = shard_paths_.size();
  shard_bytes_ += bytes.size();
  total_bytes_ += bytes.size();
  shard_.emplace(name, TensorBytes{dtype, shape, std::move(bytes)});
  if (shard_bytes_ >= max_shard_bytes_) RING_RETURN_IF_ERROR(FlushShard());
  return absl::OkStatus();
}

absl::Status CheckpointWriter::FlushShard() {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", dir_, ": ", ec.message()));
  // Temporary names end in .tmp so that an interrupted write never looks like a shard.
  const std::string path =
      (fs::path(dir_) / absl::StrFormat("model-%05d.safetensors.tmp", shard_paths_.size() + 1))
          .string();
  RING_RETURN_IF_ERROR(WriteSafetensors(path, shard_, {{"format", "mlx"}}));
  shard_paths_.push_back(path);
  shard_.clear();
  shard_bytes_ = 0;
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Finish(uint64_t total_parameters) {
  if (finished_) return absl::FailedPreconditionError("CheckpointWriter: Finish called twice");
  if (!shard_.empty() || shard_paths_.empty()) RING_RETURN_IF_ERROR(FlushShard());
  const size_t n = shard_paths_.size();
  const fs::path dir(dir_);
  std::error_code ec;
  // A stale index from an earlier write would make readers ignore the new files.
  fs::remove(dir / kIndexName, ec);
  std::vector<std::string> names;
  for (size_t i = 0; i < n; ++i) {
    names.push_back(n == 1 ? kSingleName : ShardName(i, n));
    fs::rename(shard_paths_[i], dir / names.back(), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("cannot rename ", shard_paths_[i], " to ",
                                              names.back(), ": ", ec.message()));
    }
    shard_paths_[i] = (dir / names.back()).string();
  }
  finished_ = true;  // the shards are in place; nothing left for the destructor to clean
  // mlx-lm's save_model writes the index even for a single file; so do we.

  json index = {
      {"metadata", {{"total_size", total_bytes_}, {"total_parameters", total_parameters}}},
      {"weight_map", json::object()}};
  for (const auto& [tensor, shard] : tensor_shard_) index["weight_map"][tensor] = names[shard];
  const std::string path = (dir / kIndexName).string();
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << index.dump(4) << "\n";
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace ring
