// grouped_topk front door. STUB: filled in by the grouped_topk work.
#include "moekit/ops/routing.h"

namespace moekit {
Status validate_grouped_topk(const GroupedTopkParams&) { return Unsupported("grouped_topk: not implemented"); }
Status grouped_topk(const GroupedTopkParams&, const RunOptions&) { return Unsupported("grouped_topk: not implemented"); }
const char* scoring_name(Scoring s) { return s == Scoring::softmax ? "softmax" : "sigmoid"; }
}  // namespace moekit
