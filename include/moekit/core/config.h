// moekit/core/config.h: the process-wide configuration, read from MOEKIT_* environment variables
// exactly once (src/core/config.cpp is the only file that calls getenv). docs/env.md lists them.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "moekit/core/status.h"

namespace moekit {

struct Config {
  std::string backend = "auto";   // MOEKIT_BACKEND: auto | ref | cpu | cuda
  std::string force_kernel;       // MOEKIT_FORCE_KERNEL: kernel name(s), comma separated; empty = none
  bool print_dispatch = false;    // MOEKIT_PRINT_DISPATCH=1: print each choice once per shape
  bool deterministic = false;     // MOEKIT_DETERMINISTIC=1: fixed-order reductions everywhere
  int num_threads = 0;            // MOEKIT_NUM_THREADS: CPU backend threads (0 = all cores)
  // MOEKIT_FUSED_MOE_CONFIG=[recipe:]name[,recipe:name...]: an explicit fused_moe config per recipe
  // (bf16, fp8_row, fp8_block; an entry without a recipe serves all three), as RunOptions::config.
  std::vector<std::string> fused_moe_config = std::vector<std::string>(3);  // by fused_moe_config_slot()
  std::string error;              // non-empty when a variable had a bad value (reported by dispatch)
};

// The fused_moe_config slot of a recipe name ("bf16", "fp8_row", "fp8_block"), -1 for another name.
int fused_moe_config_slot(const std::string& recipe);

// The configuration of this process (parsed on first use, then fixed).
const Config& config();

// Pure parser behind config(), for tests: `lookup` returns the value of a variable or nullptr.
Config parse_config(const std::function<const char*(const char*)>& lookup);

}  // namespace moekit
