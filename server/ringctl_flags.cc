#include "server/ringctl_flags.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace ring::ctl {

absl::StatusOr<std::vector<int32_t>> ParseTokenList(const std::string& s, const char* flag) {
  std::vector<int32_t> out;
  if (s.empty()) return out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipWhitespace())) {
    int32_t v;
    if (!absl::SimpleAtoi(part, &v)) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": '", part, "' is not a token id"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::optional<cpu::ActDType>> ParseActFlag(const std::string& s) {
  if (s == "auto") return std::optional<cpu::ActDType>();
  if (s == "f32") return std::optional<cpu::ActDType>(cpu::ActDType::kF32);
  if (s == "bf16") return std::optional<cpu::ActDType>(cpu::ActDType::kBF16);
  return absl::InvalidArgumentError("--act must be auto, bf16 or f32");
}

}  // namespace ring::ctl
