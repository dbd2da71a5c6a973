// quantize_fp8 front door. STUB: filled in by the quantize_fp8 work.
#include "moekit/ops/quant.h"

namespace moekit {
Status validate_quantize_fp8(const QuantizeFp8Params&) { return Unsupported("not implemented"); }
Status quantize_fp8(const QuantizeFp8Params&, const RunOptions&) { return Unsupported("not implemented"); }
const char* granularity_name(QuantGranularity) { return "?"; }
}  // namespace moekit
