// The kernel registry and the dispatch rule (moekit/registry.h, SPEC 6).
#include "moekit/registry.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <set>
#include <sstream>

#include "moekit/core/config.h"

namespace moekit {

const char* backend_name(Backend b) {
  switch (b) {
    case Backend::ref: return "ref";
    case Backend::cpu: return "cpu";
    case Backend::cuda: return "cuda";
  }
  return "?";
}

bool parse_backend(const std::string& s, Backend* out) {
  for (int i = 0; i < kNumBackends; ++i) {
    if (s == backend_name(Backend(i))) {
      *out = Backend(i);
      return true;
    }
  }
  return false;
}

const char* op_name(OpKind op) {
  switch (op) {
    case OpKind::topk_softmax: return "topk_softmax";
    case OpKind::grouped_topk: return "grouped_topk";
    case OpKind::sigmoid_topk: return "sigmoid_topk";
    case OpKind::sort_tokens: return "sort_tokens";
    case OpKind::shuffle_weight: return "shuffle_weight";
    case OpKind::unshuffle_weight: return "unshuffle_weight";
    case OpKind::quantize_fp8: return "quantize_fp8";
    case OpKind::convert_fp8: return "convert_fp8";
    case OpKind::fused_moe: return "fused_moe";
    case OpKind::pack_weight: return "pack_weight";
    case OpKind::unpack_weight: return "unpack_weight";
  }
  return "?";
}

bool parse_op(const std::string& s, OpKind* out) {
  for (int i = 0; i < kNumOps; ++i) {
    if (s == op_name(OpKind(i))) {
      *out = OpKind(i);
      return true;
    }
  }
  return false;
}

const char* variant_name(MoeVariant v) {
  switch (v) {
    case MoeVariant::none: return "none";
    case MoeVariant::fp8_block: return "fp8_block";
    case MoeVariant::fp8_row_tkw1: return "fp8_row_tkw1";
    case MoeVariant::fp8_row: return "fp8_row";
    case MoeVariant::unquantized: return "unquantized";
  }
  return "?";
}

void Registry::add(const Kernel& k) { kernels_.push_back(k); }

void Registry::set_backend_probe(Backend b, Status (*probe)()) { probes_[int(b)] = probe; }

Status Registry::backend_available(Backend b) const {
  Status (*probe)() = probes_[int(b)];
  if (probe == nullptr) return Unsupported("backend ", backend_name(b), " is not compiled in");
  return probe();
}

void Registry::set_device_ops(Backend b, const DeviceOps* ops) { device_ops_[int(b)] = ops; }

const DeviceOps* Registry::device_ops(Backend b) const { return device_ops_[int(b)]; }

const Kernel* Registry::find(const std::string& name) const {
  for (const Kernel& k : kernels_) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

std::vector<const Kernel*> Registry::candidates(OpKind op, MoeVariant variant) const {
  std::vector<const Kernel*> out;
  for (const Kernel& k : kernels_) {
    if (k.op == op && k.serves(variant)) out.push_back(&k);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Kernel* a, const Kernel* b) { return a->priority > b->priority; });
  return out;
}

namespace {

// Whether `name` is one of the comma-separated names in `list`.
bool list_contains(const std::string& list, const char* name) {
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item == name) return true;
  }
  return false;
}

Status accepts(const Registry& r, const Kernel& k, const void* params) {
  MOEKIT_RETURN_IF_ERROR(r.backend_available(k.backend));
  return k.supports(params);
}

void print_choice(OpKind op, MoeVariant variant, const std::string& shape_key, const Kernel& k,
                  const char* why) {
  static std::mutex mu;
  static std::set<std::string> seen;
  const std::string key = std::string(op_name(op)) + "|" + shape_key + "|" + k.name;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key).second) return;
  std::fprintf(stderr, "moekit dispatch: %s%s%s [%s] -> %s (%s)\n", op_name(op),
               variant == MoeVariant::none ? "" : "/", variant == MoeVariant::none ? "" : variant_name(variant),
               shape_key.c_str(), k.name, why);
}

}  // namespace

Status Registry::select(OpKind op, MoeVariant variant, const void* params, const RunOptions& opts,
                        const std::string& shape_key, const Kernel** out) const {
  return select_with(config(), op, variant, params, opts, shape_key, out);
}

Status Registry::select_with(const Config& cfg, OpKind op, MoeVariant variant, const void* params,
                             const RunOptions& opts, const std::string& shape_key, const Kernel** out) const {
  if (!cfg.error.empty()) return InvalidArgument("bad environment: ", cfg.error);
  const std::vector<const Kernel*> cands = candidates(op, variant);
  std::string where = std::string(op_name(op)) +
                      (variant == MoeVariant::none ? "" : std::string(" (variant ") + variant_name(variant) + ")");

  // An explicit config (RunOptions::config) restricts every rule below to the kernels that take one.
  const bool with_config = opts.config != nullptr && *opts.config;
  // 1. explicit argument
  if (opts.kernel != nullptr && *opts.kernel) {
    const Kernel* k = find(opts.kernel);
    if (k == nullptr) return InvalidArgument("kernel '", opts.kernel, "' does not exist (see `moekit ops`)");
    if (k->op != op || !k->serves(variant)) {
      return InvalidArgument("kernel '", opts.kernel, "' implements ", op_name(k->op),
                             k->variant == MoeVariant::none ? "" : "/", k->variant == MoeVariant::none ? "" : variant_name(k->variant),
                             ", not ", where);
    }
    if (with_config && k->configs == nullptr) {
      return InvalidArgument("kernel '", opts.kernel, "' takes no config, got config '", opts.config, "'");
    }
    Status s = accepts(*this, *k, params);
    if (!s.ok()) return Status(s.code(), std::string("kernel '") + k->name + "' refuses: " + s.message());
    if (cfg.print_dispatch) print_choice(op, variant, shape_key, *k, "explicit kernel argument");
    *out = k;
    return Status::Ok();
  }
  // 2. MOEKIT_FORCE_KERNEL: a name that is no kernel of this build is an error, not a silent
  // fallback to the usual choice (names of other ops' kernels are fine: one list serves all ops).
  if (!cfg.force_kernel.empty()) {
    std::stringstream names(cfg.force_kernel);
    std::string name;
    while (std::getline(names, name, ',')) {
      if (!name.empty() && find(name) == nullptr) {
        return InvalidArgument("MOEKIT_FORCE_KERNEL=", cfg.force_kernel, ": no kernel named '", name,
                               "' in this build (see `moekit ops`)");
      }
    }
    for (const Kernel* k : cands) {
      if (!list_contains(cfg.force_kernel, k->name) || (with_config && k->configs == nullptr)) continue;
      Status s = accepts(*this, *k, params);
      if (!s.ok()) {
        return Status(s.code(), std::string("MOEKIT_FORCE_KERNEL=") + cfg.force_kernel + ": kernel '" +
                                    k->name + "' refuses: " + s.message());
      }
      if (cfg.print_dispatch) print_choice(op, variant, shape_key, *k, "MOEKIT_FORCE_KERNEL");
      *out = k;
      return Status::Ok();
    }
  }
  // 3. MOEKIT_BACKEND filter, 4. priority
  Backend only = Backend::ref;
  const bool filtered = cfg.backend != "auto" && parse_backend(cfg.backend, &only);
  std::ostringstream reasons;
  int n = 0;
  for (const Kernel* k : cands) {
    if ((filtered && k->backend != only) || (with_config && k->configs == nullptr)) continue;
    ++n;
    Status s = accepts(*this, *k, params);
    if (s.ok()) {
      if (cfg.print_dispatch) {
        print_choice(op, variant, shape_key, *k,
                     filtered ? "MOEKIT_BACKEND filter, then priority" : "highest priority that accepts");
      }
      *out = k;
      return Status::Ok();
    }
    reasons << "\n  " << k->name << " (" << backend_name(k->backend) << ", priority " << k->priority
            << "): " << s.message();
  }
  const std::string cfg_note = with_config ? std::string(" with config '") + opts.config + "'" : std::string();
  if (n == 0) {
    return Unsupported("no kernel registered for ", where,
                       filtered ? std::string(" with MOEKIT_BACKEND=") + cfg.backend : std::string(),
                       with_config ? " that takes a config" + cfg_note : std::string());
  }
  return Unsupported("no kernel accepts this ", where, " problem [", shape_key, "]", cfg_note, ":", reasons.str());
}

}  // namespace moekit
