// Flag-value parsing shared by `moekit check` and `moekit bench` (tools/moekit/commands.h): shape
// flags -> ShapeRequest, token lists, integers, op/backend selections. Every error is an
// invalid_argument Status whose message names the flag and shows the value; the subcommands turn
// it into exit code 2 (docs/cli.md). Covered by the bad-argument entries of tests/cli_tests.cmake.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "moekit/ops/fused_moe.h"
#include "commands.h"

namespace moekit::cli {

namespace {

// Upper bounds that keep a typo (--hidden 40960000) from allocating the machine away.
constexpr int64_t kMaxExperts = 1 << 16;
constexpr int64_t kMaxDim = 1 << 20;
constexpr int64_t kMaxTokens = 1 << 22;

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

// NOTE: a local table, not parse_activation(), so the spellings the CLI accepts are pinned here
// (they are part of the CLI contract) independently of the fused_moe implementation.
bool parse_activation_name(const std::string& s, Activation* out) {
  static const struct {
    const char* name;
    Activation act;
  } kNames[] = {{"silu", Activation::silu}, {"gelu", Activation::gelu}, {"gelu_tanh", Activation::gelu_tanh}};
  for (const auto& n : kNames) {
    if (s == n.name) {
      *out = n.act;
      return true;
    }
  }
  return false;
}

std::string preset_names() {
  std::string s;
  for (const testing::ModelPreset& p : testing::model_presets()) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

}  // namespace

Status parse_int(const std::string& flag, const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
  const bool neg = !text.empty() && text[0] == '-';
  const std::string digits = neg ? text.substr(1) : text;
  if (!all_digits(digits) || digits.size() > 18) {
    return InvalidArgument(flag, ": expected an integer, got '", text, "'");
  }
  const int64_t v = (neg ? -1 : 1) * std::strtoll(digits.c_str(), nullptr, 10);
  if (v < lo || v > hi) return InvalidArgument(flag, ": must be in [", lo, ", ", hi, "], got ", v);
  *out = v;
  return Status::Ok();
}

Status parse_positive(const std::string& flag, const std::string& text, double* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || errno != 0 || !std::isfinite(v) || v <= 0) {
    return InvalidArgument(flag, ": expected a positive number, got '", text, "'");
  }
  *out = v;
  return Status::Ok();
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t c = s.find(',', at);
    const std::string part = s.substr(at, c == std::string::npos ? std::string::npos : c - at);
    if (!part.empty()) out.push_back(part);
    if (c == std::string::npos) break;
    at = c + 1;
  }
  return out;
}

Status parse_token_list(const std::string& flag, const std::string& text, int64_t min_value,
                        std::vector<int64_t>* out) {
  std::vector<int64_t> v;
  size_t pos = 0;
  int index = 1;
  while (true) {
    const size_t comma = text.find(',', pos);
    const std::string item = text.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.empty()) {
      return InvalidArgument(flag, ": malformed token list '", text, "': entry ", index, " is empty");
    }
    if (!all_digits(item) || item.size() > 18) {
      return InvalidArgument(flag, ": malformed token list '", text, "': entry ", index, " '", item,
                             "' is not a non-negative integer");
    }
    const int64_t t = std::strtoll(item.c_str(), nullptr, 10);
    if (t < min_value || t > kMaxTokens) {
      return InvalidArgument(flag, ": token count must be in [", min_value, ", ", kMaxTokens, "], got ", item);
    }
    v.push_back(t);
    if (comma == std::string::npos) break;
    pos = comma + 1;
    ++index;
  }
  *out = std::move(v);
  return Status::Ok();
}

Status parse_problem_set(const ShapeFlags& f, int64_t min_tokens, ProblemSet* out) {
  testing::ShapeRequest base;
  if (!f.scheme.empty()) {
    if (!testing::parse_scheme(f.scheme, &base.scheme)) {
      return InvalidArgument("--scheme: unknown scheme '", f.scheme,
                             "' (bf16, f16, f32, fp8_tensor, fp8_channel, fp8_block)");
    }
    base.scheme_given = true;
  }
  if (!f.activation.empty() && !parse_activation_name(f.activation, &base.activation)) {
    return InvalidArgument("--activation: unknown activation '", f.activation, "' (silu, gelu, gelu_tanh)");
  }
  if (!f.seed.empty()) {
    if (!all_digits(f.seed) || f.seed.size() > 19) {
      return InvalidArgument("--seed: expected a non-negative integer, got '", f.seed, "'");
    }
    base.seed = std::strtoull(f.seed.c_str(), nullptr, 10);
  }
  base.full = f.full;
  base.weight_on_input = f.weight_on_input;

  // The size flags go into a separate request: the custom shape, or the named preset's overrides.
  testing::ShapeRequest sized = base;
  const struct {
    const char* flag;
    const std::string& text;
    int64_t max;
    int64_t* out;
  } kSizes[] = {{"--experts", f.experts, kMaxExperts, &sized.experts},
                {"--topk", f.topk, kMaxExperts, &sized.topk},
                {"--hidden", f.hidden, kMaxDim, &sized.hidden},
                {"--inter", f.inter, kMaxDim, &sized.inter}};
  for (const auto& sz : kSizes) {
    if (!sz.text.empty()) MOEKIT_RETURN_IF_ERROR(parse_int(sz.flag, sz.text, 1, sz.max, sz.out));
  }
  const bool sizes_given = !f.experts.empty() || !f.topk.empty() || !f.hidden.empty() || !f.inter.empty();

  ProblemSet ps;
  if (f.model == "custom") {  // the size flags' shape alone
    if (!sizes_given) return InvalidArgument("--model custom: give the shape with --experts / --topk / --hidden / --inter");
    ps.requests.push_back(sized);
  } else if (f.model.empty() || f.model == "all") {
    for (const testing::ModelPreset& p : testing::model_presets()) {
      testing::ShapeRequest r = base;
      r.model = p.name;
      ps.requests.push_back(r);
    }
    if (sizes_given) ps.requests.push_back(sized);
  } else {
    if (testing::find_preset(f.model) == nullptr) {
      return InvalidArgument("--model: unknown model '", f.model, "' (", preset_names(), ", all, custom)");
    }
    sized.model = f.model;
    ps.requests.push_back(sized);
  }

  if (!f.tokens.empty()) MOEKIT_RETURN_IF_ERROR(parse_token_list("--tokens", f.tokens, min_tokens, &ps.tokens));

  // Resolve every request now: an inconsistent combination is a usage error, found before any run.
  for (const testing::ShapeRequest& r : ps.requests) {
    testing::MoeShape s;
    const Status st = testing::resolve_shape(r, ps.tokens.empty() ? 1 : ps.tokens.front(), &s);
    if (!st.ok()) {
      return InvalidArgument(st.message(), " (", r.model.empty() ? "custom shape" : "model " + r.model, ")");
    }
  }
  *out = std::move(ps);
  return Status::Ok();
}

Status parse_op_selection(const std::string& text, std::vector<OpKind>* out) {
  out->clear();
  if (text == "all") {
    for (int i = 0; i < kNumOps; ++i) out->push_back(OpKind(i));
    return Status::Ok();
  }
  OpKind op;
  if (!parse_op(text, &op)) {
    std::string names;
    for (int i = 0; i < kNumOps; ++i) names += std::string(op_name(OpKind(i))) + ", ";
    return InvalidArgument("--op: unknown op '", text, "' (", names, "all)");
  }
  out->push_back(op);
  return Status::Ok();
}

Status parse_backend_selection(const std::string& text, std::vector<Backend>* out, bool* explicit_backend) {
  out->clear();
  *explicit_backend = text != "all";
  if (text == "all") {
    for (int i = 0; i < kNumBackends; ++i) out->push_back(Backend(i));
    return Status::Ok();
  }
  Backend b;
  if (!parse_backend(text, &b)) return InvalidArgument("--backend: unknown backend '", text, "' (ref, cpu, cuda, all)");
  out->push_back(b);
  return Status::Ok();
}

std::vector<const Kernel*> kernels_of(OpKind op, Backend backend) {
  std::vector<const Kernel*> out;
  for (const Kernel& k : registry().kernels()) {
    if (k.op == op && k.backend == backend) out.push_back(&k);
  }
  return out;
}

int report_error(const char* cmd, const Status& s) {
  std::fprintf(stderr, "moekit %s: %s\n", cmd, s.message().c_str());
  // A request too large for the machine is the caller's to change, like a bad argument.
  const bool usage = s.code() == StatusCode::invalid_argument || s.code() == StatusCode::out_of_memory;
  return usage ? kExitUsage : kExitFailure;
}

}  // namespace moekit::cli
