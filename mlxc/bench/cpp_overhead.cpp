// cpp_overhead: the C++ baseline for BenchmarkAddOverhead (mlxc/bench_test.go).
//
// One op is one add on [1] float32 arrays, y = add(y, x), chained 1000 deep; each chain is
// dropped before the next. "build" only builds the graph; "build+eval" also evaluates the
// chain's end. Prints, per variant, the best mean ns per add over the repeats:
//   build <ns>
//   build+eval <ns>
// Usage: cpp_overhead [adds per repeat (200000)] [repeats (5)] [cpu|gpu (cpu)]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "mlx/mlx.h"

namespace mx = mlx::core;

int main(int argc, char** argv) {
  const long adds = argc > 1 ? std::atol(argv[1]) : 200000;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 5;
  const bool gpu = argc > 3 && std::string(argv[3]) == "gpu";
  const int chain_len = 1000;
  const mx::Device dev = gpu ? mx::Device::gpu : mx::Device::cpu;
  mx::set_default_device(dev);
  auto s = mx::default_stream(dev);  // explicit, like the Go binding
  float one = 1;
  mx::array x(&one, mx::Shape{1}, mx::float32);

  auto chain = [&](int n, bool eval) {
    mx::array y = x;
    for (int j = 0; j < n; j++) y = mx::add(y, x, s);
    if (eval) mx::eval(y);
  };
  for (bool eval : {false, true}) {
    chain(chain_len, eval);  // warm up
    double best = std::numeric_limits<double>::max();
    for (int r = 0; r < repeats; r++) {
      auto t0 = std::chrono::steady_clock::now();
      for (long done = 0; done < adds; done += chain_len) chain(static_cast<int>(std::min<long>(chain_len, adds - done)), eval);
      auto t1 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double, std::nano>(t1 - t0).count() / adds);
    }
    std::printf("%s %.1f\n", eval ? "build+eval" : "build", best);
  }
  return 0;
}
