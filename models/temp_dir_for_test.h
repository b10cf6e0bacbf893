// File: models/temp_dir_for_test.h  (tests only)
//
// A gtest fixture owning a fresh temporary directory (dir_) that is removed after the test,
// with a helper that synthesizes tiny checkpoints into it.
#ifndef RINGSERVE_MODELS_TEMP_DIR_FOR_TEST_H_
#define RINGSERVE_MODELS_TEMP_DIR_FOR_TEST_H_

#include <stdlib.h>

#include <filesystem>
#include <optional>
#include <string>

#include "gtest/gtest.h"
#include "models/synth.h"

namespace ring {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ring_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // Writes the "tiny" preset of `arch` (in `quant`, else the preset's default) to
  // dir_/name; fails the test if it cannot.
  void SynthTiny(const std::string& name, const std::string& arch,
                 std::optional<QuantSpec> quant = std::nullopt) {
    SynthOptions o;
    o.arch = arch;
    o.preset = "tiny";
    if (quant) o.quant = *quant;
    o.out_dir = (dir_ / name).string();
    ASSERT_TRUE(SynthesizeCheckpoint(o).ok());
  }
  std::filesystem::path dir_;
};

}  // namespace ring

#endif  // RINGSERVE_MODELS_TEMP_DIR_FOR_TEST_H_
