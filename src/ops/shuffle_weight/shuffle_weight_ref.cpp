// shuffle_weight reference kernel (SPEC 4). STUB: filled in by the shuffle_weight work.
#include "ref/ref_kernels.h"

namespace moekit::ref {
void register_shuffle_weight(Registry& r) { (void)r; }
}  // namespace moekit::ref
