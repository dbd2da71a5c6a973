// test_fused_moe STUB
#include <gtest/gtest.h>
