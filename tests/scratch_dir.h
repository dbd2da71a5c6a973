// Hostile files for the loader tests (issue 28): a scratch folder removed with its contents at the
// end of the test, and helpers that put a text, a FIFO, a sparse file of any size or a link in it.
// Header-only; used by tests/test_safetensors.cpp, test_tokenizer.cpp and test_model_runner.cpp.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace moekit::testing {

class ScratchDir {
 public:
  ScratchDir() {
    std::string t = ::testing::TempDir() + "moekit_scratch_XXXXXX";
    if (::mkdtemp(&t[0]) != nullptr) path_ = t;
    EXPECT_FALSE(path_.empty()) << "mkdtemp failed";
  }
  ~ScratchDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;

  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

  // Each returns the new entry's path.
  std::string text(const std::string& name, const std::string& content) const {
    std::ofstream(file(name), std::ios::binary) << content;
    return file(name);
  }
  std::string folder(const std::string& name) const {
    std::filesystem::create_directories(file(name));
    return file(name);
  }
  std::string fifo(const std::string& name) const {
    EXPECT_EQ(::mkfifo(file(name).c_str(), 0600), 0) << file(name);
    return file(name);
  }
  // A file of `bytes` bytes that takes no disk space (a hole).
  std::string sparse(const std::string& name, uint64_t bytes) const {
    std::ofstream(file(name), std::ios::binary).flush();
    EXPECT_EQ(::truncate(file(name).c_str(), off_t(bytes)), 0) << file(name);
    return file(name);
  }
  std::string link(const std::string& name, const std::string& target) const {
    EXPECT_EQ(::symlink(target.c_str(), file(name).c_str()), 0) << file(name) << " -> " << target;
    return file(name);
  }

 private:
  std::string path_;
};

// `depth` nested JSON arrays around `inner`: "[[[...inner...]]]".
inline std::string nested_arrays(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

}  // namespace moekit::testing
