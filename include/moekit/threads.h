// moekit/threads.h: the CPU backend's thread count at run time.
//
// The CPU kernels split their work over a process-wide pool made on first use with
// MOEKIT_NUM_THREADS threads (default: all hardware threads). set_num_threads lowers (or raises
// again, up to that size) how many of them later calls use, e.g. to follow a framework's own
// setting (the Python package follows torch.get_num_threads() unless MOEKIT_NUM_THREADS is set).
#pragma once

#include "moekit/core/status.h"

namespace moekit {

// Threads the CPU kernels use from the next call on: min(n, the pool's size). invalid_argument
// for n < 1. Thread-safe; a call in flight keeps the count it started with.
Status set_num_threads(int n);
// Threads the CPU kernels use now.
int num_threads();
// The pool's size: the most set_num_threads can give.
int max_num_threads();

}  // namespace moekit
