// Registry, dispatch rule (SPEC 6) and environment parsing. Uses a private Registry filled with
// fake kernels and Registry::select_with() with explicit Configs, so no test touches the process
// environment or a global.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "moekit/core/config.h"
#include "moekit/registry.h"

namespace moekit {
namespace {

struct FakeParams {
  int size = 0;  // kernels "fast_*" refuse size > 100
};

Status accept_all(const void*) { return Status::Ok(); }
Status accept_small(const void* p) {
  const int n = static_cast<const FakeParams*>(p)->size;
  if (n > 100) return Unsupported("size ", n, " > 100");
  return Status::Ok();
}
Status run_nothing(const void*, const RunContext&) { return Status::Ok(); }
Status probe_ok() { return Status::Ok(); }
Status probe_no_device() { return BackendError("no CUDA device"); }

Kernel fake(const char* name, Backend b, int priority, Status (*supports)(const void*),
            OpKind op = OpKind::sort_tokens) {
  return Kernel{name, op, MoeVariant::none, b, "fake", priority, supports, nullptr, run_nothing};
}

class Dispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    reg.set_backend_probe(Backend::ref, probe_ok);
    reg.set_backend_probe(Backend::cpu, probe_ok);
    reg.set_backend_probe(Backend::cuda, probe_no_device);
    reg.add(fake("sort_ref", Backend::ref, 0, accept_all));
    reg.add(fake("sort_cpu_fast", Backend::cpu, 20, accept_small));
    reg.add(fake("sort_cpu_slow", Backend::cpu, 10, accept_all));
    reg.add(fake("sort_cuda", Backend::cuda, 30, accept_all));
    reg.add(fake("route_ref", Backend::ref, 0, accept_all, OpKind::topk_softmax));
  }
  // Selected kernel name, or "error: <message>".
  std::string pick(const Config& cfg, int size, const char* explicit_kernel = nullptr) {
    FakeParams p{size};
    RunOptions o;
    o.kernel = explicit_kernel;
    const Kernel* k = nullptr;
    Status s = reg.select_with(cfg, OpKind::sort_tokens, MoeVariant::none, &p, o, "test", &k);
    return s.ok() ? std::string(k->name) : "error: " + s.message();
  }
  Registry reg;
};

TEST_F(Dispatch, HighestPriorityAvailableThatAccepts) {
  Config cfg;
  // sort_cuda has the top priority but its backend has no device; sort_cpu_fast accepts size 10.
  EXPECT_EQ(pick(cfg, 10), "sort_cpu_fast");
  // sort_cpu_fast refuses size 1000: the next one by priority.
  EXPECT_EQ(pick(cfg, 1000), "sort_cpu_slow");
}

TEST_F(Dispatch, BackendFilter) {
  Config cfg;
  cfg.backend = "ref";
  EXPECT_EQ(pick(cfg, 10), "sort_ref");
  cfg.backend = "cpu";
  EXPECT_EQ(pick(cfg, 1000), "sort_cpu_slow");
}

TEST_F(Dispatch, BackendFilterWithNothingAvailableListsReasons) {
  Config cfg;
  cfg.backend = "cuda";
  const std::string r = pick(cfg, 10);
  EXPECT_NE(r.find("error: no kernel accepts"), std::string::npos) << r;
  EXPECT_NE(r.find("sort_cuda (cuda, priority 30): no CUDA device"), std::string::npos) << r;
}

TEST_F(Dispatch, ForceKernelBeatsBackendAndPriority) {
  Config cfg;
  cfg.backend = "cpu";
  cfg.force_kernel = "route_ref,sort_ref";
  EXPECT_EQ(pick(cfg, 10), "sort_ref");
}

TEST_F(Dispatch, ForceKernelThatRefusesIsAnError) {
  Config cfg;
  cfg.force_kernel = "sort_cpu_fast";
  const std::string r = pick(cfg, 1000);
  EXPECT_NE(r.find("MOEKIT_FORCE_KERNEL=sort_cpu_fast"), std::string::npos) << r;
  EXPECT_NE(r.find("size 1000 > 100"), std::string::npos) << r;
}

// A misspelt name used to be ignored: the usual choice ran although the docs promise no silent
// fallback.
TEST_F(Dispatch, ForceKernelThatNamesNoKernelIsAnError) {
  Config cfg;
  cfg.force_kernel = "route_ref,sort_reff";
  const std::string r = pick(cfg, 10);
  EXPECT_NE(r.find("MOEKIT_FORCE_KERNEL=route_ref,sort_reff: no kernel named 'sort_reff'"), std::string::npos) << r;
}

TEST_F(Dispatch, ForceKernelOfAnotherOpIsIgnoredForThisOp) {
  Config cfg;
  cfg.force_kernel = "route_ref";
  EXPECT_EQ(pick(cfg, 10), "sort_cpu_fast");
}

TEST_F(Dispatch, ExplicitArgumentBeatsEnvironment) {
  Config cfg;
  cfg.backend = "ref";
  cfg.force_kernel = "sort_ref";
  EXPECT_EQ(pick(cfg, 10, "sort_cpu_slow"), "sort_cpu_slow");
}

TEST_F(Dispatch, ExplicitArgumentErrors) {
  Config cfg;
  std::string r = pick(cfg, 10, "nope");
  EXPECT_NE(r.find("kernel 'nope' does not exist"), std::string::npos) << r;
  r = pick(cfg, 10, "route_ref");
  EXPECT_NE(r.find("implements topk_softmax, not sort_tokens"), std::string::npos) << r;
  r = pick(cfg, 1000, "sort_cpu_fast");
  EXPECT_NE(r.find("kernel 'sort_cpu_fast' refuses: size 1000 > 100"), std::string::npos) << r;
  r = pick(cfg, 10, "sort_cuda");
  EXPECT_NE(r.find("no CUDA device"), std::string::npos) << r;
}

TEST_F(Dispatch, BadEnvironmentIsReported) {
  Config cfg;
  cfg.error = "MOEKIT_BACKEND='gpu' is not one of auto, ref, cpu, cuda; ";
  const std::string r = pick(cfg, 10);
  EXPECT_NE(r.find("MOEKIT_BACKEND='gpu'"), std::string::npos) << r;
}

TEST_F(Dispatch, NoKernelForOp) {
  Config cfg;
  FakeParams p{1};
  const Kernel* k = nullptr;
  Status s = reg.select_with(cfg, OpKind::fused_moe, MoeVariant::fp8_block, &p, RunOptions{}, "x", &k);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::unsupported);
  EXPECT_NE(s.message().find("no kernel registered for fused_moe (variant fp8_block)"), std::string::npos)
      << s.message();
}

Config parse(const std::map<std::string, std::string>& env) {
  return parse_config([&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

TEST(Config, Defaults) {
  const Config c = parse({});
  EXPECT_EQ(c.backend, "auto");
  EXPECT_TRUE(c.force_kernel.empty());
  EXPECT_FALSE(c.print_dispatch);
  EXPECT_FALSE(c.deterministic);
  EXPECT_EQ(c.num_threads, 0);
  EXPECT_TRUE(c.error.empty());
}

TEST(Config, Values) {
  const Config c = parse({{"MOEKIT_BACKEND", "cpu"},
                          {"MOEKIT_FORCE_KERNEL", "a,b"},
                          {"MOEKIT_PRINT_DISPATCH", "1"},
                          {"MOEKIT_DETERMINISTIC", "true"},
                          {"MOEKIT_NUM_THREADS", "3"}});
  EXPECT_EQ(c.backend, "cpu");
  EXPECT_EQ(c.force_kernel, "a,b");
  EXPECT_TRUE(c.print_dispatch);
  EXPECT_TRUE(c.deterministic);
  EXPECT_EQ(c.num_threads, 3);
  EXPECT_TRUE(c.error.empty()) << c.error;
}

TEST(Config, BadValuesNameTheVariableAndValue) {
  const Config c = parse({{"MOEKIT_BACKEND", "gpu"}, {"MOEKIT_PRINT_DISPATCH", "maybe"},
                          {"MOEKIT_NUM_THREADS", "-2"}});
  EXPECT_NE(c.error.find("MOEKIT_BACKEND='gpu'"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("MOEKIT_PRINT_DISPATCH='maybe'"), std::string::npos) << c.error;
  EXPECT_NE(c.error.find("MOEKIT_NUM_THREADS='-2'"), std::string::npos) << c.error;
}

TEST(Config, FusedMoeConfigPerRecipe) {
  const Config c = parse({{"MOEKIT_FUSED_MOE_CONFIG", "grouped/128x256.ws4,fp8_block:small_m"}});
  EXPECT_TRUE(c.error.empty()) << c.error;
  EXPECT_EQ(c.fused_moe_config[fused_moe_config_slot("bf16")], "grouped/128x256.ws4");
  EXPECT_EQ(c.fused_moe_config[fused_moe_config_slot("fp8_row")], "grouped/128x256.ws4");
  EXPECT_EQ(c.fused_moe_config[fused_moe_config_slot("fp8_block")], "small_m");
  const Config bad = parse({{"MOEKIT_FUSED_MOE_CONFIG", "fp16:small_m"}});
  EXPECT_NE(bad.error.find("MOEKIT_FUSED_MOE_CONFIG='fp16:small_m'"), std::string::npos) << bad.error;
  EXPECT_EQ(fused_moe_config_slot("fp8"), -1);
}

// Kernels that take configs: a call with a config may only pick them, and an explicit kernel that
// takes none is an error naming the config.
std::vector<std::string> no_configs(const void*) { return {}; }
TEST(DispatchConfig, AConfigRestrictsTheChoiceToKernelsThatTakeOne) {
  Registry reg;
  reg.set_backend_probe(Backend::ref, probe_ok);
  reg.set_backend_probe(Backend::cpu, probe_ok);
  Kernel cfg_kernel{"moe_cfg", OpKind::fused_moe, MoeVariant::unquantized, Backend::cpu, "fake", 10, accept_all,
                    nullptr, run_nothing, variant_bit(MoeVariant::fp8_row), no_configs};
  reg.add(cfg_kernel);
  reg.add(Kernel{"moe_plain", OpKind::fused_moe, MoeVariant::unquantized, Backend::cpu, "fake", 20, accept_all, nullptr,
                 run_nothing});
  FakeParams p{1};
  const Kernel* k = nullptr;
  RunOptions o;
  ASSERT_TRUE(reg.select_with(Config{}, OpKind::fused_moe, MoeVariant::unquantized, &p, o, "x", &k).ok());
  EXPECT_STREQ(k->name, "moe_plain");
  o.config = "small_m";
  ASSERT_TRUE(reg.select_with(Config{}, OpKind::fused_moe, MoeVariant::unquantized, &p, o, "x", &k).ok());
  EXPECT_STREQ(k->name, "moe_cfg");
  // The row serves a second variant; the other has no kernel that takes a config.
  ASSERT_TRUE(reg.select_with(Config{}, OpKind::fused_moe, MoeVariant::fp8_row, &p, o, "x", &k).ok());
  EXPECT_STREQ(k->name, "moe_cfg");
  Status s = reg.select_with(Config{}, OpKind::fused_moe, MoeVariant::fp8_block, &p, o, "x", &k);
  EXPECT_NE(s.message().find("that takes a config with config 'small_m'"), std::string::npos) << s.message();
  o.kernel = "moe_plain";
  s = reg.select_with(Config{}, OpKind::fused_moe, MoeVariant::unquantized, &p, o, "x", &k);
  EXPECT_EQ(s.code(), StatusCode::invalid_argument);
  EXPECT_NE(s.message().find("takes no config, got config 'small_m'"), std::string::npos) << s.message();
}

TEST(Registry, NamesRoundTrip) {
  for (int i = 0; i < kNumOps; ++i) {
    OpKind op;
    ASSERT_TRUE(parse_op(op_name(OpKind(i)), &op));
    EXPECT_EQ(int(op), i);
  }
  for (int i = 0; i < kNumBackends; ++i) {
    Backend b;
    ASSERT_TRUE(parse_backend(backend_name(Backend(i)), &b));
    EXPECT_EQ(int(b), i);
  }
  OpKind op;
  EXPECT_FALSE(parse_op("fused_moe_x", &op));
}

// The process registry: every op has a reference kernel, names are unique, ref is available.
TEST(Registry, EveryOpHasAnAvailableReferenceKernel) {
  const Registry& r = registry();
  EXPECT_TRUE(r.backend_available(Backend::ref).ok());
  for (int i = 0; i < kNumOps; ++i) {
    bool found = false;
    for (const Kernel& k : r.kernels()) found = found || (int(k.op) == i && k.backend == Backend::ref);
    EXPECT_TRUE(found) << "no ref kernel for " << op_name(OpKind(i));
  }
  // fused_moe: one reference kernel per variant.
  for (MoeVariant v : {MoeVariant::unquantized, MoeVariant::fp8_row, MoeVariant::fp8_row_tkw1,
                       MoeVariant::fp8_block}) {
    bool found = false;
    for (const Kernel* k : r.candidates(OpKind::fused_moe, v)) found = found || k->backend == Backend::ref;
    EXPECT_TRUE(found) << "no ref fused_moe kernel for variant " << variant_name(v);
  }
  std::map<std::string, int> names;
  for (const Kernel& k : r.kernels()) EXPECT_EQ(names[k.name]++, 0) << "duplicate kernel name " << k.name;
}

}  // namespace
}  // namespace moekit
