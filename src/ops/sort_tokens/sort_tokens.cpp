// sort_tokens front door. STUB: filled in by the sort_tokens work.
#include "moekit/ops/sorting.h"

namespace moekit {
Status validate_sort_tokens(const SortTokensParams&) { return Unsupported("not implemented"); }
Status sort_tokens(const SortTokensParams&, const RunOptions&) { return Unsupported("not implemented"); }
const char* sort_encoding_name(SortEncoding e) { return e == SortEncoding::packed ? "packed" : "flat"; }
}  // namespace moekit
