// test_registry STUB
#include <gtest/gtest.h>
