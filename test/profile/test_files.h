// Test helpers: a fresh temporary directory per test and the example files.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cupcake/proto/file_io.h"

namespace cupcake::testing {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "cupcake-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string File(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string ExamplePath(const std::string& rel) { return std::string(CUPCAKE_SOURCE_DIR) + "/examples/" + rel; }

inline std::string ReadExample(const std::string& rel) {
  auto text = ReadFile(ExamplePath(rel));
  EXPECT_TRUE(text.ok()) << text.status().ToString();
  return text.ok() ? *text : "";
}

}  // namespace cupcake::testing
