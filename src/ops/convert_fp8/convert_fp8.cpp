// convert_fp8 front door. STUB: filled in by the convert_fp8 work.
#include "moekit/ops/quant.h"

namespace moekit {
Status validate_convert_fp8(const ConvertFp8Params&) { return Unsupported("not implemented"); }
Status convert_fp8(const ConvertFp8Params&, const RunOptions&) { return Unsupported("not implemented"); }
}  // namespace moekit
