// test_convert_fp8 STUB
#include <gtest/gtest.h>
