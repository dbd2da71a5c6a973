// `moekit`: the command-line front end (DESIGN.md "front ends"; docs/cli.md is its contract).
//
//   moekit ops    [--json]                      kernels, ops and backends in the registry
//   moekit check  [--op ..] [--backend ..] ...  every kernel against the reference / the oracle
//   moekit bench  --op .. [--backend ..] ...    timings against the machine's memory/compute floors
//
// This file declares the flags (CLI11) and maps parse errors to exit code 2. Flag values are kept
// as strings and parsed in args.cpp so every bad value is reported the same way. Contract tests:
// tests/cli_tests.cmake.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <new>

#include "commands.h"

#ifndef MOEKIT_VERSION
#define MOEKIT_VERSION "unknown"
#endif

namespace {

using moekit::cli::ShapeFlags;

void add_shape_flags(CLI::App* sub, ShapeFlags* f) {
  sub->add_option("--model", f->model,
      "Model preset: mixtral, deepseek-v3, llama4, qwen3-moe, all (default: all), or custom (only the shape of --experts / --topk / --hidden / --inter)")
      ->type_name("NAME");
  sub->add_option("--experts", f->experts, "Experts E (custom shape, or override of --model)")->type_name("E");
  sub->add_option("--topk", f->topk, "Experts per token k (1 <= k <= E)")->type_name("K");
  sub->add_option("--hidden", f->hidden, "Hidden size H")->type_name("H");
  sub->add_option("--inter", f->inter, "Intermediate size I per expert")->type_name("I");
  sub->add_option("--tokens", f->tokens, "Token counts, comma separated: T[,T2,...]")->type_name("T[,T2,...]");
  sub->add_option("--scheme", f->scheme,
      "bf16, f16, f32, fp8_tensor, fp8_channel, fp8_block (default: the preset's)")
      ->type_name("SCHEME");
  sub->add_option("--activation", f->activation, "silu, gelu, gelu_tanh (default: silu)")->type_name("ACT");
  sub->add_option("--seed", f->seed, "Random seed (default: 1)")->type_name("S");
  sub->add_flag("--full", f->full, "Presets at their real dimensions instead of the scaled-down default");
  sub->add_flag("--weight-on-input", f->weight_on_input, "Router weight on the expert input (needs k = 1)");
}

}  // namespace

int main(int argc, char** argv) {
  using namespace moekit::cli;
  CLI::App app{"moekit " MOEKIT_VERSION ": fused Mixture-of-Experts operators (reference, AVX-512 CPU, CUDA)",
               "moekit"};
  app.set_version_flag("--version", "moekit " MOEKIT_VERSION);
  app.require_subcommand(1);

  OpsArgs ops;
  CLI::App* ops_cmd = app.add_subcommand("ops", "List ops, registered kernels and backend availability");
  ops_cmd->add_flag("--json", ops.json, "Machine-readable output");

  CheckArgs check;
  CLI::App* check_cmd = app.add_subcommand(
      "check", "Check every kernel against the reference (and the reference against an independent oracle)");
  check_cmd->add_option("--op", check.op, "Op name or all (default: all)")->type_name("NAME");
  check_cmd->add_option("--backend", check.backend, "ref, cpu, cuda or all (default: all)")->type_name("NAME");
  add_shape_flags(check_cmd, &check.shape);
  check_cmd->add_flag("--no-edge-cases", check.no_edge_cases, "Skip the named edge cases");
  check_cmd->add_option("--config", check.configs,
                        "fused_moe: also run these configs (comma separated) on each variant's first kernel that "
                        "takes configs, or every config it can run for each case (all)");
  check_cmd->add_flag("--json", check.json, "Print a JSON array of cases instead of the table");

  BenchArgs bench;
  CLI::App* bench_cmd = app.add_subcommand("bench", "Time kernels and compare with the memory / compute floors");
  bench_cmd->add_option("--op", bench.op, "Op name or all")->required()->type_name("NAME");
  bench_cmd->add_option("--backend", bench.backend, "ref, cpu, cuda or all (default: all)")->type_name("NAME");
  add_shape_flags(bench_cmd, &bench.shape);
  bench_cmd->add_option("--iters", bench.iters,
      "Timed samples (default: >= 30 and >= 0.2 s, see docs/cli.md)")
      ->type_name("N");
  bench_cmd->add_option("--warmup", bench.warmup, "Untimed warm-up runs (default: 3)")->type_name("N");
  bench_cmd->add_option("--l2", bench.l2,
      "CUDA rows: the L2 before each replay: flushed (a 2 x L2 write, the dirty lines written back during "
      "the replay, as ANCHORS.md's peer was timed) or clean (that write, then a read: no write-back timed); "
      "default flushed")
      ->type_name("MODE");
  bench_cmd->add_option("--peak-gbps", bench.peak_gbps,
      "Memory bandwidth for the floor, GB/s (default: measured)")
      ->type_name("X");
  bench_cmd->add_option("--peak-gflops", bench.peak_gflops,
      "Arithmetic rate for the floor, GFLOP/s (default: measured)")
      ->type_name("Y");
  bench_cmd->add_option("--kernel", bench.kernels, "Only these kernels (names, comma separated, each a kernel of the selected op and backends; default: every kernel of the backends)");
  bench_cmd->add_option("--config", bench.configs,
                        "fused_moe: time the kernels that take configs with these (names, comma separated; see "
                        "docs/fused_moe_configs.md), or with every config they can run for each problem (all)");
  bench_cmd->add_option("--csv", bench.csv, "Also write the rows to this CSV file");
  bench_cmd->add_flag("--no-baseline", bench.no_baseline,
                      "fused_moe on CUDA: do not time the unfused cuBLAS baseline (faster A/B runs and sweeps)");
  bench_cmd->add_flag("--no-stream", bench.no_stream,
                      "fused_moe on CUDA: do not time the read of the touched experts' weights (stream_us)");
  bench_cmd->add_flag("--row-major-weights", bench.row_major_weights,
                     "CPU fused_moe: keep the weights row_major (default: packed once at setup, see docs/cli.md)");
  bench_cmd->add_option("--compare", bench.compare,
                        "Also time the kernel of this backend (e.g. ref) on each problem: compare_us, speedup")
      ->type_name("BACKEND");
  bench_cmd->add_option("--ep", bench.ep,
                        "Expert parallelism over the first N GPUs (NCCL): per-phase times, tokens per rank")
      ->type_name("N");
  bench_cmd->add_flag("--fp8-dispatch", bench.fp8_dispatch, "With --ep: send x rows as fp8 e4m3fn + one scale per row");
  bench_cmd->add_flag("--json", bench.json, "Print a JSON array of rows instead of the table");

  RunArgs run;
  CLI::App* run_cmd = app.add_subcommand("run", "Generate from a prompt with a bundled model (tokens/s)");
  run_cmd->add_option("--model", run.model, "Model folder (config.json, model.safetensors, tokenizer.json)")
      ->required()->type_name("DIR");
  run_cmd->add_option("--prompt", run.prompt, "Prompt text")->required()->type_name("TEXT");
  run_cmd->add_option("--backend", run.backend, "ref, cpu or cuda (default: cpu)")->type_name("NAME");
  run_cmd->add_option("--scheme", run.scheme, "f32, bf16, fp8_tensor, fp8_channel, fp8_block (default: bf16)")
      ->type_name("SCHEME");
  run_cmd->add_option("--max-new", run.max_new, "Most tokens to generate (default: 64)")->type_name("N");
  EvalArgs eval;
  CLI::App* eval_cmd = app.add_subcommand("eval", "Accuracy table of bundled models per backend and scheme");
  eval_cmd->add_option("--model", eval.model, "Model folders, comma separated, or a folder of them (default: models)")
      ->type_name("DIR");
  eval_cmd->add_option("--backend", eval.backend, "ref, cpu, cuda, comma separated (default: cpu)")->type_name("NAME");
  eval_cmd->add_option("--scheme", eval.scheme, "Schemes, comma separated, or all (default: all)")->type_name("S");
  eval_cmd->add_option("--limit", eval.limit, "First N test problems (default: all)")->type_name("N");
  eval_cmd->add_option("--data", eval.data, "Test problems JSONL (default: <models>/data/arith_test.jsonl)")
      ->type_name("FILE");
  eval_cmd->add_option("--batch", eval.batch, "Sequences decoded together (default: 64)")->type_name("N");
  eval_cmd->add_flag("--json", eval.json, "Print a JSON array of rows instead of the table");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // --help, --version
    // NOTE: every CLI11 parse error (unknown flag, missing value, missing subcommand) is a usage
    // error: exit 2, one line on stderr, whatever exit code CLI11 itself would pick.
    std::fprintf(stderr, "moekit: %s (see moekit --help)\n", e.what());
    return kExitUsage;
  }

  try {
    if (ops_cmd->parsed()) return run_ops(ops);
    if (check_cmd->parsed()) return run_check(check);
    if (bench_cmd->parsed()) return run_bench(bench);
    if (run_cmd->parsed()) return run_model(run);
    if (eval_cmd->parsed()) return run_eval(eval);
  } catch (const std::bad_alloc& e) {
    // A request too large for the machine that the memory budget (budget.cpp) did not foresee:
    // the caller's to make smaller, like a bad argument (exit 2), not a bug.
    std::fprintf(stderr, "moekit: out of memory (%s): the request needs more host memory than this machine has\n",
                 e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "moekit: internal error: %s\n", e.what());
    return kExitFailure;
  }
  return kExitUsage;
}
