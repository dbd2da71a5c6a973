// `moekit bench --op fused_moe --ep N ...`: the expert-parallel step (include/moekit/ep.h) over the
// first N GPUs of this process, per-phase medians (plan on the host, dispatch, experts, combine)
// for each token count (tokens per rank). See docs/cli.md.
#include <cstdio>

#include <nlohmann/json.hpp>

#include "commands.h"
#include "moekit/ep.h"
#include "testing/harness.h"

namespace moekit::cli {

int run_bench_ep(const BenchArgs& a) {
  int64_t world = 0, iters = 20, warmup = 3;
  ProblemSet problems;
  Status s = parse_int("--ep", a.ep, 1, 64, &world);
  if (s.ok() && a.op != "fused_moe") s = InvalidArgument("--ep: needs --op fused_moe, got '", a.op, "'");
  if (s.ok()) s = parse_problem_set(a.shape, 0, &problems);
  if (s.ok() && problems.requests.size() != 1) s = InvalidArgument("--ep: needs one --model (or a custom shape)");
  if (s.ok() && !a.iters.empty()) s = parse_int("--iters", a.iters, 1, 100000, &iters);
  if (s.ok() && !a.warmup.empty()) s = parse_int("--warmup", a.warmup, 0, 100000, &warmup);
  testing::MoeShape shape;
  if (s.ok()) s = testing::resolve_shape(problems.requests[0], 1, &shape);
  if (s.ok() && shape.E % world != 0) s = InvalidArgument("--ep: experts ", shape.E, " must split evenly over ", world, " ranks");
  if (!s.ok()) return report_error("bench", s);
  if (!ep::nccl_available()) {
    std::fprintf(stderr, "moekit bench: --ep needs the NCCL runner, which this build lacks\n");
    return kExitFailure;
  }
  if (problems.tokens.empty()) problems.tokens = {128, 1024, 4096};
  std::vector<int> devices;
  for (int r = 0; r < int(world); ++r) devices.push_back(r);
  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    if (a.fp8_dispatch) std::printf("# x rows dispatched as fp8 e4m3fn + one f32 scale per row\n");
    std::printf("%-4s %-14s %8s %9s %12s %12s %12s %12s %14s\n", "ep", "shape", "tokens", "plan_ms", "dispatch_us",
                "experts_us", "combine_us", "total_us", "dispatch_GB/s");
  }
  for (int64_t T : problems.tokens) {
    ep::BenchResult r;
    ep::Options opts;
    opts.fp8_dispatch = a.fp8_dispatch;
    const Status st =
        ep::bench(devices, int(shape.E), int(shape.k), shape.H, shape.I, T, int(warmup), int(iters), opts, &r);
    if (!st.ok()) {
      std::fprintf(stderr, "moekit bench: --ep %d T=%lld: %s\n", int(world), static_cast<long long>(T), st.message().c_str());
      return kExitFailure;
    }
    const double gbps = r.median.dispatch_ms > 0 ? r.dispatch_bytes / (r.median.dispatch_ms * 1e6) : 0;
    if (a.json) {
      rows.push_back({{"ep", world}, {"fp8_dispatch", a.fp8_dispatch}, {"shape", shape.label}, {"tokens_per_rank", T}, {"plan_ms", r.median.plan_ms},
                      {"dispatch_us", r.median.dispatch_ms * 1e3}, {"experts_us", r.median.experts_ms * 1e3},
                      {"combine_us", r.median.combine_ms * 1e3}, {"total_us", r.median.total_ms * 1e3},
                      {"dispatch_bytes", r.dispatch_bytes}, {"dispatch_gbps", gbps}, {"iters", r.iters}});
    } else {
      std::printf("%-4d %-14s %8lld %9.2f %12.1f %12.1f %12.1f %12.1f %14.1f\n", int(world), shape.label.c_str(),
                  static_cast<long long>(T), r.median.plan_ms, r.median.dispatch_ms * 1e3, r.median.experts_ms * 1e3,
                  r.median.combine_ms * 1e3, r.median.total_ms * 1e3, gbps);
      std::fflush(stdout);
    }
  }
  if (a.json) std::printf("%s\n", rows.dump(1).c_str());
  return kExitOk;
}

}  // namespace moekit::cli
