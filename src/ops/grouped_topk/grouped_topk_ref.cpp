// grouped_topk reference kernel (SPEC 1.2). STUB: filled in by the grouped_topk work.
#include "ref/ref_kernels.h"

namespace moekit::ref {
void register_grouped_topk(Registry& r) { (void)r; }
}  // namespace moekit::ref
