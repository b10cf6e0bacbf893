// Replays every file of a corpus directory through LLVMFuzzerTestOneInput, so a fuzz
// target's committed corpus runs as an ordinary test without libFuzzer (e.g. under gcc).
// A crash fails the test by killing the process; a non-zero return counts as a failure.
//
//   build/models/safetensors_fuzz tests/corpus/safetensors   # prints "28 passed, 0 failed"
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(argv[1], ec)) {
    if (entry.is_regular_file()) files.push_back(entry.path());
  }
  if (ec || files.empty()) {
    std::fprintf(stderr, "%s: missing or empty corpus directory\n", argv[1]);
    return 2;
  }
  int passed = 0, failed = 0;
  for (const auto& path : files) {
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    // An exact-size heap copy, so ASan builds catch reads past the end of the input.
    auto* data = new uint8_t[bytes.size()];
    std::copy(bytes.begin(), bytes.end(), data);
    if (LLVMFuzzerTestOneInput(data, bytes.size()) == 0) {
      ++passed;
    } else {
      ++failed;
      std::fprintf(stderr, "FAILED: %s\n", path.c_str());
    }
    delete[] data;
  }
  std::printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
