// sigmoid_topk reference kernel (SPEC 1.3). STUB: filled in by the sigmoid_topk work.
#include "ref/ref_kernels.h"

namespace moekit::ref {
void register_sigmoid_topk(Registry& r) { (void)r; }
}  // namespace moekit::ref
