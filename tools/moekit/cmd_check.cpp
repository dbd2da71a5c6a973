// `moekit check`: runs each selected op's harness hook (OpHarness::check, src/testing/harness.h)
// for every selected backend and problem, and prints one row per (case, kernel) plus the summary
// line "N passed, M failed" (docs/cli.md, "moekit check"). Tests: cli.check.* in
// tests/cli_tests.cmake.
//
// The CLI never runs a kernel itself: it builds CheckRequests, one per (op, backend, model), so a
// backend that is unavailable on this machine is skipped with its reason instead of failing inside
// a hook. The named edge cases do not depend on the model, so they run once per (op, backend).
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"

namespace moekit::cli {

namespace {

const char* const kRowFormat = "%-16s %-30s %-7s %-30s %-6s %-4s %10s %10s %10s %14s  %s\n";

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

void print_header() {
  std::printf(kRowFormat, "op", "kernel", "backend", "case", "vs", "ok", "max_abs", "max_rel", "cosine",
              "mismatches", "worst");
}

void print_row(const testing::CaseResult& r) {
  const testing::Metrics& m = r.metrics;
  const std::string mism = std::to_string(m.mismatches) + "/" + std::to_string(m.count);
  std::printf(kRowFormat, r.op.c_str(), r.kernel.c_str(), r.backend.c_str(), r.name.c_str(), r.reference.c_str(),
              r.ok ? "ok" : "FAIL", fmt("%.3g", m.max_abs_err).c_str(), fmt("%.3g", m.max_rel_err).c_str(),
              fmt("%.6f", m.cosine).c_str(), mism.c_str(), m.worst.c_str());
  if (!r.ok) {
    std::printf("    detail: %s%s\n", r.detail.c_str(), m.finite ? "" : " (non-finite values in the output)");
  }
  std::fflush(stdout);
}

nlohmann::json to_json(const testing::CaseResult& r) {
  const testing::Metrics& m = r.metrics;
  // NOTE: nlohmann writes NaN / Inf as null, so the output stays valid JSON.
  return {{"op", r.op},
          {"kernel", r.kernel},
          {"backend", r.backend},
          {"case", r.name},
          {"reference", r.reference},
          {"ok", r.ok},
          {"max_abs_err", m.max_abs_err},
          {"max_rel_err", m.max_rel_err},
          {"cosine", m.cosine},
          {"rms_ratio", m.rms_ratio},
          {"mismatches", m.mismatches},
          {"count", m.count},
          {"finite", m.finite},
          {"worst", m.worst},
          {"detail", r.detail}};
}

}  // namespace

int run_check(const CheckArgs& a) {
  std::vector<OpKind> ops;
  std::vector<Backend> backends;
  bool explicit_backend = false;
  ProblemSet problems;
  Status s = parse_op_selection(a.op, &ops);
  if (s.ok()) s = parse_backend_selection(a.backend, &backends, &explicit_backend);
  if (s.ok()) s = parse_problem_set(a.shape, 0, &problems);
  // Before anything is allocated: the largest case must fit in this machine's memory (the hooks'
  // default token counts go up to 64).
  if (s.ok()) s = check_memory_budget(ops, backends, problems, {64}, /*bench=*/false);
  if (!s.ok()) return report_error("check", s);

  // An explicitly requested backend that cannot run here is a failure (exit 1), not a silent pass:
  // "moekit check --backend cuda" on a machine without a GPU must not look green.
  if (explicit_backend) {
    const Status av = registry().backend_available(backends.front());
    if (!av.ok()) {
      std::fprintf(stderr, "moekit check: --backend %s requested but unavailable: %s\n",
                   backend_name(backends.front()), av.message().c_str());
      return kExitFailure;
    }
  }

  std::FILE* notes = a.json ? stderr : stdout;  // keep stdout pure JSON under --json
  nlohmann::json json_cases = nlohmann::json::array();
  int passed = 0, failed = 0, skipped = 0;
  if (!a.json) print_header();

  for (OpKind op : ops) {
    const testing::OpHarness* h = testing::find_harness(op);
    int op_kernels = 0;
    for (Backend b : backends) op_kernels += int(kernels_of(op, b).size());
    if (h == nullptr || h->check == nullptr) {
      std::fprintf(notes, "# %s: skipped: no check hook\n", op_name(op));
      ++skipped;
      continue;
    }
    if (op_kernels == 0) {
      std::fprintf(notes, "# %s: skipped: no kernel registered%s%s\n", op_name(op),
                   explicit_backend ? " for backend " : "", explicit_backend ? backend_name(backends.front()) : "");
      ++skipped;
      continue;
    }
    for (Backend b : backends) {
      if (kernels_of(op, b).empty()) continue;
      const Status av = registry().backend_available(b);
      if (!av.ok()) {
        std::fprintf(notes, "# %s: backend %s skipped: %s\n", op_name(op), backend_name(b), av.message().c_str());
        ++skipped;
        continue;
      }
      size_t cases = 0;
      for (size_t i = 0; i < problems.requests.size(); ++i) {
        testing::CheckRequest req;
        req.shape = problems.requests[i];
        req.tokens = problems.tokens;
        req.has_backend = true;
        req.backend = b;
        req.edge_cases = !a.no_edge_cases && i == 0;
        req.configs = split_commas(a.configs);
        for (testing::CaseResult& r : h->check(req)) {
          if (r.op.empty()) r.op = op_name(op);
          if (r.backend.empty()) r.backend = backend_name(b);
          ++cases;
          (r.ok ? passed : failed) += 1;
          if (a.json) {
            json_cases.push_back(to_json(r));
          } else {
            print_row(r);
          }
        }
      }
      if (cases == 0) {
        std::fprintf(notes, "# %s: backend %s: the check hook returned no cases\n", op_name(op), backend_name(b));
      }
    }
  }

  if (a.json) std::printf("%s\n", json_cases.dump(2).c_str());
  std::fprintf(notes, "%d passed, %d failed", passed, failed);
  if (skipped > 0) std::fprintf(notes, " (%d op/backend pairs skipped, see # lines)", skipped);
  std::fprintf(notes, "\n");
  if (passed + failed == 0) {
    // NOTE: nothing checked is not a pass (a typo'd selection or a hook that returns no cases).
    std::fprintf(stderr, "moekit check: nothing was checked (no case ran for the selected op/backend)\n");
    return kExitFailure;
  }
  return failed > 0 ? kExitFailure : kExitOk;
}

}  // namespace moekit::cli
