// `moekit ops [--json]`: every op (OpKind), every registered kernel with its availability, and the
// backends (docs/cli.md, "moekit ops"). Tests: cli.ops.* in tests/cli_tests.cmake.
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "cpu/cpu_features.h"

namespace moekit::cli {

namespace {

struct BackendInfo {
  Backend backend;
  bool available;
  std::string reason;    // why not available ("" when available)
  std::string features;  // cpu: detected ISA features and brand; "" otherwise
};

std::vector<BackendInfo> backend_infos() {
  std::vector<BackendInfo> out;
  for (int i = 0; i < kNumBackends; ++i) {
    const Backend b = Backend(i);
    const Status s = registry().backend_available(b);
    BackendInfo info{b, s.ok(), s.ok() ? "" : s.message(), ""};
    if (b == Backend::cpu) {
      const cpu::CpuFeatures& f = cpu::cpu_features();
      info.features = cpu::describe(f);
      if (!f.brand.empty()) info.features += (info.features.empty() ? "" : "; ") + f.brand;
    }
    out.push_back(info);
  }
  return out;
}

int kernel_count(OpKind op) {
  int n = 0;
  for (const Kernel& k : registry().kernels()) n += k.op == op;
  return n;
}

// The variants a kernel serves: "fp8_row+fp8_row_tkw1", or "all" for the four fused_moe variants.
std::string variants_of(const Kernel& k) {
  if (k.more_variants == 0) return variant_name(k.variant);
  std::string out;
  int n = 0;
  for (MoeVariant v : {MoeVariant::unquantized, MoeVariant::fp8_row, MoeVariant::fp8_row_tkw1, MoeVariant::fp8_block}) {
    if (!k.serves(v)) continue;
    out += (out.empty() ? "" : "+") + std::string(variant_name(v));
    ++n;
  }
  return n == 4 ? "all" : out;
}

int print_json() {
  nlohmann::json j;
  j["version"] = MOEKIT_VERSION;
  j["backends"] = nlohmann::json::array();
  for (const BackendInfo& b : backend_infos()) {
    nlohmann::json e = {{"name", backend_name(b.backend)}, {"available", b.available}, {"reason", b.reason}};
    if (b.backend == Backend::cpu) e["features"] = b.features;
    j["backends"].push_back(e);
  }
  j["ops"] = nlohmann::json::array();
  for (int i = 0; i < kNumOps; ++i) {
    const OpKind op = OpKind(i);
    const testing::OpHarness* h = testing::find_harness(op);
    nlohmann::json kernels = nlohmann::json::array();
    for (const Kernel& k : registry().kernels()) {
      if (k.op == op) kernels.push_back(k.name);
    }
    j["ops"].push_back({{"name", op_name(op)},
                        {"kernels", kernels},
                        {"checkable", h != nullptr && h->check != nullptr},
                        {"benchable", h != nullptr && h->prepare_bench != nullptr}});
  }
  j["kernels"] = nlohmann::json::array();
  for (const Kernel& k : registry().kernels()) {
    const Status s = registry().backend_available(k.backend);
    j["kernels"].push_back({{"name", k.name},
                            {"op", op_name(k.op)},
                            {"variant", variants_of(k)},
                            {"takes_config", k.configs != nullptr},
                            {"backend", backend_name(k.backend)},
                            {"recipe", k.recipe},
                            {"priority", k.priority},
                            {"available", s.ok()},
                            {"reason", s.ok() ? "" : s.message()}});
  }
  std::printf("%s\n", j.dump(2).c_str());
  return kExitOk;
}

int print_table() {
  std::printf("moekit %s\n\nBackends:\n", MOEKIT_VERSION);
  for (const BackendInfo& b : backend_infos()) {
    std::printf("  %-5s %s%s\n", backend_name(b.backend), b.available ? "available" : "unavailable: ",
                b.reason.c_str());
    if (!b.features.empty()) std::printf("        features: %s\n", b.features.c_str());
  }

  std::printf("\nOps:\n  %-18s %-8s %-6s %s\n", "op", "kernels", "check", "bench");
  for (int i = 0; i < kNumOps; ++i) {
    const OpKind op = OpKind(i);
    const testing::OpHarness* h = testing::find_harness(op);
    const int n = kernel_count(op);
    std::printf("  %-18s %-8s %-6s %s\n", op_name(op), n == 0 ? "none yet" : std::to_string(n).c_str(),
                h && h->check ? "yes" : "no", h && h->prepare_bench ? "yes" : "no");
  }

  std::printf("\nKernels:\n  %-34s %-18s %-13s %-7s %-4s %-11s %s\n", "name", "op", "variant", "backend", "prio",
              "available", "recipe");
  for (const Kernel& k : registry().kernels()) {
    const Status s = registry().backend_available(k.backend);
    std::printf("  %-34s %-18s %-13s %-7s %-4d %-11s %s\n", k.name, op_name(k.op), variants_of(k).c_str(),
                backend_name(k.backend), k.priority, s.ok() ? "yes" : "no", k.recipe);
    if (!s.ok()) std::printf("  %-34s   not available: %s\n", "", s.message().c_str());
  }
  return kExitOk;
}

}  // namespace

int run_ops(const OpsArgs& args) { return args.json ? print_json() : print_table(); }

}  // namespace moekit::cli
