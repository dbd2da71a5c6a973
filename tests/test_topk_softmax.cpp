// test_topk_softmax STUB
#include <gtest/gtest.h>
