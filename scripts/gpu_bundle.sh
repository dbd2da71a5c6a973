#!/usr/bin/env bash
# Packs the binaries that scripts/gpu_build.sh staged in .gpu and in its variant folders (.gpu/<x>,
# the sides of an A/B) into one archive, .gpu/bundle/bundle.tar.xz, for the device tool's carry
# (64 MiB with the tracked files, ~32 MB of them). The variants share most of their bytes and one
# xz stream with a 256 MiB dictionary finds them: seven binaries took 20.5 MB where one .xz each
# took 7-9 MB (docs/log/perf-2026-12-07.md). Carry `.gpu/bundle`; scripts/gpu_ab.sh and
# scripts/gpu_run.sh unpack it there (or: tar -C .gpu -xJf .gpu/bundle/bundle.tar.xz).
#   bash scripts/gpu_bundle.sh            # every .gpu/**/*.xz
#   NO_TESTS=1 bash scripts/gpu_bundle.sh # without the variants' moekit_tests (the base's kept)
set -euo pipefail
cd "$(dirname "$0")/.."
G=.gpu
[ -d "$G" ] || { echo "gpu_bundle.sh: no $G (stage builds with scripts/gpu_build.sh)"; exit 2; }
T=$(mktemp -d /tmp/moekit_gpu_bundle.XXXXXX)
chmod 755 "$T"  # the archive's "./" entry: unpacking must not narrow .gpu's mode
trap 'rm -rf "$T"' EXIT
n=0
while IFS= read -r f; do
  rel=${f#"$G"/}
  case "$rel" in bundle/*) continue ;; esac
  if [ -n "${NO_TESTS:-}" ] && [[ "$rel" == */moekit_tests.xz ]]; then continue; fi
  mkdir -p "$T/$(dirname "$rel")"
  xz -dc "$f" > "$T/${rel%.xz}"
  chmod +x "$T/${rel%.xz}"
  n=$((n + 1))
done < <(find "$G" -name '*.xz' | sort)
[ "$n" -gt 0 ] || { echo "gpu_bundle.sh: no staged .xz under $G"; exit 2; }
mkdir -p "$G/bundle"
tar -C "$T" -cf - . | xz -T1 -6 --lzma2=preset=6,dict=256MiB > "$G/bundle/bundle.tar.xz.part"
mv "$G/bundle/bundle.tar.xz.part" "$G/bundle/bundle.tar.xz"
echo "gpu_bundle.sh: $n binaries -> $G/bundle/bundle.tar.xz ($(du -h "$G/bundle/bundle.tar.xz" | cut -f1))"
