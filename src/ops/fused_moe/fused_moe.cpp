// fused_moe front door. STUB: filled in by the fused_moe work.
#include "moekit/ops/fused_moe.h"

namespace moekit {
Status validate_fused_moe(const FusedMoeParams&) { return Unsupported("not implemented"); }
Status fused_moe(const FusedMoeParams&, const RunOptions&) { return Unsupported("not implemented"); }
Status fused_moe_workspace_size(const FusedMoeParams&, const RunOptions&, size_t* b) { *b = 0; return Unsupported("not implemented"); }
MoeVariant fused_moe_variant(const FusedMoeParams&) { return MoeVariant::unquantized; }
MoeDims moe_dims(const FusedMoeParams&) { return MoeDims{}; }
const char* activation_name(Activation) { return "silu"; }
bool parse_activation(const char*, Activation*) { return false; }
}  // namespace moekit
