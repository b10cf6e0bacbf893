// Fuzz target for the safetensors header parser: the input is a whole file (length
// prefix, JSON header, data). Built as a libFuzzer binary with -DRING_FUZZ=ON (clang), or
// linked with tests/fuzz_corpus_driver.cc to replay tests/corpus/safetensors in CI.
//
//   build-fuzz/models/safetensors_fuzz -max_total_time=60 tests/corpus/safetensors
#include <cstddef>
#include <cstdint>

#include "models/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view file(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ring::SafetensorsHeader> header =
      ring::ParseSafetensorsHeader(file, size, "fuzz-input");
  if (!header.ok()) return 0;
  // Whatever the parser accepts must be safe to read: touch the first and last byte of
  // every tensor so ASan flags any range the validation let through.
  uint8_t acc = 0;
  for (const auto& [name, entry] : header->tensors) {
    if (entry.end == entry.begin) continue;
    acc ^= data[header->data_offset + entry.begin];
    acc ^= data[header->data_offset + entry.end - 1];
  }
  volatile uint8_t sink = acc;  // keeps the reads from being optimised away
  (void)sink;
  return 0;
}
