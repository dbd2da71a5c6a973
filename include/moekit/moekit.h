// moekit/moekit.h: the whole public API in one include.
#pragma once

#include "moekit/aiter.h"
#include "moekit/core/config.h"
#include "moekit/core/dtype.h"
#include "moekit/core/status.h"
#include "moekit/core/tensor_view.h"
#include "moekit/ops/fused_moe.h"
#include "moekit/ops/layout.h"
#include "moekit/ops/quant.h"
#include "moekit/ops/routing.h"
#include "moekit/ops/sorting.h"
#include "moekit/registry.h"
#include "moekit/threads.h"
