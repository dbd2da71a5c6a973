// test_sort_tokens STUB
#include <gtest/gtest.h>
