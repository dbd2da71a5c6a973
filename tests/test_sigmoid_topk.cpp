// test_sigmoid_topk STUB
#include <gtest/gtest.h>
