// oracle_fused_moe.cpp STUB
#include "testing/harness.h"
namespace moekit::testing {

}  // namespace moekit::testing
