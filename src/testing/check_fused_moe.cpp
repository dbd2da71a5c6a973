// check_fused_moe.cpp STUB
#include "testing/harness.h"
namespace moekit::testing {
std::vector<CaseResult> check_fused_moe(const CheckRequest&) { return {}; }
Status bench_fused_moe(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*) { return Unsupported("not implemented"); }
}  // namespace moekit::testing
