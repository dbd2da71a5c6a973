// test_fused_moe_fp8 STUB
#include <gtest/gtest.h>
