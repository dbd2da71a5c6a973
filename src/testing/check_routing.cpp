// check_routing.cpp STUB
#include "testing/harness.h"
namespace moekit::testing {
std::vector<CaseResult> check_topk_softmax(const CheckRequest&) { return {}; }
std::vector<CaseResult> check_grouped_topk(const CheckRequest&) { return {}; }
std::vector<CaseResult> check_sigmoid_topk(const CheckRequest&) { return {}; }
Status bench_topk_softmax(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*) { return Unsupported("not implemented"); }
Status bench_grouped_topk(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*) { return Unsupported("not implemented"); }
Status bench_sigmoid_topk(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*) { return Unsupported("not implemented"); }
}  // namespace moekit::testing
