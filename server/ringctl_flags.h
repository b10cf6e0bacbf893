// File: server/ringctl_flags.h
//
// Flag parsers shared by ringctl subcommands; errors name the flag.
#ifndef RINGSERVE_SERVER_RINGCTL_FLAGS_H_
#define RINGSERVE_SERVER_RINGCTL_FLAGS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/ops.h"

namespace ring::ctl {

// "1,2,3" -> {1, 2, 3}; "" -> {}.
absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& s, const char* flag);
// --act: "auto" (the checkpoint's dtype: nullopt), "bf16" or "f32".
absl::StatusOr<std::optional<cpu::ActDType>> ParseActFlag(const std::string& s);

}  // namespace ring::ctl

#endif  // RINGSERVE_SERVER_RINGCTL_FLAGS_H_
