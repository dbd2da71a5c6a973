// sort_tokens reference kernel (SPEC 2). STUB: filled in by the sort_tokens work.
#include "ref/ref_kernels.h"

namespace moekit::ref {
void register_sort_tokens(Registry& r) { (void)r; }
}  // namespace moekit::ref
