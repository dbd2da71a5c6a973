// `moekit bench`: for each op, problem, token count and kernel of the selected backends, prepares
// the problem through the op's harness hook (OpHarness::prepare_bench, src/testing/harness.h),
// warms up, times it and compares the median with the machine floors (machine.h). docs/cli.md,
// "moekit bench", documents the columns, the JSON keys and the timing method. Tests: cli.bench.*
// in tests/cli_tests.cmake.
//
// Host rows (ref, cpu): each sample is the host wall-clock mean of a batch of back-to-back run()s
// (batch = 1 unless one run is under 5 us, so the clock's resolution does not dominate); the
// reported time is the median sample. Inputs rotate between up to 4 prepared copies so a run does
// not find the previous run's data in L1/L2; problems whose copies together fit in the last-level
// cache are still timed warm-cache, and the "cache" column says so.
//
// Device rows (cuda): the hook prepares device-resident rotating input sets (BenchProblem::sets,
// launch()) and DeviceOps::time_graph replays one CUDA graph per set with L2 flushed before each
// replay, event-timed; the reported time is the median of >= 30 replays (default 100). fused_moe
// rows also time the unfused cuBLAS baseline on the same sets (BenchProblem::baseline) and report
// baseline_us and vs_baseline = baseline_us / time_us, and a kernel that only reads the touched
// experts' weights (BenchProblem::stream): stream_us and frac_stream = stream_us / time_us.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "machine.h"

namespace moekit::cli {

namespace {

using Clock = std::chrono::steady_clock;

struct TimingPlan {
  int64_t iters = 0;   // fixed number of samples (0 = adaptive: >= 30 samples and >= 0.2 s)
  int64_t warmup = 3;  // untimed runs before the first sample
  L2Flush l2 = L2Flush::write;  // CUDA rows: --l2 flushed (write) | clean
  bool baseline = true;         // fused_moe CUDA rows: also time the unfused cuBLAS baseline
  bool stream = true;           //   and the read of their weights alone (the harness's memory ceiling)
};

struct Row {
  std::string op, kernel, backend, label, shape, scheme;
  int64_t tokens = 0;
  std::string status = "ok";  // ok | skipped | error
  std::string reason;
  double time_us = NAN, flops = 0, bytes = 0;
  int64_t samples = 0, batch = 1, copies = 1;
  std::string cache;
  Floors floors;
  double baseline_us = NAN;     // cuda fused_moe rows: the unfused cuBLAS baseline
  std::string baseline_reason;  // why baseline_us is null (empty when it is not)
  double stream_us = NAN;       // cuda fused_moe rows: reading the touched experts' weights alone
  std::string stream_reason;    // why stream_us is null (empty when it is not)
  std::string kernel_chosen;    // device rows: the kernel the op's own dispatch picks for the problem
  std::string compare_kernel;   // --compare: the other backend's kernel timed on the same problem
  double compare_us = NAN;
  std::string config;           // --config: the config this row ran (kernel is "name [config]")
  bool config_picked = false;   //   whether it is the one the kernel's rules pick for the problem
};

// Default number of timed graph replays of a device row (the peer's harness takes 30).
constexpr int kDeviceIters = 100;

// Baseline time (or why there is none) per prepared problem, so several kernels of one problem
// share one baseline measurement. Key: the hook's shape description (includes T and the scheme).
using BaselineCache = std::map<std::string, std::pair<double, std::string>>;
struct Measured {  // the per-shape extras of device rows, measured once per shape
  BaselineCache baselines, streams;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

size_t last_level_cache_bytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? size_t(l3) : (size_t(32) << 20);  // 32 MiB when the OS does not say
}

// Copies worth preparing: rotate 4 copies of small problems, 2 of medium ones, and stream big ones
// (already far larger than any cache) from one. time_one() also keeps a single copy when preparing
// one is slow: generating random data is not free.
int64_t copies_for(double bytes) {
  if (bytes <= double(16 << 20)) return 4;
  if (bytes <= double(128 << 20)) return 2;
  return 1;
}

// Prepares, warms up and times one (problem, kernel). Fills time/flops/bytes or status/reason.
void time_one(const testing::OpHarness& h, const testing::BenchRequest& br, const Kernel& k,
              const TimingPlan& plan, Row* row) {
  std::vector<std::unique_ptr<testing::BenchProblem>> copies(1);
  const auto p0 = Clock::now();
  Status s = h.prepare_bench(br, row->tokens, k, &copies[0]);
  const double prepare_s = seconds_since(p0);
  if (s.ok() && copies[0] == nullptr) s = Internal("prepare_bench returned no problem");
  if (!s.ok()) {
    row->status = s.code() == StatusCode::unsupported ? "skipped" : "error";
    row->reason = s.message();
    return;
  }
  row->flops = copies[0]->flops;
  row->bytes = copies[0]->bytes;
  row->shape = copies[0]->shape;
  // Extra copies only when cheap: at most ~0.5 s of extra data generation per row.
  const int64_t want = prepare_s * double(copies_for(row->bytes) - 1) <= 0.5 ? copies_for(row->bytes) : 1;
  while (int64_t(copies.size()) < want) {
    std::unique_ptr<testing::BenchProblem> p;
    if (!h.prepare_bench(br, row->tokens, k, &p).ok() || p == nullptr) break;
    copies.push_back(std::move(p));
  }
  row->copies = int64_t(copies.size());
  row->cache = double(row->copies) * row->bytes <= double(last_level_cache_bytes()) ? "warm" : "rotated";

  size_t next = 0;
  auto run_once = [&]() -> Status {
    const Status st = copies[next]->run();
    next = (next + 1) % copies.size();
    return st;
  };
  // Warm-up; the first run also checks that the kernel accepts the problem.
  for (int64_t i = 0; i < std::max<int64_t>(1, plan.warmup); ++i) {
    s = run_once();
    if (!s.ok()) {
      row->status = "error";
      row->reason = s.to_string();
      return;
    }
  }
  const auto c0 = Clock::now();
  (void)run_once();
  const double one = seconds_since(c0);
  row->batch = one < 5e-6 ? std::min<int64_t>(10000, int64_t(std::ceil(5e-6 / std::max(one, 1e-9)))) : 1;

  std::vector<double> samples;
  bool failed = false;
  const auto t_start = Clock::now();
  while (true) {
    const auto t0 = Clock::now();
    for (int64_t b = 0; b < row->batch; ++b) failed |= !run_once().ok();
    samples.push_back(seconds_since(t0) / double(row->batch));
    if (failed) {
      row->status = "error";
      row->reason = "a timed run returned an error (the warm-up runs succeeded)";
      return;
    }
    const double elapsed = seconds_since(t_start);
    const int64_t n = int64_t(samples.size());
    if (plan.iters > 0 ? n >= plan.iters
                       : ((n >= 30 && elapsed >= 0.2) || (n >= 3 && elapsed >= 3.0) || n >= 100000)) {
      break;
    }
  }
  std::nth_element(samples.begin(), samples.begin() + long(samples.size() / 2), samples.end());
  row->samples = int64_t(samples.size());
  row->time_us = samples[samples.size() / 2] * 1e6;
}

// Device rows: one prepared problem with its rotating input sets, timed by CUDA-graph replay
// (DeviceOps::time_graph); fused_moe rows also get the baseline (cached per problem).
// Times the prepared device problem p (its current config) into row: median of CUDA-graph replays,
// and for fused_moe the unfused baseline of the same shape (measured once per shape).
void time_prepared(testing::BenchProblem& p, const Kernel& k, const TimingPlan& plan, Measured* measured,
                   Row* row) {
  const DeviceOps* ops = registry().device_ops(k.backend);
  if (ops == nullptr || ops->time_graph == nullptr) {
    row->status = "error";
    row->reason = std::string("backend ") + backend_name(k.backend) + " registers no time_graph";
    return;
  }
  const int iters = plan.iters > 0 ? int(plan.iters) : kDeviceIters;
  const int warmup = int(std::max<int64_t>(1, plan.warmup));
  std::vector<double> us;
  const Status s = ops->time_graph([&](void* stream, int set) { return p.launch(stream, set); }, p.sets, warmup,
                                   iters, plan.l2, k.name, &us);
  if (!s.ok() || us.empty()) {
    row->status = s.code() == StatusCode::unsupported ? "skipped" : "error";
    row->reason = s.ok() ? "time_graph returned no sample" : s.to_string();
    return;
  }
  std::nth_element(us.begin(), us.begin() + long(us.size() / 2), us.end());
  row->time_us = us[us.size() / 2];
  row->samples = int64_t(us.size());
  row->batch = 1;
  row->copies = p.sets;
  row->cache = plan.l2 == L2Flush::clean ? "flushed-clean" : "flushed";
  row->kernel_chosen = p.kernel_chosen;
  if (k.op != OpKind::fused_moe) return;
  // Each extra once per shape: (value, why it is missing).
  auto once = [&](BaselineCache* cache, auto measure) -> const std::pair<double, std::string>& {
    auto it = cache->find(row->shape);
    if (it == cache->end()) {
      double v = NAN;
      const Status st = measure(&v);
      it = cache->emplace(row->shape, std::make_pair(st.ok() ? v : NAN, st.ok() ? "" : st.to_string())).first;
    }
    return it->second;
  };
  if (plan.baseline) {
    const auto& b = once(&measured->baselines, [&](double* v) { return p.baseline(warmup, iters, plan.l2, v); });
    row->baseline_us = b.first;
    row->baseline_reason = b.second;
  }
  if (plan.stream) {
    const auto& b = once(&measured->streams, [&](double* v) { return p.stream(warmup, iters, plan.l2, v); });
    row->stream_us = b.first;
    row->stream_reason = b.second;
  }
}

// One problem of a device kernel: a row by its rules, or with `configs` (--config; {"all"}: every
// config the kernel can run for it) one row per config, the problem prepared once.
void time_device(const testing::OpHarness& h, const testing::BenchRequest& br, const Kernel& k,
                 const TimingPlan& plan, Measured* measured, const std::vector<std::string>& configs,
                 const Row& proto, std::vector<Row>* out) {
  Row row = proto;
  std::unique_ptr<testing::BenchProblem> p;
  Status s = h.prepare_bench(br, row.tokens, k, &p);
  if (s.ok() && p == nullptr) s = Internal("prepare_bench returned no problem");
  if (!s.ok()) {
    row.status = s.code() == StatusCode::unsupported ? "skipped" : "error";
    row.reason = s.message();
    out->push_back(row);
    return;
  }
  row.flops = p->flops;
  row.bytes = p->bytes;
  row.shape = p->shape;
  if (p->sets <= 0) {
    row.status = "skipped";
    row.reason = std::string("the bench hook of ") + op_name(k.op) +
                 " has no device path yet (it prepared a host problem for a device kernel)";
    out->push_back(row);
    return;
  }
  if (configs.empty() || k.configs == nullptr) {
    time_prepared(*p, k, plan, measured, &row);
    out->push_back(row);
    return;
  }
  const bool all = configs.size() == 1 && configs[0] == "all";
  for (const std::string& c : all ? p->configs : configs) {
    Row r = row;
    r.kernel = testing::kernel_config_label(k.name, c);
    r.config = c;
    r.config_picked = !p->configs.empty() && c == p->configs.front();
    const Status cs = p->set_config(c);
    if (!cs.ok()) {
      r.status = cs.code() == StatusCode::unsupported ? "skipped" : "error";
      r.reason = cs.message();
    } else {
      time_prepared(*p, k, plan, measured, &r);
    }
    out->push_back(r);
  }
}

// Floors in microseconds (NAN when the peak is unknown).
double mem_floor_us(const Row& r) { return r.floors.gbps.value > 0 ? r.bytes / r.floors.gbps.value / 1e3 : NAN; }
double compute_floor_us(const Row& r) {
  return r.floors.gflops.value > 0 ? r.flops / r.floors.gflops.value / 1e3 : NAN;
}
double frac_floor(const Row& r) {
  const double m = mem_floor_us(r), c = compute_floor_us(r);
  const double f = std::max(std::isnan(m) ? 0.0 : m, std::isnan(c) ? 0.0 : c);
  return r.status == "ok" && f > 0 && r.time_us > 0 ? f / r.time_us : NAN;
}
const char* bound(const Row& r) {
  const double m = mem_floor_us(r), c = compute_floor_us(r);
  if (std::isnan(m) && std::isnan(c)) return "?";
  return std::isnan(c) || (!std::isnan(m) && m >= c) ? "memory" : "compute";
}

const char* const kRowFormat = "%-14s %-30s %-7s %-18s %-11s %7s %12s %9s %9s %12s %12s %10s %-8s %s";
const char* const kBaselineFormat = " %12s %11s %10s %11s %s";  // appended to each row when there are device rows

double vs_baseline(const Row& r) { return r.status == "ok" && r.time_us > 0 ? r.baseline_us / r.time_us : NAN; }
double frac_stream(const Row& r) { return r.status == "ok" && r.time_us > 0 ? r.stream_us / r.time_us : NAN; }

std::string num(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void print_row(const Row& r, bool with_baseline) {
  if (r.status != "ok") {
    std::printf("%-14s %-30s %-7s %-18s %-11s %7lld  %s: %s\n", r.op.c_str(), r.kernel.c_str(), r.backend.c_str(),
                r.label.c_str(), r.scheme.c_str(), static_cast<long long>(r.tokens), r.status.c_str(),
                r.reason.c_str());
  } else {
    const double s = r.time_us * 1e-6;
    std::printf(kRowFormat, r.op.c_str(), r.kernel.c_str(), r.backend.c_str(), r.label.c_str(), r.scheme.c_str(),
                std::to_string(r.tokens).c_str(), num("%.2f", r.time_us).c_str(),
                num("%.4f", r.flops / s / 1e12).c_str(),
                num("%.2f", r.bytes / s / 1e9).c_str(), num("%.2f", mem_floor_us(r)).c_str(),
                num("%.2f", compute_floor_us(r)).c_str(), num("%.4f", frac_floor(r)).c_str(), bound(r),
                (r.cache + " x" + std::to_string(r.copies)).c_str());
    if (with_baseline) {
      std::printf(kBaselineFormat, num("%.2f", r.baseline_us).c_str(), num("%.3f", vs_baseline(r)).c_str(),
                  num("%.2f", r.stream_us).c_str(), num("%.3f", frac_stream(r)).c_str(),
                  r.kernel_chosen.empty() ? "-" : r.kernel_chosen.c_str());
    }
    if (!r.compare_kernel.empty()) {
      std::printf("  vs %s: %s us, speedup %s", r.compare_kernel.c_str(), num("%.2f", r.compare_us).c_str(),
                  num("%.2f", r.compare_us / r.time_us).c_str());
    }
    std::printf("\n");
    if (with_baseline && !r.baseline_reason.empty()) std::printf("  # baseline: %s\n", r.baseline_reason.c_str());
    if (with_baseline && !r.stream_reason.empty()) std::printf("  # stream: %s\n", r.stream_reason.c_str());
  }
  std::fflush(stdout);
}

// The rows as CSV, one column per key of the first row (strings quoted where they hold a comma or a
// quote; null as empty), for `--csv` (the recorded config sweep, tests/data/fused_moe_sm90_sweep.csv).
Status write_csv(const std::string& path, const nlohmann::json& rows) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return InvalidArgument("--csv: cannot write '", path, "'");
  std::vector<std::string> keys;
  if (!rows.empty()) {
    for (auto it = rows[0].begin(); it != rows[0].end(); ++it) keys.push_back(it.key());
  }
  auto cell = [](const nlohmann::json& v) {
    if (v.is_null()) return std::string();
    std::string t = v.is_string() ? v.get<std::string>() : v.dump();
    if (t.find_first_of(",\"\n") == std::string::npos) return t;
    std::string q = "\"";
    for (char c : t) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
  };
  for (size_t i = 0; i < keys.size(); ++i) std::fprintf(f, "%s%s", i ? "," : "", keys[i].c_str());
  std::fprintf(f, "\n");
  for (const nlohmann::json& r : rows) {
    for (size_t i = 0; i < keys.size(); ++i) {
      std::fprintf(f, "%s%s", i ? "," : "", cell(r.contains(keys[i]) ? r[keys[i]] : nlohmann::json()).c_str());
    }
    std::fprintf(f, "\n");
  }
  const bool ok = std::fclose(f) == 0;
  return ok ? Status::Ok() : InvalidArgument("--csv: writing '", path, "' failed");
}

nlohmann::json to_json(const Row& r) {
  const bool ok = r.status == "ok";
  const double s = r.time_us * 1e-6;
  auto or_null = [](double v) { return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v); };
  return {{"op", r.op}, {"kernel", r.kernel}, {"backend", r.backend}, {"case", r.label}, {"shape", r.shape},
          {"scheme", r.scheme}, {"tokens", r.tokens}, {"status", r.status}, {"reason", r.reason},
          {"time_us", or_null(r.time_us)}, {"tflops", ok ? or_null(r.flops / s / 1e12) : nullptr},
          {"gbps", ok ? or_null(r.bytes / s / 1e9) : nullptr}, {"flops", r.flops}, {"bytes", r.bytes},
          {"mem_floor_us", or_null(mem_floor_us(r))}, {"compute_floor_us", or_null(compute_floor_us(r))},
          {"frac_floor", or_null(frac_floor(r))}, {"bound", bound(r)},
          {"peak_gbps", r.floors.gbps.value}, {"peak_gbps_source", r.floors.gbps.how},
          {"peak_gflops", r.floors.gflops.value}, {"peak_gflops_source", r.floors.gflops.how},
          {"compute_rate", r.floors.rate}, {"samples", r.samples}, {"batch", r.batch}, {"copies", r.copies},
          {"cache", r.cache}, {"baseline_us", ok ? or_null(r.baseline_us) : nullptr},
          {"vs_baseline", ok ? or_null(vs_baseline(r)) : nullptr}, {"baseline_reason", r.baseline_reason},
          {"stream_us", ok ? or_null(r.stream_us) : nullptr}, {"frac_stream", ok ? or_null(frac_stream(r)) : nullptr},
          {"stream_reason", r.stream_reason},
          {"kernel_chosen", r.kernel_chosen}, {"compare_kernel", r.compare_kernel},
          {"compare_us", ok ? or_null(r.compare_us) : nullptr},
          {"speedup", ok ? or_null(r.compare_us / r.time_us) : nullptr}, {"config", r.config},
          {"config_picked", r.config_picked}};
}

}  // namespace

int run_bench(const BenchArgs& a) {
  if (!a.ep.empty()) return run_bench_ep(a);
  std::vector<OpKind> ops;
  std::vector<Backend> backends;
  bool explicit_backend = false;
  ProblemSet problems;
  TimingPlan plan;
  double peak_gbps = 0, peak_gflops = 0;
  Status s = parse_op_selection(a.op, &ops);
  if (s.ok()) s = parse_backend_selection(a.backend, &backends, &explicit_backend);
  if (s.ok()) s = parse_problem_set(a.shape, 1, &problems);
  if (s.ok() && !a.iters.empty()) s = parse_int("--iters", a.iters, 1, 1000000, &plan.iters);
  if (s.ok() && !a.warmup.empty()) s = parse_int("--warmup", a.warmup, 0, 1000000, &plan.warmup);
  plan.baseline = !a.no_baseline;
  plan.stream = !a.no_stream;
  if (s.ok() && a.l2 == "clean") {
    plan.l2 = L2Flush::clean;
  } else if (s.ok() && a.l2 != "flushed") {
    s = InvalidArgument("--l2: must be flushed or clean, got '", a.l2, "'");
  }
  if (s.ok() && !a.peak_gbps.empty()) s = parse_positive("--peak-gbps", a.peak_gbps, &peak_gbps);
  if (s.ok() && !a.peak_gflops.empty()) s = parse_positive("--peak-gflops", a.peak_gflops, &peak_gflops);
  Backend compare = Backend::ref;
  const bool comparing = !a.compare.empty();
  if (s.ok() && comparing && (!parse_backend(a.compare, &compare) || compare == Backend::cuda)) {
    s = InvalidArgument("--compare: must be a host backend (ref or cpu), got '", a.compare, "'");
  }
  if (s.ok() && ops.size() == 1 && testing::find_harness(ops[0]) != nullptr &&
      testing::find_harness(ops[0])->prepare_bench == nullptr) {
    std::string benchable;
    for (const testing::OpHarness& oh : testing::op_harnesses()) {
      if (oh.prepare_bench != nullptr) benchable += (benchable.empty() ? "" : ", ") + std::string(op_name(oh.op));
    }
    s = InvalidArgument("--op: ", op_name(ops[0]), " has no benchmark (benchable: ", benchable, ")");
  }
  // --kernel: every name must be a kernel of a selected op on a selected backend (before any row).
  for (const std::string& name : s.ok() ? split_commas(a.kernels) : std::vector<std::string>{}) {
    std::string known;
    bool found = false;
    for (OpKind op : ops) {
      for (Backend b : backends) {
        for (const Kernel* k : kernels_of(op, b)) {
          found |= name == k->name;
          known += (known.empty() ? "" : ", ") + std::string(k->name);
        }
      }
    }
    if (!found) {
      s = InvalidArgument("--kernel: no kernel '", name, "' of the selected op / backend (", known, ")");
      break;
    }
  }
  // --config: names for the kernels that take configs, or "all" (docs/fused_moe_configs.md).
  const std::vector<std::string> configs = split_commas(a.configs);
  if (s.ok() && configs.size() > 1 && std::find(configs.begin(), configs.end(), "all") != configs.end()) {
    s = InvalidArgument("--config: 'all' stands alone, got '", a.configs, "'");
  }
  if (problems.tokens.empty()) problems.tokens = {1, 8, 64, 512};
  // Before anything is allocated (the host measurement included): the largest problem must fit.
  if (s.ok()) s = check_memory_budget(ops, backends, problems, problems.tokens, /*bench=*/true);
  if (!s.ok()) return report_error("bench", s);
  if (explicit_backend) {
    const Status av = registry().backend_available(backends.front());
    if (!av.ok()) {
      std::fprintf(stderr, "moekit bench: --backend %s requested but unavailable: %s\n",
                   backend_name(backends.front()), av.message().c_str());
      return kExitFailure;
    }
  }

  // Measure the host before any kernel runs (and only when a host row will need it).
  bool host_rows = false;
  for (OpKind op : ops) {
    for (Backend b : backends) {
      host_rows |= b != Backend::cuda && !kernels_of(op, b).empty() && registry().backend_available(b).ok();
    }
  }
  std::FILE* notes = a.json ? stderr : stdout;
  bool cuda_rows = false;
  for (OpKind op : ops) {
    cuda_rows |= !kernels_of(op, Backend::cuda).empty() && registry().backend_available(Backend::cuda).ok();
  }
  HostPeaks host;
  if (host_rows) {
    host = measure_host(peak_gbps == 0, peak_gflops == 0);
    if (peak_gbps > 0) host.dram_gbps = {peak_gbps, "--peak-gbps, not measured"};
    if (peak_gflops > 0) host.bf16_gflops = host.fp32_gflops = {peak_gflops, "--peak-gflops, not measured"};
    std::fprintf(notes, "%s\n", describe(host).c_str());
  }
  if (cuda_rows) {
    const DeviceOps* dev = registry().device_ops(Backend::cuda);
    std::fprintf(notes, "device: %s; CUDA rows: median of %d CUDA-graph replays (L2 flushed before each%s, "
                        "rotating input sets), fused_moe also vs the unfused cuBLAS baseline and a read of its weights\n",
                 dev != nullptr && dev->describe != nullptr ? dev->describe().c_str() : "unknown",
                 plan.iters > 0 ? int(plan.iters) : kDeviceIters,
                 plan.l2 == L2Flush::clean ? ", then a read: clean lines" : "");
    const Floors d = device_floors(testing::Scheme::bf16), d8 = device_floors(testing::Scheme::fp8_block);
    std::fprintf(notes, "cuda: %g GB/s (%s), %g / %g GFLOP/s bf16 / fp8%s\n", peak_gbps > 0 ? peak_gbps : d.gbps.value,
                 peak_gbps > 0 ? "--peak-gbps" : d.gbps.how.c_str(), peak_gflops > 0 ? peak_gflops : d.gflops.value,
                 peak_gflops > 0 ? peak_gflops : d8.gflops.value,
                 peak_gflops > 0 ? " (--peak-gflops)" : " (H200 ceilings of ANCHORS.md)");
  }
  if (!a.json) {
    std::printf("\n");
    std::printf(kRowFormat, "op", "kernel", "backend", "case", "scheme", "tokens", "time_us", "TFLOP/s", "GB/s",
                "mem_floor_us", "comp_floor_us", "frac_floor", "bound", cuda_rows ? "cache     " : "cache");
    if (cuda_rows) std::printf(kBaselineFormat, "baseline_us", "vs_baseline", "stream_us", "frac_stream", "kernel_chosen");
    std::printf("\n");
  }
  Measured measured;

  nlohmann::json rows = nlohmann::json::array();
  int ran = 0, errors = 0;
  for (OpKind op : ops) {
    const testing::OpHarness* h = testing::find_harness(op);
    if (h == nullptr || h->prepare_bench == nullptr) continue;
    for (Backend b : backends) {
      const std::vector<const Kernel*> kernels = kernels_of(op, b);
      if (kernels.empty()) continue;
      const Status av = registry().backend_available(b);
      if (!av.ok()) {
        std::fprintf(notes, "# %s: backend %s skipped: %s\n", op_name(op), backend_name(b), av.message().c_str());
        continue;
      }
      for (const testing::ShapeRequest& req : problems.requests) {
        for (int64_t T : problems.tokens) {
          testing::MoeShape ms;
          (void)testing::resolve_shape(req, T, &ms);  // validated in parse_problem_set
          testing::BenchRequest br;
          br.shape = req;
          br.row_major_weights = a.row_major_weights;
          for (const Kernel* k : kernels) {
            if (h->bench_applies != nullptr && !h->bench_applies(br, *k)) continue;
            if (!a.kernels.empty() && ("," + a.kernels + ",").find(std::string(",") + k->name + ",") == std::string::npos) continue;
            Row r;
            r.op = op_name(op);
            r.kernel = k->name;
            r.backend = backend_name(b);
            r.label = ms.label;
            r.scheme = testing::scheme_name(ms.scheme);
            r.tokens = T;
            r.floors = b == Backend::cuda ? device_floors(ms.scheme) : host_floors(host, ms.scheme);
            if (peak_gbps > 0) r.floors.gbps = {peak_gbps, "--peak-gbps"};
            if (peak_gflops > 0) r.floors.gflops = {peak_gflops, "--peak-gflops"};
            std::vector<Row> out;
            if (registry().device_ops(b) != nullptr) {
              time_device(*h, br, *k, plan, &measured, configs, r, &out);
            } else {
              time_one(*h, br, *k, plan, &r);
              // --compare: the first kernel of the other backend that computes the same problem.
              for (const Kernel* c : comparing && r.status == "ok" && b != compare ? kernels_of(op, compare)
                                                                                   : std::vector<const Kernel*>{}) {
                if (!c->serves(k->variant) || (h->bench_applies != nullptr && !h->bench_applies(br, *c))) continue;
                Row cr = r;
                time_one(*h, br, *c, plan, &cr);
                r.compare_kernel = c->name;
                r.compare_us = cr.status == "ok" ? cr.time_us : NAN;
                break;
              }
              out.push_back(r);
            }
            for (const Row& o : out) {
              ran += o.status == "ok";
              errors += o.status == "error";
              if (a.json || !a.csv.empty()) rows.push_back(to_json(o));
              if (!a.json) print_row(o, cuda_rows);
            }
          }
        }
      }
    }
  }
  if (a.json) std::printf("%s\n", rows.dump(2).c_str());
  if (!a.csv.empty()) {
    const Status cs = write_csv(a.csv, rows);
    if (!cs.ok()) return report_error("bench", cs);
  }
  if (ran == 0) {
    std::fprintf(stderr, "moekit bench: nothing was benchmarked (no kernel of the selected op/backend accepted "
                         "a problem; see the skipped rows)\n");
    return kExitFailure;
  }
  return errors > 0 ? kExitFailure : kExitOk;
}

}  // namespace moekit::cli
