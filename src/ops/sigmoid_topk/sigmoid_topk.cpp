// sigmoid_topk front door. STUB: filled in by the sigmoid_topk work.
#include "moekit/ops/routing.h"

namespace moekit {
Status validate_sigmoid_topk(const SigmoidTopkParams&) { return Unsupported("not implemented"); }
Status sigmoid_topk(const SigmoidTopkParams&, const RunOptions&) { return Unsupported("not implemented"); }
}  // namespace moekit
