"""py_overhead: the mlx Python baseline for BenchmarkAddOverhead (mlxc/bench_test.go).

One op is one add on [1] float32 arrays, y = mx.add(y, x), chained 1000 deep; each chain is
dropped before the next. "build" only builds the graph; "build+eval" also evaluates the
chain's end. Prints, per variant, the best mean ns per add over the repeats:
  build <ns>
  build+eval <ns>
Usage: py_overhead.py [adds per repeat (200000)] [repeats (5)] [cpu|gpu (cpu)]
"""
import sys
import time

import mlx.core as mx


def main():
    adds = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    dev = mx.gpu if len(sys.argv) > 3 and sys.argv[3] == "gpu" else mx.cpu
    chain_len = 1000
    mx.set_default_device(dev)
    s = mx.default_stream(dev)  # explicit, like the Go binding
    x = mx.array([1.0], dtype=mx.float32)

    def chain(n, ev):
        y = x
        for _ in range(n):
            y = mx.add(y, x, stream=s)
        if ev:
            mx.eval(y)

    for ev in (False, True):
        chain(chain_len, ev)  # warm up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter_ns()
            done = 0
            while done < adds:
                chain(min(chain_len, adds - done), ev)
                done += chain_len
            best = min(best, (time.perf_counter_ns() - t0) / adds)
        print(f"{'build+eval' if ev else 'build'} {best:.1f}")


if __name__ == "__main__":
    main()
