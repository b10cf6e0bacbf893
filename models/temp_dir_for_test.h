// File: models/temp_dir_for_test.h  (tests only)
//
// A gtest fixture owning a fresh temporary directory (dir_) that is removed after the test.
#ifndef RINGSERVE_MODELS_TEMP_DIR_FOR_TEST_H_
#define RINGSERVE_MODELS_TEMP_DIR_FOR_TEST_H_

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "gtest/gtest.h"

namespace ring {

class TempDirTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ring_test_XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::filesystem::path dir_;
};

}  // namespace ring

#endif  // RINGSERVE_MODELS_TEMP_DIR_FOR_TEST_H_
