#!/usr/bin/env bash
# overhead.sh: the per-op cost of building an MLX graph node from Go (through mlxc's C API),
# from C++ directly and from mlx's Python bindings, side by side. One op is one add on [1]
# float32 arrays, chained 1000 deep (see mlxc/bench_test.go BenchmarkAddOverhead,
# cpp_overhead.cpp and py_overhead.py). The three take turns, and each figure is the best
# of its repeats (the least disturbed by other load); still, run it on a quiet machine.
#
# Usage: mlxc/bench/overhead.sh [adds per repeat (200000)] [repeats (5)] [cpu|gpu (cpu)]
# Python: $DFLASH_PYREF, else third_party/pyref/bin/python, else /tmp/pyref/bin/python
# (any of them with mlx installed); the Python column is n/a without one.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
adds=${1:-200000}
reps=${2:-5}
dev=${3:-cpu}
mlx=$root/third_party/mlx
[ -f "$mlx/include/mlx/mlx.h" ] || { echo "overhead.sh: no MLX in $mlx (run make deps)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Build: libmlxc.a (cgo links it), the Go test binary, the C++ baseline.
if [ -f "$root/build/build.ninja" ]; then
  (cd "$root/build" && ninja >/dev/null)
fi
(cd "$root" && go test -c -o "$tmp/mlxc.test" ./mlxc)
g++ -std=c++20 -O2 -I"$mlx/include" "$root/mlxc/bench/cpp_overhead.cpp" -o "$tmp/cpp_overhead" \
  -L"$mlx/lib" -lmlx -Wl,-rpath,"$mlx/lib"

py=""
for c in "${DFLASH_PYREF:-}" "$root/third_party/pyref/bin/python" /tmp/pyref/bin/python; do
  if [ -n "$c" ] && [ -x "$c" ] && "$c" -c 'import mlx.core' 2>/dev/null; then
    py=$c
    break
  fi
done

# Run: the three take turns, one repeat each per round, so that load from elsewhere hits
# them alike; keep each one's best per variant.
: >"$tmp/go.txt"
: >"$tmp/cpp.txt"
: >"$tmp/py.txt"
for _ in $(seq "$reps"); do
  DFLASH_DEVICE=$dev "$tmp/mlxc.test" -test.run '^$' -test.bench '^BenchmarkAddOverhead$' \
    -test.benchtime "${adds}x" | awk '/^BenchmarkAddOverhead\// {
      v = $1; sub(/^BenchmarkAddOverhead\//, "", v); sub(/-[0-9]+$/, "", v); print v, $3 }' >>"$tmp/go.txt"
  "$tmp/cpp_overhead" "$adds" 1 "$dev" >>"$tmp/cpp.txt"
  if [ -n "$py" ]; then
    "$py" "$root/mlxc/bench/py_overhead.py" "$adds" 1 "$dev" >>"$tmp/py.txt"
  fi
done

echo "per-op overhead: one add on [1] float32, chains of 1000, best of $reps x $adds adds (ns per add)"
ver=$(awk '/define MLX_VERSION_(MAJOR|MINOR|PATCH) /{v = v (v == "" ? "" : ".") $3} END {print v}' "$mlx/include/mlx/version.h")
echo "MLX $ver on $dev, $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)${py:+, python $py}"
awk '
  function keep(m, k, x) { if (!(k in m) || x < m[k]) m[k] = x }
  FILENAME == ARGV[1] { keep(g, $1, $2) }
  FILENAME == ARGV[2] { keep(c, $1, $2) }
  FILENAME == ARGV[3] { keep(p, $1, $2) }
  END {
    printf "%-12s %12s %12s %12s %12s\n", "variant", "Go+C", "C++", "Python", "Go-C++"
    n = split("build build+eval", vs, " ")
    for (i = 1; i <= n; i++) {
      v = vs[i]
      py = (v in p) ? sprintf("%12.0f", p[v]) : sprintf("%12s", "n/a")
      printf "%-12s %12.0f %12.0f %s %12.0f\n", v, g[v], c[v], py, g[v] - c[v]
    }
  }' "$tmp/go.txt" "$tmp/cpp.txt" "$tmp/py.txt"
