// test_quantize_fp8 STUB
#include <gtest/gtest.h>
