// test_dtype STUB
#include <gtest/gtest.h>
