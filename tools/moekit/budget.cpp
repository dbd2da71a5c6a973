// The memory budget of `moekit check` / `moekit bench` (docs/cli.md, "Exit codes"): before anything
// is allocated, the host (and, for cuda, device) memory each (op, problem, token count, backend)
// needs is estimated from what the op's harness hook allocates, and the largest is compared with
// what this machine has. A request that cannot fit is refused with exit 2 and both numbers, instead
// of ending in std::bad_alloc or the kernel's OOM killer after minutes (each flag is bounded on its
// own in args.cpp, but --hidden 1048576 --inter 1048576 or --tokens 4194304 together with a
// preset's other sizes need terabytes). Tests: cli.usage.*_too_large in tests/cli_tests.cmake.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "commands.h"

namespace moekit::cli {

namespace {

using testing::MoeShape;
using testing::Scheme;

bool fp8_scheme(Scheme s) { return s == Scheme::fp8_tensor || s == Scheme::fp8_channel || s == Scheme::fp8_block; }

// Bytes of host and device memory one problem takes at its peak.
struct Need {
  double host = 0, device = 0;
};

// NOTE: estimates, in bytes, of what src/testing/check_<op>.cpp and bench_*.cpp allocate for one
// case (each case is freed before the next). They round up (f64 oracles, the kernel's workspace,
// the packed copy of the weights) so a refusal is certain to be right, and only the big terms are
// counted: a request that fits in a few MB is never in question.
Need op_need(OpKind op, const MoeShape& s, Backend b, bool bench) {
  const double T = double(s.T), E = double(s.E), k = double(s.k), H = double(s.H), I = double(s.I);
  const double N1 = s.g1u1 ? 2 * I : I;
  const double xb = s.scheme == Scheme::f32 ? 4 : 2;   // x / out element (fp8 schemes take bf16 x)
  const double wb = fp8_scheme(s.scheme) ? 1 : xb;     // weight element
  const double per_expert = N1 * H + H * I;            // w1 + w2 elements of one expert
  const bool device = b == Backend::cuda;
  Need n;
  switch (op) {
    case OpKind::fused_moe: {
      const double weights = E * per_expert * wb + E * (N1 + H) * 4;  // + per-row scales at most
      // Weights that pack_moe_weights copies into cpu_vnni2_n32 next to the row_major ones (bf16 /
      // f16, fp8 per-tensor / per-row), for every backend but ref.
      const bool packs = b != Backend::ref && s.scheme != Scheme::f32 && s.scheme != Scheme::fp8_block;
      const double held = (packs ? 2 : 1) * weights;
      const double workspace = T * k * (N1 + H) * 4;                  // the CPU kernels' [T*k, I|H] f32 rows
      const double tokens = T * H * 2 * xb + T * k * 8;               // x, out, ids, weights
      if (bench) {
        // Host kernels: the weights (and their packed copy), one copy of the inputs. Device kernels: the
        // host keeps x and the routing (weights generated on the device), the device at least one
        // input set (cmd_bench / check_fused_moe.cpp prepare_device) and the fp8 staging buffer.
        n.host = device ? tokens : held + tokens + workspace;
        if (device) n.device = weights + tokens + workspace + (fp8_scheme(s.scheme) ? double(512 << 20) : 0.0);
      } else {
        // The problem (and the packed copy of the weights), the f64 oracle (one expert dequantized, the
        // output, the routing matrix) and the f64 copies the compare keeps (oracle, ref, actual).
        n.host = held + tokens + workspace + per_expert * 8 + T * H * 8 * 4 + T * E * 8;
        if (device) n.device = weights + tokens + workspace;
      }
      break;
    }
    case OpKind::topk_softmax:
    case OpKind::grouped_topk:
    case OpKind::sigmoid_topk:
      n.host = bench ? T * E * 4 + T * k * 8 : T * E * 24 + T * k * 48;  // logits (+ f64 oracle), ids, weights
      if (device) n.device = T * E * 4 + T * k * 8;
      break;
    case OpKind::sort_tokens: {
      const double slots = T * k + E * 128;  // T*k + E*(block_m - 1), block_m <= 128
      n.host = slots * (bench ? 16 : 48);
      if (device) n.device = slots * 16;
      break;
    }
    case OpKind::quantize_fp8:
      n.host = bench ? T * H * 4 : (T * H + per_expert) * 19;  // bf16 in, fp8 out, scales (+ f64 oracle)
      if (device) n.device = T * H * 4;
      break;
    case OpKind::convert_fp8:
      n.host = bench ? T * H * 2 + T * 8 : N1 * H * 10;  // check: one expert's w1 (+ f64 compare)
      if (device) n.device = bench ? T * H * 2 : N1 * H * 2;
      break;
    case OpKind::shuffle_weight:
    case OpKind::unshuffle_weight:
    case OpKind::pack_weight:
    case OpKind::unpack_weight:
      // check: two experts' w1 and w2, in, out and the round trip; bench: one expert's w1 twice.
      n.host = bench ? N1 * H * 2 * 2 : std::min(E, 2.0) * per_expert * wb * 4;
      if (device) n.device = bench ? N1 * H * 4 : std::min(E, 2.0) * per_expert * wb * 2;
      break;
    default:
      break;
  }
  return n;
}

// "36.2 GB" (decimal units).
std::string gb(double bytes) {
  char buf[48];
  if (bytes >= 1e12) {
    std::snprintf(buf, sizeof buf, "%.1f TB", bytes / 1e12);
  } else if (bytes >= 1e9) {
    std::snprintf(buf, sizeof buf, "%.1f GB", bytes / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.1f MB", bytes / 1e6);
  }
  return buf;
}

// One "key value kB" line of /proc/meminfo, in bytes; -1 when absent.
double meminfo_bytes(const char* key) {
  std::ifstream f("/proc/meminfo");
  std::string line;
  const std::string want = std::string(key) + ":";
  while (std::getline(f, line)) {
    if (line.compare(0, want.size(), want) != 0) continue;
    std::istringstream is(line.substr(want.size()));
    double kb = -1;
    is >> kb;
    return kb >= 0 ? kb * 1024.0 : -1;
  }
  return -1;
}

// The first number in a small file (cgroup limits); -1 when absent or "max".
double file_number(const char* path) {
  std::ifstream f(path);
  double v = -1;
  if (!(f >> v)) return -1;
  return v;
}

}  // namespace

double host_memory_available(std::string* source) {
  // MemAvailable: what can be allocated without swapping; sysconf's free pages where /proc lacks it.
  double avail = meminfo_bytes("MemAvailable");
  *source = "MemAvailable in /proc/meminfo";
  if (avail < 0) {
    avail = double(sysconf(_SC_AVPHYS_PAGES)) * double(sysconf(_SC_PAGESIZE));
    *source = "free physical pages (sysconf)";
  }
  // A container's cgroup v2 limit, less what the cgroup already uses.
  const double cg_max = file_number("/sys/fs/cgroup/memory.max"), cg_cur = file_number("/sys/fs/cgroup/memory.current");
  if (cg_max > 0 && cg_cur >= 0 && cg_max - cg_cur < avail) {
    avail = std::max(0.0, cg_max - cg_cur);
    *source = "the cgroup's memory.max less memory.current";
  }
  // The process's address-space limit (ulimit -v), less what it has mapped already.
  rlimit rl{};
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    std::ifstream statm("/proc/self/statm");
    double pages = 0;
    statm >> pages;
    const double left = std::max(0.0, double(rl.rlim_cur) - pages * double(sysconf(_SC_PAGESIZE)));
    if (left < avail) {
      avail = left;
      *source = "the address-space limit (ulimit -v) less what the process maps";
    }
  }
  return avail;
}

Status check_memory_budget(const std::vector<OpKind>& ops, const std::vector<Backend>& backends,
                           const ProblemSet& problems, const std::vector<int64_t>& default_tokens, bool bench) {
  Need worst_host, worst_dev;
  std::string host_case, dev_case;
  const std::vector<int64_t>& tokens = problems.tokens.empty() ? default_tokens : problems.tokens;
  for (OpKind op : ops) {
    for (Backend b : backends) {
      if (kernels_of(op, b).empty()) continue;
      for (const testing::ShapeRequest& req : problems.requests) {
        for (int64_t T : tokens) {
          MoeShape s;
          if (!testing::resolve_shape(req, T, &s).ok()) continue;  // reported by parse_problem_set
          const Need n = op_need(op, s, b, bench);
          std::ostringstream what;
          what << "--tokens " << T << ": " << op_name(op) << " on " << backend_name(b) << ", " << s.label
               << " (E=" << s.E << " k=" << s.k << " H=" << s.H << " I=" << s.I << ' ' << testing::scheme_name(s.scheme)
               << ")";
          if (n.host > worst_host.host) worst_host = n, host_case = what.str();
          if (n.device > worst_dev.device) worst_dev = n, dev_case = what.str();
        }
      }
    }
  }
  std::string source;
  const double host = host_memory_available(&source);
  if (worst_host.host > host) {
    return OutOfMemory(host_case, " needs about ", gb(worst_host.host), " of host memory, this machine has ", gb(host),
                       " available (", source, ")");
  }
  const DeviceOps* dev = registry().device_ops(Backend::cuda);
  size_t free_b = 0, total_b = 0;
  if (worst_dev.device > 0 && dev != nullptr && dev->mem_info != nullptr &&
      registry().backend_available(Backend::cuda).ok() && dev->mem_info(&free_b, &total_b).ok() &&
      worst_dev.device > double(free_b)) {
    return OutOfMemory(dev_case, " needs about ", gb(worst_dev.device), " of device memory, the GPU has ",
                       gb(double(free_b)), " free of ", gb(double(total_b)));
  }
  return Status::Ok();
}

}  // namespace moekit::cli
