// The `moekit` command-line tool: what the subcommands share (docs/cli.md is the user-facing
// contract; tests/cli_tests.cmake pins the exit codes and output formats).
//
// main.cpp owns CLI11 (flag declarations, parse errors); each cmd_*.cpp turns its already-parsed
// flag strings into library calls. Flag VALUES are parsed here (args.cpp), not by CLI11, so every
// bad value gets the same one-line message naming the flag and the value, and exit code 2.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "moekit/core/status.h"
#include "moekit/registry.h"
#include "testing/harness.h"

namespace moekit::cli {

// Exit codes (docs/cli.md, "Exit codes"). Stable: scripts depend on them.
constexpr int kExitOk = 0;        // everything ran and passed
constexpr int kExitFailure = 1;   // a mismatch, a kernel error, an unavailable requested backend, nothing ran
constexpr int kExitUsage = 2;     // bad arguments (unknown flag/value, inconsistent shape, too large for the machine)

// ---------------------------------------------------------------- raw flags (as typed)
// The shape / problem flags shared by `check` and `bench`; empty string = flag not given.
struct ShapeFlags {
  std::string model;       // --model NAME|all
  std::string experts;     // --experts E
  std::string topk;        // --topk K
  std::string hidden;      // --hidden H
  std::string inter;       // --inter I
  std::string tokens;      // --tokens T[,T2,...]
  std::string scheme;      // --scheme bf16|f16|f32|fp8_tensor|fp8_channel|fp8_block
  std::string activation;  // --activation silu|gelu|gelu_tanh
  std::string seed;        // --seed S
  bool full = false;       // --full: presets at real (not scaled-down) dimensions
  bool weight_on_input = false;  // --weight-on-input (router weight on the expert input, k = 1)
};

struct OpsArgs {
  bool json = false;
};

struct CheckArgs {
  std::string op = "all";       // --op NAME|all
  std::string backend = "all";  // --backend NAME|all
  ShapeFlags shape;
  bool no_edge_cases = false;
  std::string configs;  // --config NAME[,NAME]|all (fused_moe)
  bool json = false;
};

struct BenchArgs {
  std::string op;               // --op NAME|all (required)
  std::string backend = "all";  // --backend NAME|all
  ShapeFlags shape;
  std::string iters;            // --iters N: timed samples (empty: adaptive, see docs/cli.md)
  std::string warmup;           // --warmup N
  std::string l2 = "flushed";   // --l2 flushed|clean: the L2 flush before each CUDA replay (L2Flush)
  std::string peak_gbps;        // --peak-gbps X: overrides the measured memory bandwidth
  std::string peak_gflops;      // --peak-gflops Y: overrides the measured arithmetic rate
  std::string compare;          // --compare BACKEND: also time that backend's kernel on each problem
  std::string ep;               // --ep N: the expert-parallel step over N GPUs (cmd_bench_ep.cpp)
  bool fp8_dispatch = false;    // --fp8-dispatch (with --ep): x rows travel as fp8 + row scales
  bool row_major_weights = false;  // --row-major-weights: time CPU kernels on unpacked weights
  std::string kernels;             // --kernel: only these kernels (comma separated names); empty = all
  std::string configs;             // --config: fused_moe configs (comma separated) or all; empty = rules
  std::string csv;                 // --csv PATH: also write the rows as CSV
  bool no_baseline = false;        // --no-baseline: skip the unfused cuBLAS baseline (A/B runs, sweeps)
  bool no_stream = false;          // --no-stream: skip the weight-stream ceiling (stream_us)
  bool json = false;
};

// `moekit run` / `moekit eval` (cmd_model.cpp): the model runner on the bundled models.
struct RunArgs {
  std::string model;            // --model DIR (required)
  std::string prompt;           // --prompt TEXT (required)
  std::string backend = "cpu";  // --backend ref|cpu
  std::string scheme = "bf16";  // --scheme f32|bf16|fp8_tensor|fp8_channel|fp8_block
  std::string max_new = "64";   // --max-new N
};
struct EvalArgs {
  std::string model = "models";   // --model DIR[,DIR...]: model folders, or a folder of them
  std::string backend = "cpu";    // --backend ref|cpu[,...]
  std::string scheme = "all";     // --scheme S[,S...]|all
  std::string limit;              // --limit N: first N test problems (default: all)
  std::string data;               // --data FILE (default: <first model's parent>/data/arith_test.jsonl)
  std::string batch = "64";       // --batch N: sequences decoded together
  bool json = false;
};

// ---------------------------------------------------------------- parsed selections (args.cpp)
// Problems to run: one ShapeRequest per model preset (or the custom shape), plus the token counts.
struct ProblemSet {
  std::vector<testing::ShapeRequest> requests;
  std::vector<int64_t> tokens;  // empty = each op's defaults (check only)
};

// Builds the problem set. With no --model (or --model all): every preset, plus the custom shape
// when any of --experts/--topk/--hidden/--inter is given (the size flags apply to the custom
// shape only). With --model NAME: that preset, size flags overriding its dimensions. Every request
// is resolved once here so an inconsistent shape (topk > experts, ...) is a usage error before
// anything runs. `min_tokens`: smallest token count accepted (0 for check, 1 for bench).
Status parse_problem_set(const ShapeFlags& f, int64_t min_tokens, ProblemSet* out);

// The non-empty comma-separated parts of s, in order.
std::vector<std::string> split_commas(const std::string& s);
// "T[,T2,...]": non-negative decimal integers >= min_value, no empty entries.
Status parse_token_list(const std::string& flag, const std::string& text, int64_t min_value,
                        std::vector<int64_t>* out);
// A decimal integer in [lo, hi]; the message names `flag` and shows `text`.
Status parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi, int64_t* out);
// A finite positive number (e.g. --peak-gbps 4300).
Status parse_positive(const std::string& flag, const std::string& text, double* out);

// --op NAME|all -> ops (all: every OpKind, in enum order).
Status parse_op_selection(const std::string& text, std::vector<OpKind>* out);
// --backend NAME|all -> backends; *explicit_backend is true when one backend was named.
Status parse_backend_selection(const std::string& text, std::vector<Backend>* out, bool* explicit_backend);

// Registered kernels of `op` on `backend`, in registry order.
std::vector<const Kernel*> kernels_of(OpKind op, Backend backend);

// budget.cpp: memory this machine can still give the process (bytes): /proc/meminfo MemAvailable,
// bounded by the cgroup v2 limit and the address-space rlimit; *source says which one applied.
double host_memory_available(std::string* source);
// Estimates the host (and cuda device) memory of every (op, request, token count, backend) the
// command would run and returns OutOfMemory naming the largest case and both numbers ("--tokens
// 4194304: fused_moe on cpu, mixtral-small (...) needs about 231.9 GB of host memory, this machine
// has 22.1 GB available (MemAvailable in /proc/meminfo)") when it cannot fit. `default_tokens`
// stand in for an empty problems.tokens. Allocates nothing of the problem's size.
Status check_memory_budget(const std::vector<OpKind>& ops, const std::vector<Backend>& backends,
                           const ProblemSet& problems, const std::vector<int64_t>& default_tokens, bool bench);

// Prints "moekit <cmd>: <message>" on stderr and returns kExitUsage (invalid_argument,
// out_of_memory) or kExitFailure (anything else).
int report_error(const char* cmd, const Status& s);

// ---------------------------------------------------------------- subcommands
int run_ops(const OpsArgs& args);
int run_check(const CheckArgs& args);
int run_bench(const BenchArgs& args);
int run_bench_ep(const BenchArgs& args);  // run_bench with --ep given
int run_model(const RunArgs& args);
int run_eval(const EvalArgs& args);

}  // namespace moekit::cli
