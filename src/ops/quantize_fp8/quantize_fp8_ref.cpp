// quantize_fp8 reference kernel (SPEC 5). STUB: filled in by the quantize_fp8 work.
#include "ref/ref_kernels.h"

namespace moekit::ref {
void register_quantize_fp8(Registry& r) { (void)r; }
}  // namespace moekit::ref
