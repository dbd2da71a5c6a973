// shuffle_weight front door. STUB: filled in by the shuffle_weight work.
#include "moekit/ops/layout.h"

namespace moekit {
Status validate_shuffle_weight(const ShuffleWeightParams&, bool) { return Unsupported("not implemented"); }
Status shuffle_weight(const ShuffleWeightParams&, const RunOptions&) { return Unsupported("not implemented"); }
Status unshuffle_weight(const ShuffleWeightParams&, const RunOptions&) { return Unsupported("not implemented"); }
}  // namespace moekit
