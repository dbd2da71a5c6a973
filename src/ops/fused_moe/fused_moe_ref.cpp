// fused_moe reference kernel (SPEC 3). STUB: filled in by the fused_moe work.
#include "ref/ref_kernels.h"

namespace moekit::ref {
void register_fused_moe(Registry& r) { (void)r; }
}  // namespace moekit::ref
