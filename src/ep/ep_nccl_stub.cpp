// Expert parallelism without NCCL (no CUDA backend, or no NCCL found at configure time): the
// runner entry points of include/moekit/ep.h say so. The plan and simulate_host still work.
#include "moekit/ep.h"

namespace moekit::ep {

bool nccl_available() { return false; }

Status create_group(const std::vector<int>&, std::unique_ptr<Group>*) {
  return Unsupported("ep: this build has no NCCL runner (needs the CUDA backend and NCCL at configure time)");
}

Status run(Group&, const std::vector<RankInputs>&, int, const Options&, PhaseTimes*) {
  return Unsupported("ep: this build has no NCCL runner (needs the CUDA backend and NCCL at configure time)");
}

Status bench(const std::vector<int>&, int, int, int64_t, int64_t, int64_t, int, int, const Options&, BenchResult*) {
  return Unsupported("ep: this build has no NCCL runner (needs the CUDA backend and NCCL at configure time)");
}

}  // namespace moekit::ep
