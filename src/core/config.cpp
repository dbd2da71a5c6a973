// The only place moekit reads its environment (docs/env.md lists every variable).
#include "moekit/core/config.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace moekit {

namespace {

bool parse_bool(const char* name, const char* v, bool* out, std::string* err) {
  if (v == nullptr) return true;
  if (!std::strcmp(v, "1") || !std::strcmp(v, "true") || !std::strcmp(v, "on") || !std::strcmp(v, "yes")) {
    *out = true;
  } else if (!std::strcmp(v, "0") || !std::strcmp(v, "false") || !std::strcmp(v, "off") ||
             !std::strcmp(v, "no") || !*v) {
    *out = false;
  } else {
    *err += std::string(name) + "='" + v + "' is not a boolean (use 1 or 0); ";
  }
  return true;
}

// MOEKIT_FUSED_MOE_CONFIG: entries "recipe:name" or "name" (all recipes), comma separated.
void parse_fused_moe_config(const char* v, Config* c) {
  const std::string s = v;
  size_t begin = 0;
  while (begin <= s.size()) {
    const size_t end = std::min(s.find(',', begin), s.size());
    const std::string item = s.substr(begin, end - begin);
    begin = end + 1;
    if (item.empty()) continue;
    const size_t colon = item.find(':');
    const std::string name = colon == std::string::npos ? item : item.substr(colon + 1);
    if (colon == std::string::npos) {
      for (std::string& slot : c->fused_moe_config) slot = name;
    } else if (const int slot = fused_moe_config_slot(item.substr(0, colon)); slot >= 0 && !name.empty()) {
      c->fused_moe_config[slot] = name;
    } else {
      c->error += "MOEKIT_FUSED_MOE_CONFIG='" + s + "': entry '" + item +
                  "' is not name or recipe:name with recipe bf16, fp8_row or fp8_block; ";
    }
  }
}

}  // namespace

int fused_moe_config_slot(const std::string& recipe) {
  return recipe == "bf16" ? 0 : recipe == "fp8_row" ? 1 : recipe == "fp8_block" ? 2 : -1;
}

Config parse_config(const std::function<const char*(const char*)>& lookup) {
  Config c;
  if (const char* v = lookup("MOEKIT_BACKEND"); v && *v) {
    const std::string s = v;
    if (s == "auto" || s == "ref" || s == "cpu" || s == "cuda") {
      c.backend = s;
    } else {
      c.error += "MOEKIT_BACKEND='" + s + "' is not one of auto, ref, cpu, cuda; ";
    }
  }
  if (const char* v = lookup("MOEKIT_FORCE_KERNEL")) c.force_kernel = v;
  parse_bool("MOEKIT_PRINT_DISPATCH", lookup("MOEKIT_PRINT_DISPATCH"), &c.print_dispatch, &c.error);
  parse_bool("MOEKIT_DETERMINISTIC", lookup("MOEKIT_DETERMINISTIC"), &c.deterministic, &c.error);
  if (const char* v = lookup("MOEKIT_NUM_THREADS"); v && *v) {
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 0 || n > 4096) {
      c.error += std::string("MOEKIT_NUM_THREADS='") + v + "' is not an integer in [0, 4096]; ";
    } else {
      c.num_threads = int(n);
    }
  }
  if (const char* v = lookup("MOEKIT_FUSED_MOE_CONFIG"); v && *v) parse_fused_moe_config(v, &c);
  return c;
}

const Config& config() {
  static const Config c = parse_config([](const char* name) { return std::getenv(name); });
  return c;
}

}  // namespace moekit
