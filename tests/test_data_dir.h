// Where the tests find their data files: tests/data (MOEKIT_TEST_DATA_DIR) and the trained models
// of models/ (MOEKIT_MODELS_DIR). Both are build-time paths that the environment variables of the
// same names override, so a test binary copied to another machine (the GPU runs of
// scripts/gpu_run.sh, whose checkout lies elsewhere) still finds them. Header-only.
#pragma once

#include <cstdlib>
#include <string>

namespace moekit::testing {

inline std::string env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return std::string(v && *v ? v : fallback);
}

inline std::string test_data_dir() { return env_or("MOEKIT_TEST_DATA_DIR", MOEKIT_TEST_DATA_DIR); }
inline std::string models_dir() { return env_or("MOEKIT_MODELS_DIR", MOEKIT_MODELS_DIR); }

}  // namespace moekit::testing
