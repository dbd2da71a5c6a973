// check_sort_tokens.cpp STUB
#include "testing/harness.h"
namespace moekit::testing {
std::vector<CaseResult> check_sort_tokens(const CheckRequest&) { return {}; }
Status bench_sort_tokens(const BenchRequest&, int64_t, const Kernel&, std::unique_ptr<BenchProblem>*) { return Unsupported("not implemented"); }
}  // namespace moekit::testing
