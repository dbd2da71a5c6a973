// test_grouped_topk STUB
#include <gtest/gtest.h>
