// check_layout_quant.cpp STUB
#include "testing/harness.h"
namespace moekit::testing {
std::vector<CaseResult> check_shuffle_weight(const CheckRequest&) { return {}; }
std::vector<CaseResult> check_unshuffle_weight(const CheckRequest&) { return {}; }
std::vector<CaseResult> check_quantize_fp8(const CheckRequest&) { return {}; }
std::vector<CaseResult> check_convert_fp8(const CheckRequest&) { return {}; }
}  // namespace moekit::testing
