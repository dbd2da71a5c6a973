// `moekit run` and `moekit eval` (docs/cli.md): the model runner (include/moekit/model/runner.h) on
// the bundled models. eval prints one row per model x backend x scheme: the task (arithmetic word
// problems, models/data/arith_test.jsonl, 0-shot, greedy), exact match with its stderr (lm-eval's:
// sqrt(p (1 - p) / (n - 1))), and the agreement of the runner's teacher-forced logits with the
// PyTorch model's (reference_logits.safetensors next to the model: top-1 agreement over every
// position of its sequences, max abs diff over the stored full logits). A progress bar on stderr.
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "moekit/model/runner.h"
#include "moekit/model/safetensors.h"
#include "moekit/moekit.h"
#include "model/model_io.h"
#include "commands.h"

namespace moekit::cli {

namespace {

using model::ModelScheme;
using model::MoeModel;
namespace fs = std::filesystem;

// The metric's decoding budget (docs/models.md section 1; tools/train/train.py MAX_NEW_TOKENS):
// greedy decoding stops at eos or after this many new tokens (test targets are <= 55 characters).
constexpr int kEvalMaxNewTokens = 96;

Status parse_backends(const std::string& text, std::vector<Backend>* out) {
  out->clear();
  for (const std::string& b : split_commas(text)) {
    Backend v;
    if (!parse_backend(b, &v)) return InvalidArgument("--backend: '", b, "' is not ref, cpu or cuda");
    out->push_back(v);
  }
  if (out->empty()) return InvalidArgument("--backend: empty");
  return Status::Ok();
}

Status parse_schemes(const std::string& text, std::vector<ModelScheme>* out) {
  out->clear();
  if (text == "all") {
    *out = {ModelScheme::bf16, ModelScheme::fp8_tensor, ModelScheme::fp8_channel, ModelScheme::fp8_block};
    return Status::Ok();
  }
  for (const std::string& s : split_commas(text)) {
    ModelScheme m;
    if (!model::parse_model_scheme(s, &m)) {
      return InvalidArgument("--scheme: '", s, "' is not one of f32, bf16, fp8_tensor, fp8_channel, fp8_block, all");
    }
    out->push_back(m);
  }
  if (out->empty()) return InvalidArgument("--scheme: empty");
  return Status::Ok();
}

// --model: comma-separated model folders; a folder without config.json stands for its subfolders
// that have one (sorted). Filesystem errors are messages, never exceptions (error_code overloads).
Status model_dirs(const std::string& text, std::vector<std::string>* out) {
  out->clear();
  for (const std::string& d : split_commas(text)) {
    std::error_code ec;
    if (fs::exists(fs::path(d) / "config.json", ec)) {
      out->push_back(d);
      continue;
    }
    if (!fs::is_directory(d, ec)) return InvalidArgument("--model: '", d, "' is not a folder");
    std::vector<std::string> sub;
    fs::directory_iterator it(d, ec), end;
    for (; !ec && it != end; it.increment(ec)) {
      std::error_code e2;
      if (it->is_directory(e2) && fs::exists(it->path() / "config.json", e2)) sub.push_back(it->path().string());
    }
    if (ec) return InvalidArgument("--model: cannot list '", d, "': ", ec.message());
    if (sub.empty()) return InvalidArgument("--model: '", d, "' has no model folder (config.json) in it");
    std::sort(sub.begin(), sub.end());
    out->insert(out->end(), sub.begin(), sub.end());
  }
  if (out->empty()) return InvalidArgument("--model: empty");
  return Status::Ok();
}

struct Problem {
  std::string prompt;
  int64_t answer = 0;
};

// The test problems JSONL (docs/models.md section 1): read whole through the model loaders' helper
// (a regular file of at most kMaxDataBytes; a directory or FIFO is refused before it is opened),
// each line's nesting bounded before it is parsed.
constexpr uint64_t kMaxDataBytes = uint64_t(256) << 20;  // 256 MiB: ~1 M problems; the test split is 150 kB

Status read_problems(const std::string& path, int64_t limit, std::vector<Problem>* out) {
  std::string text;
  MOEKIT_RETURN_IF_ERROR(model::read_regular_file("--data", path, kMaxDataBytes, &text));
  int64_t n = 0;
  for (size_t at = 0; at < text.size() && (limit < 0 || int64_t(out->size()) < limit);) {
    const size_t nl = text.find('\n', at);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    const char* line = text.data() + at;
    const size_t len = end - at;
    at = end + 1;
    ++n;
    if (len == 0 || (len == 1 && line[0] == '\r')) continue;
    const bool shallow = model::check_json_depth("--data", line, len).ok();
    const nlohmann::json j = shallow ? nlohmann::json::parse(line, line + len, nullptr, false) : nlohmann::json();
    if (!shallow || j.is_discarded() || !j.is_object() || !j.contains("prompt") || !j["prompt"].is_string() ||
        !j.contains("answer") || !j["answer"].is_number_integer()) {
      return InvalidArgument("--data: line ", n, " of '", path, "' is not a {prompt, answer} JSON object",
                             shallow ? "" : " (nested deeper than 64 levels)");
    }
    out->push_back({j["prompt"].get<std::string>(), j["answer"].get<int64_t>()});
  }
  if (out->empty()) return InvalidArgument("--data: '", path, "' has no problems");
  return Status::Ok();
}

// The integer after the first "####" (task.py extract_answer), or false.
bool extract_answer(const std::string& text, int64_t* v) {
  const size_t at = text.find("####");
  if (at == std::string::npos) return false;
  size_t i = at + 4;
  while (i < text.size() && text[i] == ' ') ++i;
  bool neg = false;
  if (i < text.size() && text[i] == '-') neg = true, ++i;
  if (i >= text.size() || !std::isdigit(static_cast<unsigned char>(text[i]))) return false;
  int64_t x = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) && x < (int64_t(1) << 50)) {
    x = x * 10 + (text[i++] - '0');
  }
  *v = neg ? -x : x;
  return true;
}

void progress_bar(const std::string& label, size_t done, size_t total) {
  const int width = 30, fill = total ? int(width * done / total) : width;
  std::fprintf(stderr, "\r%-44s [%s%s] %zu/%zu", label.c_str(), std::string(size_t(fill), '#').c_str(),
               std::string(size_t(width - fill), '.').c_str(), done, total);
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

// Top-1 agreement and max abs diff of the runner's logits against reference_logits.safetensors.
Status logit_agreement(MoeModel& m, const std::string& dir, int64_t limit, double* top1, double* diff, int64_t* n) {
  model::SafetensorsFile f;
  MOEKIT_RETURN_IF_ERROR(model::SafetensorsFile::open(dir + "/reference_logits.safetensors", &f));
  TensorView ids, lens, am, lg;
  for (auto [name, v] : {std::make_pair("input_ids", &ids), std::make_pair("lengths", &lens),
                         std::make_pair("argmax", &am), std::make_pair("logits", &lg)}) {
    const model::SafetensorsTensor* t = f.find(name);
    if (t == nullptr) return InvalidArgument(dir, "/reference_logits.safetensors: no tensor '", name, "'");
    MOEKIT_RETURN_IF_ERROR(f.view(*t, v));
  }
  const int V = m.config().vocab_size;
  const int64_t S = ids.shape[1], N = limit >= 0 ? std::min(limit, ids.shape[0]) : ids.shape[0];
  int64_t same = 0, total = 0;
  *diff = 0.0;
  for (int64_t s = 0; s < N; ++s) {
    const int32_t len = lens.ptr<const int32_t>()[s];
    const int32_t* row = ids.ptr<const int32_t>() + s * S;
    std::vector<float> out;
    MOEKIT_RETURN_IF_ERROR(m.logits(std::vector<int32_t>(row, row + len), &out));
    for (int32_t p = 0; p < len; ++p) {
      const float* r = out.data() + size_t(p) * size_t(V);
      same += int32_t(std::max_element(r, r + V) - r) == am.ptr<const int32_t>()[s * S + p];
      ++total;
      if (s < lg.shape[0]) {
        for (int v = 0; v < V; ++v) {
          *diff = std::max(*diff, double(std::fabs(r[v] - lg.ptr<const float>()[(s * S + p) * V + v])));
        }
      }
    }
  }
  *top1 = total ? double(same) / double(total) : 0.0;
  *n = N;
  return Status::Ok();
}

}  // namespace

int run_model(const RunArgs& a) {
  std::vector<Backend> backends;
  std::vector<ModelScheme> schemes;
  int64_t max_new = 0;
  Status s = parse_backends(a.backend, &backends);
  if (s.ok()) s = parse_schemes(a.scheme, &schemes);
  if (s.ok()) s = parse_int("--max-new", a.max_new, 0, 1 << 20, &max_new);
  if (s.ok() && (backends.size() != 1 || schemes.size() != 1)) s = InvalidArgument("--backend/--scheme: one each for run");
  if (!s.ok()) return report_error("run", s);
  std::unique_ptr<MoeModel> m;
  s = MoeModel::load(a.model, {backends[0], schemes[0]}, &m);
  if (!s.ok()) return report_error("run", s);
  std::vector<int32_t> ids;
  s = m->tokenizer().encode(a.prompt, &ids);
  if (!s.ok()) return report_error("run", InvalidArgument("--prompt: ", s.message()));
  ids.insert(ids.begin(), m->tokenizer().bos_id());
  std::vector<std::vector<int32_t>> out;
  const auto t0 = std::chrono::steady_clock::now();
  s = m->generate({ids}, int(max_new), 1, &out);
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!s.ok()) return report_error("run", s);
  std::string text;
  s = m->tokenizer().decode(out[0], &text);
  if (!s.ok()) return report_error("run", s);
  std::printf("%s%s\n", a.prompt.c_str(), text.c_str());
  std::fprintf(stderr, "# %zu prompt + %zu generated tokens in %.3f s: %.1f tokens/s (%s, %s, %s)\n", ids.size(),
               out[0].size(), sec, double(ids.size() + out[0].size()) / std::max(sec, 1e-9),
               m->config().model_type.c_str(), backend_name(backends[0]), model::model_scheme_name(schemes[0]));
  return kExitOk;
}

int run_eval(const EvalArgs& a) {
  std::vector<std::string> dirs;
  std::vector<Backend> backends;
  std::vector<ModelScheme> schemes;
  int64_t limit = -1, batch = 64;
  Status s = model_dirs(a.model, &dirs);
  if (s.ok()) s = parse_backends(a.backend, &backends);
  if (s.ok()) s = parse_schemes(a.scheme, &schemes);
  if (s.ok() && !a.limit.empty()) s = parse_int("--limit", a.limit, 1, int64_t(1) << 30, &limit);
  if (s.ok()) s = parse_int("--batch", a.batch, 1, 4096, &batch);
  std::vector<Problem> problems;
  const std::string data =
      a.data.empty() ? (fs::path(dirs.empty() ? "." : dirs[0]).parent_path() / "data" / "arith_test.jsonl").string()
                     : a.data;
  if (s.ok()) s = read_problems(data, limit, &problems);
  // Every backend usable before the first row is printed (no half table on a machine without one).
  for (size_t i = 0; s.ok() && i < backends.size(); ++i) {
    const Status avail = registry().backend_available(backends[i]);
    if (!avail.ok()) s = InvalidArgument("--backend ", backend_name(backends[i]), ": ", avail.message());
  }
  if (!s.ok()) return report_error("eval", s);

  nlohmann::json rows = nlohmann::json::array();
  if (!a.json) {
    std::printf("| model | backend | scheme | task | n-shot | metric | value | stderr | n | top-1 agree | max abs diff | tokens/s |\n");
    std::printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  }
  for (const std::string& dir : dirs) {
    for (Backend b : backends) {
      for (ModelScheme sc : schemes) {
        std::unique_ptr<MoeModel> m;
        s = MoeModel::load(dir, {b, sc}, &m);
        if (!s.ok()) return report_error("eval", s);
        const std::string name = fs::path(dir).filename().string();
        std::vector<std::vector<int32_t>> prompts;
        for (const Problem& p : problems) {
          std::vector<int32_t> ids;
          s = m->tokenizer().encode(p.prompt, &ids);
          if (!s.ok()) return report_error("eval", s);
          ids.insert(ids.begin(), m->tokenizer().bos_id());
          prompts.push_back(std::move(ids));
        }
        const std::string label = name + " " + backend_name(b) + " " + model::model_scheme_name(sc);
        std::vector<std::vector<int32_t>> out;
        const auto t0 = std::chrono::steady_clock::now();
        s = m->generate(prompts, kEvalMaxNewTokens, int(batch), &out,
                        [&](size_t d, size_t t) { progress_bar(label, d, t); });
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!s.ok()) return report_error("eval", s);
        int64_t hits = 0, tokens = 0;
        for (size_t i = 0; i < out.size(); ++i) {
          std::string text;
          int64_t v = 0;
          tokens += int64_t(prompts[i].size() + out[i].size());
          if (m->tokenizer().decode(out[i], &text).ok() && extract_answer(text, &v) && v == problems[i].answer) ++hits;
        }
        const int64_t n = int64_t(out.size());
        const double acc = double(hits) / double(n);
        const double se = n > 1 ? std::sqrt(acc * (1.0 - acc) / double(n - 1)) : 0.0;
        double top1 = -1.0, diff = -1.0;
        int64_t nref = 0;
        std::error_code ec;
        if (fs::exists(fs::path(dir) / "reference_logits.safetensors", ec)) {
          s = logit_agreement(*m, dir, limit, &top1, &diff, &nref);
          if (!s.ok()) return report_error("eval", s);
        }
        const double tps = double(tokens) / std::max(sec, 1e-9);
        rows.push_back({{"model", name}, {"backend", backend_name(b)}, {"scheme", model::model_scheme_name(sc)},
                        {"task", "arith"}, {"n_shot", 0}, {"metric", "exact_match"}, {"value", acc}, {"stderr", se},
                        {"n", n}, {"top1_agreement", top1}, {"max_abs_diff", diff}, {"ref_sequences", nref},
                        {"tokens_per_s", tps}});
        if (!a.json) {
          std::printf("| %s | %s | %s | arith | 0 | exact_match | %.4f | %.4f | %lld | %s | %s | %.0f |\n", name.c_str(),
                      backend_name(b), model::model_scheme_name(sc), acc, se, (long long)n,
                      top1 < 0 ? "-" : (std::to_string(top1).substr(0, 6)).c_str(),
                      diff < 0 ? "-" : (std::to_string(diff).substr(0, 8)).c_str(), tps);
          std::fflush(stdout);
        }
      }
    }
  }
  if (a.json) std::printf("%s\n", rows.dump(1).c_str());
  return kExitOk;
}

}  // namespace moekit::cli
