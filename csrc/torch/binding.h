// csrc/torch/binding.h: the glue between at::Tensor and moekit's framework-free API, shared by the
// torch.ops.moekit implementations (ops.cpp) and the per-dispatch-key registrations (ops.cpp for
// CPU, ops_cuda.cpp for CUDA).
//
// Only this folder includes torch headers (DESIGN.md). No kernel code lives here: every op fills a
// moekit Params struct of non-owning TensorViews and calls the library's front door, which
// validates, selects a kernel (explicit `kernel` argument > MOEKIT_FORCE_KERNEL > MOEKIT_BACKEND >
// priority) and runs it. Device workspace comes from PyTorch's caching allocator and the current
// CUDA stream is passed in RunOptions, so the ops are CUDA-graph capturable.
// Tests: tests/python/test_ops.py.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <string>

#include "moekit/moekit.h"

namespace moekit::torch_binding {

// A view of `t` (moekit strides are in elements, like torch's). A 0-dim tensor becomes shape [1]
// (moekit reads ndim == 0 as "absent"). Throws ValueError naming `name` for a dtype moekit does not
// know, more than 4 dims, or a device other than CPU / CUDA.
// NOTE: meta tensors never get here: the Meta key outranks CPU / CUDA, so a call with any meta
// tensor runs the fake of python/moekit/_ops.py, which rejects a mix of meta and real tensors.
TensorView view_of(const at::Tensor& t, const char* name, Layout layout = Layout::row_major);
// Absent view for nullopt (an optional argument not given).
TensorView view_of(const std::optional<at::Tensor>& t, const char* name);

// Turns a failed Status into a Python exception whose message is "moekit.<op>: <message>":
// invalid_argument -> ValueError, unsupported -> NotImplementedError, out_of_memory ->
// torch.OutOfMemoryError ("moekit.<op>: out of memory: <message>"; a RuntimeError subclass),
// others -> RuntimeError ("moekit.<op>: <code name>: <message>").
void throw_if_error(const Status& s, const char* op);

// RunOptions for a call whose tensors live on `device`: the explicit kernel name (kept alive by
// `kernel`) and, on CUDA, the current stream of that device.
RunOptions run_options(const at::Device& device, const std::optional<std::string>& kernel);

// A workspace of `bytes` on `device` from the caching allocator (an empty tensor when 0), to be
// kept alive until the op returns; sets opts->workspace / workspace_bytes.
at::Tensor attach_workspace(size_t bytes, const at::Device& device, RunOptions* opts);

// Registers the implementation of every op of the `moekit` library on one dispatch key.
void register_impls(torch::Library& m);

// The current CUDA stream of device `index` (ops_cuda.cpp; only in builds with the CUDA backend).
void* current_cuda_stream(c10::DeviceIndex index);

}  // namespace moekit::torch_binding
