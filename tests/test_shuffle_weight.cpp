// test_shuffle_weight STUB
#include <gtest/gtest.h>
