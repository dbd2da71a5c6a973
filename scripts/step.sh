# Sourced by scripts/test_python.sh and scripts/test_vllm.sh: step NAME COMMAND... runs COMMAND and
# prints its duration, so a slow set-up step is visible in CI logs.
step() {
  local name=$1 start=$SECONDS
  shift
  echo "== $name"
  "$@"
  echo "== $name: $((SECONDS - start)) s"
}
