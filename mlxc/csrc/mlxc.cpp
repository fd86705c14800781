// mlxc.cpp: the implementation of mlxc.h over MLX's C++ API.
//
// Every exported function goes through guard(), which turns any C++ exception into a
// non-zero status and a per-thread error text. Nothing here keeps global mutable state
// except the live-handle counter used by leak tests.

#include "mlxc.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <mutex>
#include <dlfcn.h>
#include <cstring>
#include <functional>
#include <map>
#include <unordered_set>
#include <sstream>
#include <string>
#include <vector>

#include "mlx/backend/cuda/cuda.h"
#include "mlx/backend/gpu/device_info.h"
#include "mlx/backend/metal/metal.h"
#include "mlx/compile.h"
#include "mlx/export.h"
#include "mlx/export_impl.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx/version.h"

namespace mx = mlx::core;

namespace {

thread_local std::string g_last_error;
thread_local std::string g_callback_error;
std::atomic<uint64_t> g_live{0};

template <typename F>
int guard(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    g_last_error = e.what();
  } catch (...) {
    g_last_error = "unknown C++ exception";
  }
  return 1;
}

inline mx::array& A(mlxc_array a) {
  if (a == nullptr) throw std::invalid_argument("null or freed array handle");
  return *static_cast<mx::array*>(a);
}

inline mlxc_array wrap(mx::array&& a) {
  g_live.fetch_add(1, std::memory_order_relaxed);
  return new mx::array(std::move(a));
}

inline std::optional<mx::array> opt(mlxc_array a) {
  if (a == nullptr) return std::nullopt;
  return A(a);
}

mx::Dtype dtype_of(int d) {
  switch (d) {
    case MLXC_BOOL: return mx::bool_;
    case MLXC_UINT8: return mx::uint8;
    case MLXC_UINT16: return mx::uint16;
    case MLXC_UINT32: return mx::uint32;
    case MLXC_UINT64: return mx::uint64;
    case MLXC_INT8: return mx::int8;
    case MLXC_INT16: return mx::int16;
    case MLXC_INT32: return mx::int32;
    case MLXC_INT64: return mx::int64;
    case MLXC_FLOAT16: return mx::float16;
    case MLXC_FLOAT32: return mx::float32;
    case MLXC_FLOAT64: return mx::float64;
    case MLXC_BFLOAT16: return mx::bfloat16;
    case MLXC_COMPLEX64: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(d));
}

int code_of(mx::Dtype d) { return static_cast<int>(d.val()); }

mx::Device device_of(int type, int index) {
  return mx::Device(type == 1 ? mx::Device::gpu : mx::Device::cpu, index);
}

mx::Stream S(mlxc_stream s) {
  auto dev = device_of(s.device_type, s.device_index);
  if (s.index < 0) return mx::default_stream(dev);
  return mx::Stream(s.index, dev);
}

mx::Shape shape_of(const int* p, int n) {
  if (n < 0) throw std::invalid_argument("negative rank");
  return n == 0 ? mx::Shape{} : mx::Shape(p, p + n);
}

std::vector<int> ints(const int* p, int n) {
  return n <= 0 ? std::vector<int>{} : std::vector<int>(p, p + n);
}

std::vector<mx::array> arrays(const mlxc_array* p, int n) {
  std::vector<mx::array> v;
  v.reserve(n);
  for (int i = 0; i < n; i++) v.push_back(A(p[i]));
  return v;
}

std::optional<int> opt_int(int v) { return v > 0 ? std::optional<int>(v) : std::nullopt; }

std::string mode_of(const char* m) { return (m == nullptr || *m == 0) ? "affine" : std::string(m); }

// Builds an array from raw host bytes without numeric conversion: the pointer is cast to
// the element type MLX stores, so bf16/f16 bit patterns arrive unchanged.
mx::array from_bytes(const void* data, const mx::Shape& shape, mx::Dtype dt) {
  switch (dt.val()) {
    case mx::Dtype::Val::bool_: return mx::array(static_cast<const bool*>(data), shape, dt);
    case mx::Dtype::Val::uint8: return mx::array(static_cast<const uint8_t*>(data), shape, dt);
    case mx::Dtype::Val::uint16: return mx::array(static_cast<const uint16_t*>(data), shape, dt);
    case mx::Dtype::Val::uint32: return mx::array(static_cast<const uint32_t*>(data), shape, dt);
    case mx::Dtype::Val::uint64: return mx::array(static_cast<const uint64_t*>(data), shape, dt);
    case mx::Dtype::Val::int8: return mx::array(static_cast<const int8_t*>(data), shape, dt);
    case mx::Dtype::Val::int16: return mx::array(static_cast<const int16_t*>(data), shape, dt);
    case mx::Dtype::Val::int32: return mx::array(static_cast<const int32_t*>(data), shape, dt);
    case mx::Dtype::Val::int64: return mx::array(static_cast<const int64_t*>(data), shape, dt);
    case mx::Dtype::Val::float16: return mx::array(static_cast<const mx::float16_t*>(data), shape, dt);
    case mx::Dtype::Val::float32: return mx::array(static_cast<const float*>(data), shape, dt);
    case mx::Dtype::Val::float64: return mx::array(static_cast<const double*>(data), shape, dt);
    case mx::Dtype::Val::bfloat16: return mx::array(static_cast<const mx::bfloat16_t*>(data), shape, dt);
    case mx::Dtype::Val::complex64: return mx::array(static_cast<const mx::complex64_t*>(data), shape, dt);
  }
  throw std::invalid_argument("unsupported dtype");
}

struct TensorMap {
  std::map<std::string, mx::array> tensors;
  std::map<std::string, std::string> meta;
};

using GraphFunction = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

// A compiled function, and the function it compiles (kept so that a trace of it can be
// written out for another process: mlxc_compiled_export).
struct Compiled {
  GraphFunction fn;
  GraphFunction body;
  bool shapeless;
  // Input signatures already looked at for new fused kernels (mlxc_fused_watch).
  std::unordered_set<uint64_t> seen;
};

// Fused kernels watched for (mlxc_fused_watch): whether calls are looked at, and the
// names of the fused kernels met so far in this process.
struct FusedWatch {
  std::atomic<bool> on{false};
  // epoch joins every signature, so that forgetting (mlxc_fused_watch) also makes each
  // function's signatures new again.
  std::atomic<uint64_t> epoch{0};
  std::mutex mu;
  std::unordered_set<std::string> met;
};

FusedWatch& fused_watch() {
  static FusedWatch* w = new FusedWatch;
  return *w;
}

// signature hashes what makes a call trace anew: the inputs' dtypes and dimension counts,
// and their shapes unless the function is shapeless.
uint64_t signature(const std::vector<mx::array>& in, bool shapeless) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(fused_watch().epoch.load(std::memory_order_relaxed));
  for (const auto& a : in) {
    mix(static_cast<uint64_t>(a.dtype().val()) + 1000);
    mix(a.ndim());
    if (!shapeless)
      for (auto d : a.shape()) mix(static_cast<uint64_t>(d));
  }
  return h;
}

// distinct sorts names and drops repeats.
std::vector<std::string> distinct(std::vector<std::string> names) {
  std::sort(names.begin(), names.end());
  names.erase(std::unique(names.begin(), names.end()), names.end());
  return names;
}

// lines joins names, one per line (the form the Go side reads).
std::string lines(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& name : names) s += name + "\n";
  return s;
}

// fused_names_between lists the names of the fused nodes from outs back to the arrays of
// in (a compiled call's own nodes, not the graph behind its inputs), sorted.
std::vector<std::string> fused_names_between(const std::vector<mx::array>& outs, const std::vector<mx::array>& in) {
  std::unordered_set<std::uintptr_t> stop, seen;
  for (const auto& a : in) stop.insert(a.id());
  std::vector<mx::array> stack(outs.begin(), outs.end());
  std::vector<std::string> names;
  while (!stack.empty()) {
    mx::array a = std::move(stack.back());
    stack.pop_back();
    if (stop.count(a.id()) || !seen.insert(a.id()).second) continue;
    if (!a.has_primitive() || a.status() != mx::array::Status::unscheduled) continue;
    if (auto c = dynamic_cast<mx::Compiled*>(&a.primitive())) names.push_back(c->lib_name());
    for (const auto& x : a.inputs()) stack.push_back(x);
  }
  return distinct(std::move(names));
}

}  // namespace

extern "C" {

const char* mlxc_last_error(void) { return g_last_error.c_str(); }
const char* mlxc_runtime_version(void) { return mx::version(); }
#define MLXC_STR2(x) #x
#define MLXC_STR(x) MLXC_STR2(x)
const char* mlxc_header_version(void) {
  return MLXC_STR(MLX_VERSION_MAJOR) "." MLXC_STR(MLX_VERSION_MINOR) "." MLXC_STR(MLX_VERSION_PATCH);
}

int mlxc_check_version(void) {
  std::string rt = mx::version();
  std::ostringstream want;
  want << MLX_VERSION_MAJOR << "." << MLX_VERSION_MINOR << "." << MLX_VERSION_PATCH;
  // The runtime string may carry a suffix (".dev..."), the numeric triple must match.
  if (rt.rfind(want.str(), 0) != 0) {
    g_last_error = "libmlx version " + rt + " does not match headers " + want.str();
    return 1;
  }
  return 0;
}

int mlxc_device_count(int device_type) {
  int n = 0;
  guard([&] {
    if (device_type == 1 && !mx::gpu::is_available()) return;
    n = mx::device_count(device_type == 1 ? mx::Device::gpu : mx::Device::cpu);
  });
  return n;
}

int mlxc_gpu_backend(void) {
  int b = 0;
  guard([&] {
    if (mx::cu::is_available()) b = 1;
    else if (mx::metal::is_available()) b = 2;
  });
  return b;
}

int mlxc_set_default_device(int device_type, int index) {
  return guard([&] { mx::set_default_device(device_of(device_type, index)); });
}

int mlxc_default_device(int* device_type, int* index) {
  return guard([&] {
    auto& d = mx::default_device();
    *device_type = d.type == mx::Device::gpu ? 1 : 0;
    *index = d.index;
  });
}

int mlxc_new_stream(mlxc_stream* out, int device_type, int index) {
  return guard([&] {
    auto s = mx::new_stream(device_of(device_type, index));
    *out = {device_type, index, s.index};
  });
}

int mlxc_default_stream(mlxc_stream* out, int device_type, int index) {
  return guard([&] {
    auto s = mx::default_stream(device_of(device_type, index));
    *out = {device_type, index, s.index};
  });
}

int mlxc_synchronize(mlxc_stream s) { return guard([&] { mx::synchronize(S(s)); }); }

int mlxc_device_info(char** out, int device_type, int index) {
  return guard([&] {
    std::ostringstream os;
    const auto& info = mx::device_info(device_of(device_type, index));
    for (const auto& [k, v] : info) {
      os << k << "=";
      if (std::holds_alternative<std::string>(v)) os << std::get<std::string>(v);
      else os << std::get<size_t>(v);
      os << "\n";
    }
    *out = strdup(os.str().c_str());
  });
}

void mlxc_free_string(char* s) { free(s); }

void mlxc_array_free_many(const mlxc_array* arrs, int n) {
  for (int i = 0; i < n; i++) mlxc_array_free(arrs[i]);
}

// ---- arrays ----

void mlxc_array_free(mlxc_array a) {
  if (a == nullptr) return;
  try {
    delete static_cast<mx::array*>(a);
  } catch (...) {
  }
  g_live.fetch_sub(1, std::memory_order_relaxed);
}

int mlxc_array_from_data(mlxc_array* out, const void* data, const int* shape, int ndim, int dtype) {
  return guard([&] { *out = wrap(from_bytes(data, shape_of(shape, ndim), dtype_of(dtype))); });
}

int mlxc_array_scalar_f(mlxc_array* out, double v, int dtype) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    // float64 is built directly (no float32 detour, and no GPU op: GPUs lack float64).
    if (dt == mx::float64) *out = wrap(mx::array(v, mx::float64));
    else *out = wrap(mx::astype(mx::array(static_cast<float>(v)), dt));
  });
}

int mlxc_array_scalar_i(mlxc_array* out, int64_t v, int dtype) {
  return guard([&] {
    auto dt = dtype_of(dtype);
    if (dt == mx::int64) *out = wrap(mx::array(v, mx::int64));
    else if (dt == mx::uint32) *out = wrap(mx::array(static_cast<uint32_t>(v), mx::uint32));
    else if (dt == mx::uint64) *out = wrap(mx::array(static_cast<uint64_t>(v), mx::uint64));
    else *out = wrap(mx::astype(mx::array(static_cast<int32_t>(v), mx::int32), dt));
  });
}

int mlxc_array_ndim(mlxc_array a) { return a ? static_cast<int>(A(a).ndim()) : -1; }

int mlxc_array_shape(mlxc_array a, int* shape, int cap) {
  if (!a) return -1;
  const auto& sh = A(a).shape();
  int n = static_cast<int>(sh.size());
  for (int i = 0; i < n && i < cap; i++) shape[i] = sh[i];
  return n;
}

int mlxc_array_dtype(mlxc_array a) { return a ? code_of(A(a).dtype()) : -1; }
size_t mlxc_array_size(mlxc_array a) { return a ? A(a).size() : 0; }
size_t mlxc_array_nbytes(mlxc_array a) { return a ? A(a).nbytes() : 0; }

// ---- reading arrays on the host ----
//
// On CUDA, data<T>() of an array in device memory moves its buffer into unified memory for
// good (a new managed allocation, a synchronous copy); the buffer then returns to MLX's
// cache and is handed to a later GPU op of the same size, whose kernel page-faults on its
// first write because the host touched the page. On the H200 the two kernels that
// concatenated each cycle's verify ids into such a recycled buffer took 75 us each for
// 64 bytes. Device-resident arrays are therefore read with the driver's copy instead, which
// leaves the buffer in device memory.

namespace {

// The record behind a CUDA array's buffer (mlx/backend/cuda/allocator.h of MLX 0.32, which
// the portable headers lack): the pointer, the size and the device (-1: unified memory).
struct CudaBufferRecord {
  void* data;
  size_t size;
  int device;
};

using cu_memcpy_dtoh = int (*)(void* dst, unsigned long long src, size_t n);

// cuda_records reports whether buffers are CUDA buffers whose record we can read: the
// layout was taken from MLX 0.32's sources, so with another MLX arrays are read through
// MLX as before (and Location does not tell).
bool cuda_records() {
  static const bool ok = mx::cu::is_available() && std::string(mx::version()).rfind("0.32.", 0) == 0;
  return ok;
}

// device_resident returns the record of arr's buffer when it lives in CUDA device memory.
const CudaBufferRecord* device_resident(const mx::array& arr) {
  if (!cuda_records()) return nullptr;
  auto* rec = static_cast<const CudaBufferRecord*>(arr.buffer().ptr());
  if (!rec || !rec->data || rec->device < 0) return nullptr;
  return rec;
}

// copy_from_device copies nbytes of arr (evaluated, row-contiguous) to dst with
// cuMemcpyDtoH from the libcuda that libmlx loaded. False when that is not possible (not
// CUDA, unified memory, no driver symbol, a failed copy): the caller reads through MLX.
// The copy runs on the legacy stream, which MLX's non-blocking streams do not wait for, so
// reading one cycle's result does not stall the cycles enqueued after it.
bool copy_from_device(const mx::array& arr, void* dst, size_t nbytes) {
  auto* rec = device_resident(arr);
  if (!rec) return false;
  static const auto dtoh = reinterpret_cast<cu_memcpy_dtoh>(dlsym(RTLD_DEFAULT, "cuMemcpyDtoH_v2"));
  if (!dtoh) return false;
  if (arr.offset() < 0 || static_cast<size_t>(arr.offset()) + nbytes > rec->size) return false;
  auto src = reinterpret_cast<unsigned long long>(static_cast<char*>(rec->data) + arr.offset());
  return dtoh(dst, src, nbytes) == 0;
}

}  // namespace

int mlxc_array_location(mlxc_array a) {
  int loc = 0;
  guard([&] {
    auto& arr = A(a);
    if (!cuda_records() || !arr.is_available() || !arr.buffer().ptr()) return;
    loc = device_resident(arr) ? 2 : 1;
  });
  return loc;
}

int mlxc_array_copy_to(mlxc_array a, void* dst, size_t nbytes) {
  return guard([&] {
    auto& arr = A(a);
    if (nbytes != arr.nbytes())
      throw std::invalid_argument("copy_to: buffer has " + std::to_string(nbytes) + " bytes, array has " +
                                  std::to_string(arr.nbytes()));
    arr.eval();
    auto c = arr;
    if (!arr.flags().row_contiguous) {
      c = mx::contiguous(arr, false);
      c.eval();
    }
    if (copy_from_device(c, dst, nbytes)) return;
    std::memcpy(dst, c.data<uint8_t>(), nbytes);
  });
}

int mlxc_array_clone(mlxc_array* out, mlxc_array a) {
  return guard([&] { *out = wrap(mx::array(A(a))); });
}

int mlxc_array_item_f64(mlxc_array a, double* out) {
  return guard([&] {
    // float64 (CPU only) so that int64 and float64 values come back exactly.
    auto x = mx::astype(A(a), mx::float64, mx::Device::cpu);
    if (x.size() != 1) throw std::invalid_argument("item: array has " + std::to_string(x.size()) + " elements");
    *out = x.item<double>();
  });
}

int mlxc_array_item_i64(mlxc_array a, int64_t* out) {
  return guard([&] {
    auto x = mx::astype(A(a), mx::int64, mx::Device::cpu);
    if (x.size() != 1) throw std::invalid_argument("item: array has " + std::to_string(x.size()) + " elements");
    *out = x.item<int64_t>();
  });
}

int mlxc_eval(const mlxc_array* arrs, int n) {
  mlxc_hostprof_note_thread();  // hostprof.cpp samples the thread that evaluates
  return guard([&] { mx::eval(arrays(arrs, n)); });
}
// Visits each distinct primitive that evaluating arrs would run. Evaluated arrays (weights,
// caches) cost nothing and scheduled ones are already queued, so the walk stops at both.
static void each_pending_primitive(const mlxc_array* arrs, int n, const std::function<void(mx::array&)>& visit) {
  // One visit per node: the outputs of a multi-output primitive are siblings of one node.
  // (Not per distinct primitive: repeated custom-kernel launches share one primitive.)
  // Inputs are visited before the nodes that read them (post-order), so a listing reads in
  // the order MLX may run it.
  std::unordered_set<std::uintptr_t> seen;
  std::vector<std::pair<mx::array, bool>> stack;
  for (auto& a : arrays(arrs, n)) stack.emplace_back(std::move(a), false);
  while (!stack.empty()) {
    auto [a, expanded] = std::move(stack.back());
    stack.pop_back();
    if (expanded) {
      visit(a);
      continue;
    }
    if (!seen.insert(a.id()).second) continue;
    if (!a.has_primitive() || a.status() != mx::array::Status::unscheduled) continue;
    for (const auto& sib : a.siblings()) seen.insert(sib.id());
    stack.emplace_back(a, true);
    const auto& ins = a.inputs();
    for (auto it = ins.rbegin(); it != ins.rend(); ++it) stack.emplace_back(*it, false);
  }
}

int mlxc_graph_nodes(const mlxc_array* arrs, int n, int64_t* out) {
  return guard([&] {
    int64_t count = 0;
    each_pending_primitive(arrs, n, [&](mx::array&) { count++; });
    *out = count;
  });
}

int mlxc_graph_ops(const mlxc_array* arrs, int n, char** out) {
  return guard([&] {
    std::map<std::string, int64_t> counts;
    each_pending_primitive(arrs, n, [&](mx::array& a) { counts[a.primitive().name()]++; });
    std::ostringstream os;
    for (const auto& [k, v] : counts) os << k << "=" << v << "\n";
    *out = strdup(os.str().c_str());
  });
}

// One line per pending node, inputs first: the primitive, its output shapes and dtype, and
// the shapes of its inputs (evaluated ones marked *): enough to tell which call built it.
int mlxc_graph_list(const mlxc_array* arrs, int n, char** out) {
  return guard([&] {
    std::ostringstream os;
    auto shape = [&os](const mx::array& x) {
      os << "[";
      for (size_t i = 0; i < x.ndim(); i++) os << (i ? "," : "") << x.shape(static_cast<int>(i));
      os << "]";
    };
    each_pending_primitive(arrs, n, [&](mx::array& a) {
      os << a.primitive().name() << " ";
      auto outs = a.siblings().empty() ? std::vector<mx::array>{a} : a.outputs();
      for (size_t i = 0; i < outs.size(); i++) {
        if (i) os << ",";
        shape(outs[i]);
      }
      os << " " << a.dtype() << " <-";
      for (const auto& in : a.inputs()) {
        os << " ";
        shape(in);
        if (in.status() != mx::array::Status::unscheduled || !in.has_primitive()) os << "*";
      }
      os << "\n";
    });
    *out = strdup(os.str().c_str());
  });
}

int mlxc_async_eval(const mlxc_array* arrs, int n) {
  mlxc_hostprof_note_thread();  // hostprof.cpp samples the thread that evaluates
  return guard([&] { mx::async_eval(arrays(arrs, n)); });
}

// ---- ops ----

int mlxc_unary(mlxc_array* out, int op, mlxc_array a, mlxc_stream s) {
  return guard([&] {
    auto& x = A(a);
    auto st = S(s);
    switch (op) {
      case MLXC_U_NEG: *out = wrap(mx::negative(x, st)); break;
      case MLXC_U_EXP: *out = wrap(mx::exp(x, st)); break;
      case MLXC_U_LOG: *out = wrap(mx::log(x, st)); break;
      case MLXC_U_LOG1P: *out = wrap(mx::log1p(x, st)); break;
      case MLXC_U_SIGMOID: *out = wrap(mx::sigmoid(x, st)); break;
      case MLXC_U_TANH: *out = wrap(mx::tanh(x, st)); break;
      case MLXC_U_SQRT: *out = wrap(mx::sqrt(x, st)); break;
      case MLXC_U_RSQRT: *out = wrap(mx::rsqrt(x, st)); break;
      case MLXC_U_SQUARE: *out = wrap(mx::square(x, st)); break;
      case MLXC_U_ABS: *out = wrap(mx::abs(x, st)); break;
      case MLXC_U_SIN: *out = wrap(mx::sin(x, st)); break;
      case MLXC_U_COS: *out = wrap(mx::cos(x, st)); break;
      // silu and softplus are not C++ ops; these are the same compositions mlx.nn uses.
      case MLXC_U_SILU: *out = wrap(mx::multiply(x, mx::sigmoid(x, st), st)); break;
      case MLXC_U_SOFTPLUS: *out = wrap(mx::logaddexp(x, mx::array(0.0f, x.dtype()), st)); break;
      case MLXC_U_LOGICAL_NOT: *out = wrap(mx::logical_not(x, st)); break;
      case MLXC_U_ISNAN: *out = wrap(mx::isnan(x, st)); break;
      case MLXC_U_ERF: *out = wrap(mx::erf(x, st)); break;
      case MLXC_U_STOP_GRADIENT: *out = wrap(mx::stop_gradient(x, st)); break;
      case MLXC_U_COPY: *out = wrap(mx::copy(x, st)); break;
      case MLXC_U_CONTIGUOUS: *out = wrap(mx::contiguous(x, false, st)); break;
      case MLXC_U_FLOOR: *out = wrap(mx::floor(x, st)); break;
      case MLXC_U_CEIL: *out = wrap(mx::ceil(x, st)); break;
      case MLXC_U_RECIPROCAL: *out = wrap(mx::reciprocal(x, st)); break;
      default: throw std::invalid_argument("unknown unary op " + std::to_string(op));
    }
  });
}

int mlxc_binary(mlxc_array* out, int op, mlxc_array a, mlxc_array b, mlxc_stream s) {
  return guard([&] {
    auto& x = A(a);
    auto& y = A(b);
    auto st = S(s);
    switch (op) {
      case MLXC_B_ADD: *out = wrap(mx::add(x, y, st)); break;
      case MLXC_B_SUB: *out = wrap(mx::subtract(x, y, st)); break;
      case MLXC_B_MUL: *out = wrap(mx::multiply(x, y, st)); break;
      case MLXC_B_DIV: *out = wrap(mx::divide(x, y, st)); break;
      case MLXC_B_MAXIMUM: *out = wrap(mx::maximum(x, y, st)); break;
      case MLXC_B_MINIMUM: *out = wrap(mx::minimum(x, y, st)); break;
      case MLXC_B_POWER: *out = wrap(mx::power(x, y, st)); break;
      case MLXC_B_EQUAL: *out = wrap(mx::equal(x, y, st)); break;
      case MLXC_B_NOT_EQUAL: *out = wrap(mx::not_equal(x, y, st)); break;
      case MLXC_B_GREATER: *out = wrap(mx::greater(x, y, st)); break;
      case MLXC_B_GREATER_EQUAL: *out = wrap(mx::greater_equal(x, y, st)); break;
      case MLXC_B_LESS: *out = wrap(mx::less(x, y, st)); break;
      case MLXC_B_LESS_EQUAL: *out = wrap(mx::less_equal(x, y, st)); break;
      case MLXC_B_LOGICAL_AND: *out = wrap(mx::logical_and(x, y, st)); break;
      case MLXC_B_LOGICAL_OR: *out = wrap(mx::logical_or(x, y, st)); break;
      case MLXC_B_MATMUL: *out = wrap(mx::matmul(x, y, st)); break;
      case MLXC_B_LOGADDEXP: *out = wrap(mx::logaddexp(x, y, st)); break;
      case MLXC_B_REMAINDER: *out = wrap(mx::remainder(x, y, st)); break;
      default: throw std::invalid_argument("unknown binary op " + std::to_string(op));
    }
  });
}

int mlxc_reduce(mlxc_array* out, int op, mlxc_array a, const int* axes, int naxes, bool keepdims, mlxc_stream s) {
  return guard([&] {
    auto& x = A(a);
    auto st = S(s);
    std::vector<int> ax = ints(axes, naxes);
    if (naxes < 0) {  // all axes
      ax.resize(x.ndim());
      for (size_t i = 0; i < ax.size(); i++) ax[i] = static_cast<int>(i);
    }
    switch (op) {
      case MLXC_R_SUM: *out = wrap(mx::sum(x, ax, keepdims, st)); break;
      case MLXC_R_MEAN: *out = wrap(mx::mean(x, ax, keepdims, st)); break;
      case MLXC_R_MAX: *out = wrap(mx::max(x, ax, keepdims, st)); break;
      case MLXC_R_MIN: *out = wrap(mx::min(x, ax, keepdims, st)); break;
      case MLXC_R_ALL: *out = wrap(mx::all(x, ax, keepdims, st)); break;
      case MLXC_R_ANY: *out = wrap(mx::any(x, ax, keepdims, st)); break;
      case MLXC_R_LOGSUMEXP: *out = wrap(mx::logsumexp(x, ax, keepdims, st)); break;
      case MLXC_R_PROD: *out = wrap(mx::prod(x, ax, keepdims, st)); break;
      default: throw std::invalid_argument("unknown reduction " + std::to_string(op));
    }
  });
}

int mlxc_where(mlxc_array* out, mlxc_array cond, mlxc_array x, mlxc_array y, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::where(A(cond), A(x), A(y), S(s))); });
}

int mlxc_addmm(mlxc_array* out, mlxc_array c, mlxc_array a, mlxc_array b, float alpha, float beta, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::addmm(A(c), A(a), A(b), alpha, beta, S(s))); });
}

int mlxc_astype(mlxc_array* out, mlxc_array a, int dtype, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::astype(A(a), dtype_of(dtype), S(s))); });
}

int mlxc_view(mlxc_array* out, mlxc_array a, int dtype, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::view(A(a), dtype_of(dtype), S(s))); });
}

int mlxc_reshape(mlxc_array* out, mlxc_array a, const int* shape, int ndim, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::reshape(A(a), shape_of(shape, ndim), S(s))); });
}

int mlxc_transpose(mlxc_array* out, mlxc_array a, const int* axes, int naxes, mlxc_stream s) {
  return guard([&] {
    if (naxes < 0) *out = wrap(mx::transpose(A(a), S(s)));
    else *out = wrap(mx::transpose(A(a), ints(axes, naxes), S(s)));
  });
}

int mlxc_swapaxes(mlxc_array* out, mlxc_array a, int axis1, int axis2, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::swapaxes(A(a), axis1, axis2, S(s))); });
}

int mlxc_expand_dims(mlxc_array* out, mlxc_array a, const int* axes, int naxes, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::expand_dims(A(a), ints(axes, naxes), S(s))); });
}

int mlxc_squeeze(mlxc_array* out, mlxc_array a, const int* axes, int naxes, mlxc_stream s) {
  return guard([&] {
    if (naxes < 0) *out = wrap(mx::squeeze(A(a), S(s)));
    else *out = wrap(mx::squeeze(A(a), ints(axes, naxes), S(s)));
  });
}

int mlxc_broadcast_to(mlxc_array* out, mlxc_array a, const int* shape, int ndim, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::broadcast_to(A(a), shape_of(shape, ndim), S(s))); });
}

int mlxc_flatten(mlxc_array* out, mlxc_array a, int start, int end, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::flatten(A(a), start, end, S(s))); });
}

int mlxc_concatenate(mlxc_array* out, const mlxc_array* arrs, int n, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::concatenate(arrays(arrs, n), axis, S(s))); });
}

int mlxc_stack(mlxc_array* out, const mlxc_array* arrs, int n, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::stack(arrays(arrs, n), axis, S(s))); });
}

int mlxc_split_sections(mlxc_array* outs, int cap, mlxc_array a, const int* indices, int nidx, int axis,
                        mlxc_stream s) {
  return guard([&] {
    auto parts = mx::split(A(a), shape_of(indices, nidx), axis, S(s));
    if (static_cast<int>(parts.size()) > cap) throw std::invalid_argument("split: too many parts for output buffer");
    for (size_t i = 0; i < parts.size(); i++) outs[i] = wrap(std::move(parts[i]));
  });
}

int mlxc_slice(mlxc_array* out, mlxc_array a, const int* start, const int* stop, const int* strides, int ndim,
               mlxc_stream s) {
  return guard([&] {
    if (strides)
      *out = wrap(mx::slice(A(a), shape_of(start, ndim), shape_of(stop, ndim), shape_of(strides, ndim), S(s)));
    else
      *out = wrap(mx::slice(A(a), shape_of(start, ndim), shape_of(stop, ndim), S(s)));
  });
}

int mlxc_slice_dynamic(mlxc_array* out, mlxc_array a, mlxc_array start, const int* axes, int naxes, const int* size,
                       int ndim, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::slice(A(a), A(start), ints(axes, naxes), shape_of(size, ndim), S(s))); });
}

int mlxc_slice_update(mlxc_array* out, mlxc_array src, mlxc_array upd, const int* start, const int* stop,
                      const int* strides, int ndim, mlxc_stream s) {
  return guard([&] {
    if (strides)
      *out = wrap(mx::slice_update(A(src), A(upd), shape_of(start, ndim), shape_of(stop, ndim),
                                   shape_of(strides, ndim), S(s)));
    else
      *out = wrap(mx::slice_update(A(src), A(upd), shape_of(start, ndim), shape_of(stop, ndim), S(s)));
  });
}

int mlxc_slice_update_dynamic(mlxc_array* out, mlxc_array src, mlxc_array upd, mlxc_array start, const int* axes,
                              int naxes, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::slice_update(A(src), A(upd), A(start), ints(axes, naxes), S(s))); });
}

int mlxc_take(mlxc_array* out, mlxc_array a, mlxc_array idx, int axis, bool has_axis, mlxc_stream s) {
  return guard([&] {
    if (has_axis) *out = wrap(mx::take(A(a), A(idx), axis, S(s)));
    else *out = wrap(mx::take(A(a), A(idx), S(s)));
  });
}

int mlxc_take_along_axis(mlxc_array* out, mlxc_array a, mlxc_array idx, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::take_along_axis(A(a), A(idx), axis, S(s))); });
}

int mlxc_put_along_axis(mlxc_array* out, mlxc_array a, mlxc_array idx, mlxc_array vals, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::put_along_axis(A(a), A(idx), A(vals), axis, S(s))); });
}

int mlxc_argmax(mlxc_array* out, mlxc_array a, int axis, bool keepdims, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::argmax(A(a), axis, keepdims, S(s))); });
}

int mlxc_argpartition(mlxc_array* out, mlxc_array a, int kth, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::argpartition(A(a), kth, axis, S(s))); });
}

int mlxc_topk(mlxc_array* out, mlxc_array a, int k, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::topk(A(a), k, axis, S(s))); });
}

int mlxc_sort(mlxc_array* out, mlxc_array a, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::sort(A(a), axis, S(s))); });
}

int mlxc_argsort(mlxc_array* out, mlxc_array a, int axis, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::argsort(A(a), axis, S(s))); });
}

int mlxc_softmax(mlxc_array* out, mlxc_array a, const int* axes, int naxes, bool precise, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::softmax(A(a), ints(axes, naxes), precise, S(s))); });
}

int mlxc_cumsum(mlxc_array* out, mlxc_array a, int axis, bool reverse, bool inclusive, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::cumsum(A(a), axis, reverse, inclusive, S(s))); });
}

int mlxc_arange(mlxc_array* out, double start, double stop, double step, int dtype, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::arange(start, stop, step, dtype_of(dtype), S(s))); });
}

int mlxc_full(mlxc_array* out, const int* shape, int ndim, mlxc_array val, int dtype, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::full(shape_of(shape, ndim), A(val), dtype_of(dtype), S(s))); });
}

int mlxc_zeros(mlxc_array* out, const int* shape, int ndim, int dtype, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::zeros(shape_of(shape, ndim), dtype_of(dtype), S(s))); });
}

int mlxc_conv1d(mlxc_array* out, mlxc_array in, mlxc_array w, int stride, int padding, int dilation, int groups,
                mlxc_stream s) {
  return guard([&] { *out = wrap(mx::conv1d(A(in), A(w), stride, padding, dilation, groups, S(s))); });
}

int mlxc_tril(mlxc_array* out, mlxc_array a, int k, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::tril(A(a), k, S(s))); });
}

// ---- fast ----

int mlxc_rms_norm(mlxc_array* out, mlxc_array x, mlxc_array weight, float eps, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::fast::rms_norm(A(x), opt(weight), eps, S(s))); });
}

int mlxc_layer_norm(mlxc_array* out, mlxc_array x, mlxc_array weight, mlxc_array bias, float eps, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::fast::layer_norm(A(x), opt(weight), opt(bias), eps, S(s))); });
}

int mlxc_rope(mlxc_array* out, mlxc_array x, int dims, bool traditional, float base, float scale, int offset,
              mlxc_array offset_arr, mlxc_array freqs, mlxc_stream s) {
  return guard([&] {
    std::optional<float> b = freqs ? std::nullopt : std::optional<float>(base);
    if (offset_arr)
      *out = wrap(mx::fast::rope(A(x), dims, traditional, b, scale, A(offset_arr), opt(freqs), S(s)));
    else
      *out = wrap(mx::fast::rope(A(x), dims, traditional, b, scale, offset, opt(freqs), S(s)));
  });
}

int mlxc_sdpa(mlxc_array* out, mlxc_array q, mlxc_array k, mlxc_array v, float scale, const char* mask_mode,
              mlxc_array mask, mlxc_array sinks, mlxc_stream s) {
  return guard([&] {
    std::string mode = mask_mode ? mask_mode : "";
    *out = wrap(mx::fast::scaled_dot_product_attention(A(q), A(k), A(v), scale, mode, opt(mask), opt(sinks), false,
                                                       S(s)));
  });
}

// ---- quantization ----

int mlxc_quantize(mlxc_array* wq, mlxc_array* scales, mlxc_array* biases, mlxc_array w, int group_size, int bits,
                  const char* mode, mlxc_stream s) {
  return guard([&] {
    auto r = mx::quantize(A(w), opt_int(group_size), opt_int(bits), mode_of(mode), std::nullopt, S(s));
    *wq = wrap(std::move(r[0]));
    *scales = wrap(std::move(r[1]));
    *biases = r.size() > 2 ? wrap(std::move(r[2])) : nullptr;
  });
}

int mlxc_dequantize(mlxc_array* out, mlxc_array wq, mlxc_array scales, mlxc_array biases, int group_size, int bits,
                    const char* mode, int out_dtype, mlxc_stream s) {
  return guard([&] {
    std::optional<mx::Dtype> dt = out_dtype < 0 ? std::nullopt : std::optional<mx::Dtype>(dtype_of(out_dtype));
    *out = wrap(mx::dequantize(A(wq), A(scales), opt(biases), opt_int(group_size), opt_int(bits), mode_of(mode),
                               std::nullopt, dt, S(s)));
  });
}

int mlxc_quantized_matmul(mlxc_array* out, mlxc_array x, mlxc_array w, mlxc_array scales, mlxc_array biases,
                          bool transpose, int group_size, int bits, const char* mode, mlxc_stream s) {
  return guard([&] {
    *out = wrap(mx::quantized_matmul(A(x), A(w), A(scales), opt(biases), transpose, opt_int(group_size),
                                     opt_int(bits), mode_of(mode), S(s)));
  });
}

int mlxc_gather_qmm(mlxc_array* out, mlxc_array x, mlxc_array w, mlxc_array scales, mlxc_array biases,
                    mlxc_array lhs_idx, mlxc_array rhs_idx, bool transpose, int group_size, int bits,
                    const char* mode, bool sorted, mlxc_stream s) {
  return guard([&] {
    *out = wrap(mx::gather_qmm(A(x), A(w), A(scales), opt(biases), opt(lhs_idx), opt(rhs_idx), transpose,
                               opt_int(group_size), opt_int(bits), mode_of(mode), std::nullopt, sorted, S(s)));
  });
}

int mlxc_gather_mm(mlxc_array* out, mlxc_array a, mlxc_array b, mlxc_array lhs_idx, mlxc_array rhs_idx, bool sorted,
                   mlxc_stream s) {
  return guard([&] { *out = wrap(mx::gather_mm(A(a), A(b), opt(lhs_idx), opt(rhs_idx), sorted, S(s))); });
}

// ---- random ----

int mlxc_random_key(mlxc_array* out, uint64_t seed) { return guard([&] { *out = wrap(mx::random::key(seed)); }); }

int mlxc_random_split(mlxc_array* out, mlxc_array key, int num, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::random::split(A(key), num, S(s))); });
}

int mlxc_random_categorical(mlxc_array* out, mlxc_array logits, int axis, mlxc_array key, mlxc_stream s) {
  return guard([&] { *out = wrap(mx::random::categorical(A(logits), axis, opt(key), S(s))); });
}

int mlxc_random_uniform(mlxc_array* out, mlxc_array low, mlxc_array high, const int* shape, int ndim, int dtype,
                        mlxc_array key, mlxc_stream s) {
  return guard([&] {
    *out = wrap(mx::random::uniform(A(low), A(high), shape_of(shape, ndim), dtype_of(dtype), opt(key), S(s)));
  });
}

int mlxc_random_normal(mlxc_array* out, const int* shape, int ndim, int dtype, float loc, float scale, mlxc_array key,
                       mlxc_stream s) {
  return guard([&] {
    *out = wrap(mx::random::normal(shape_of(shape, ndim), dtype_of(dtype), loc, scale, opt(key), S(s)));
  });
}

// ---- custom kernels ----

int mlxc_cuda_available(void) {
  bool ok = false;
  guard([&] { ok = mx::cu::is_available() && mx::device_count(mx::Device::gpu) > 0; });
  return ok ? 1 : 0;
}

// mlxc_cuda_multiprocessors reads the SM count of MLX's default GPU from the libcuda that
// libmlx loaded (0 when that is not possible). Kernels whose blocks wait for each other
// size themselves by it.
int mlxc_cuda_multiprocessors(void) {
  using device_get_fn = int (*)(int*, int);
  using attribute_fn = int (*)(int*, int, int);
  constexpr int kMultiprocessorCount = 16;  // CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
  if (!mlxc_cuda_available()) return 0;
  int n = 0;
  guard([&] {
    static const auto get = reinterpret_cast<device_get_fn>(dlsym(RTLD_DEFAULT, "cuDeviceGet"));
    static const auto attr = reinterpret_cast<attribute_fn>(dlsym(RTLD_DEFAULT, "cuDeviceGetAttribute"));
    int dev = 0;
    if (!get || !attr || get(&dev, mx::default_device().index) != 0) return;
    if (attr(&n, kMultiprocessorCount, dev) != 0) n = 0;
  });
  return n;
}

int mlxc_metal_available(void) {
  bool ok = false;
  guard([&] { ok = mx::metal::is_available(); });
  return ok ? 1 : 0;
}

namespace {
// A custom kernel and the primitives its calls have produced. MLX's kernel function
// regenerates the whole kernel source (several KB of string building) on every call, about
// 10 µs, which a verify block with ~280 kernel calls pays every cycle. A CustomKernel
// primitive is immutable and is only read when evaluated, so a call with the same launch
// (template arguments, grid, outputs, input dtypes and ranks, stream) reuses the primitive
// of the first such call and only builds the output arrays.
constexpr size_t kMaxLaunches = 256;

struct Kernel {
  mx::fast::CustomKernelFunction fn;
  std::unordered_map<std::string, std::shared_ptr<mx::Primitive>> launches;
};

void put(std::string& key, int v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); }
}  // namespace

int mlxc_kernel_new(mlxc_kernel* out, int backend, const char* name, const char* const* inputs, int nin,
                    const char* const* outputs, int nout, const char* source, const char* header,
                    bool ensure_row_contiguous, int shared_memory_or_atomic) {
  return guard([&] {
    std::vector<std::string> in(inputs, inputs + nin), outn(outputs, outputs + nout);
    std::string hdr = header ? header : "";
    mx::fast::CustomKernelFunction f;
    if (backend == 1)
      f = mx::fast::cuda_kernel(name, in, outn, source, hdr, ensure_row_contiguous, shared_memory_or_atomic);
    else if (backend == 2)
      f = mx::fast::metal_kernel(name, in, outn, source, hdr, ensure_row_contiguous, shared_memory_or_atomic != 0);
    else
      throw std::invalid_argument("kernel backend must be 1 (cuda) or 2 (metal)");
    *out = new Kernel{std::move(f), {}};
  });
}

void mlxc_kernel_free(mlxc_kernel k) { delete static_cast<Kernel*>(k); }

int mlxc_kernel_apply(mlxc_array* outs, mlxc_kernel k, const mlxc_array* inputs, int nin, const int* out_shapes,
                      const int* out_ndims, const int* out_dtypes, int nout, const int* grid, const int* group,
                      const char* const* targ_names, const int* targ_kinds, const int* targ_vals, int ntarg,
                      bool has_init, float init_value, mlxc_stream s) {
  return guard([&] {
    if (!k) throw std::invalid_argument("null kernel");
    auto& kern = *static_cast<Kernel*>(k);
    auto in = arrays(inputs, nin);
    std::vector<mx::Shape> shapes;
    std::vector<mx::Dtype> dtypes;
    shapes.reserve(nout);
    dtypes.reserve(nout);
    int off = 0;
    for (int i = 0; i < nout; i++) {
      shapes.push_back(shape_of(out_shapes + off, out_ndims[i]));
      off += out_ndims[i];
      dtypes.push_back(dtype_of(out_dtypes[i]));
    }
    auto stream = S(s);
    // Template names take part by content: they name the constants in the source.
    std::string key;
    key.reserve(128);
    for (int v : {grid[0], grid[1], grid[2], group[0], group[1], group[2], nin, nout, ntarg, stream.index,
                  static_cast<int>(stream.device.type), stream.device.index, has_init ? 1 : 0})
      put(key, v);
    int init_bits;
    std::memcpy(&init_bits, &init_value, sizeof(init_bits));
    put(key, init_bits);
    for (auto& a : in) {
      put(key, code_of(a.dtype()));
      put(key, static_cast<int>(a.ndim()));
    }
    for (int i = 0; i < nout; i++) put(key, out_dtypes[i]);
    for (int i = 0; i < off; i++) put(key, out_shapes[i]);
    for (int i = 0; i < nout; i++) put(key, out_ndims[i]);
    for (int i = 0; i < ntarg; i++) {
      put(key, targ_kinds[i]);
      put(key, targ_vals[i]);
      key += targ_names[i];
      key += '\0';
    }
    if (auto hit = kern.launches.find(key); hit != kern.launches.end()) {
      auto r = mx::array::make_arrays(std::move(shapes), dtypes, hit->second, std::move(in));
      for (size_t i = 0; i < r.size(); i++) outs[i] = wrap(std::move(r[i]));
      return;
    }
    std::vector<std::pair<std::string, mx::fast::TemplateArg>> targs;
    for (int i = 0; i < ntarg; i++) {
      // Explicit alternatives: a C bool would otherwise select the int alternative.
      switch (targ_kinds[i]) {
        case 0: targs.emplace_back(targ_names[i], mx::fast::TemplateArg(std::in_place_type<int>, targ_vals[i])); break;
        case 1:
          targs.emplace_back(targ_names[i], mx::fast::TemplateArg(std::in_place_type<bool>, targ_vals[i] != 0));
          break;
        case 2:
          targs.emplace_back(targ_names[i],
                             mx::fast::TemplateArg(std::in_place_type<mx::Dtype>, dtype_of(targ_vals[i])));
          break;
        default: throw std::invalid_argument("unknown template arg kind");
      }
    }
    std::optional<float> init = has_init ? std::optional<float>(init_value) : std::nullopt;
    auto r = kern.fn(in, shapes, dtypes, {grid[0], grid[1], grid[2]}, {group[0], group[1], group[2]}, targs, init,
                     false, stream);
    if (!r.empty() && r[0].has_primitive()) {
      // Bounded: prompt-length-shaped launches (a prefill's rows) would otherwise add an
      // entry, holding the kernel's source, per distinct length for the life of the process.
      if (kern.launches.size() >= kMaxLaunches) kern.launches.clear();
      kern.launches.emplace(std::move(key), r[0].primitive_ptr());
    }
    for (size_t i = 0; i < r.size() && static_cast<int>(i) < nout; i++) outs[i] = wrap(std::move(r[i]));
  });
}

// ---- compile ----

void mlxc_set_callback_error(const char* msg) { g_callback_error = msg ? msg : "callback failed"; }

int mlxc_compile(mlxc_compiled* out, mlxc_graph_fn fn, uintptr_t payload, bool shapeless) {
  return guard([&] {
    // A capturing lambda: MLX keys its compile cache on the function object, so each
    // compiled Go function gets its own cache entries (a shared trampoline would not).
    auto body = [fn, payload](const std::vector<mx::array>& in) -> std::vector<mx::array> {
      std::vector<mlxc_array> hin;
      hin.reserve(in.size());
      for (auto& a : in) hin.push_back(new mx::array(a));
      std::vector<mlxc_array> hout(64, nullptr);
      int n = fn(payload, hin.data(), static_cast<int>(hin.size()), hout.data(), static_cast<int>(hout.size()));
      for (auto h : hin) delete static_cast<mx::array*>(h);
      // The output handles are ours (fresh clones made by the callback): copy the arrays,
      // which are reference-counted, then free the handles.
      std::vector<mx::array> res;
      for (int i = 0; i < n; i++) res.push_back(*static_cast<mx::array*>(hout[i]));
      for (auto h : hout) mlxc_array_free(h);
      if (n < 0) throw std::runtime_error("compiled function: " + g_callback_error);
      return res;
    };
    GraphFunction f(body);
    *out = new Compiled{mx::compile(f, shapeless), f, shapeless};
  });
}

void mlxc_compiled_free(mlxc_compiled c) { delete static_cast<Compiled*>(c); }

int mlxc_compiled_call(mlxc_array* outs, int cap, int* nout, mlxc_compiled c, const mlxc_array* inputs, int n,
                       char** new_fused) {
  return guard([&] {
    if (new_fused) *new_fused = nullptr;
    auto cc = static_cast<Compiled*>(c);
    auto in = arrays(inputs, n);
    auto r = cc->fn(in);
    if (static_cast<int>(r.size()) > cap) throw std::invalid_argument("compiled call: too many outputs");
    auto& w = fused_watch();
    // A call inside another function's trace is that function's; its arrays are placeholders.
    auto traced = [&in] { return std::any_of(in.begin(), in.end(), [](const mx::array& a) { return a.is_tracer(); }); };
    if (new_fused && w.on.load(std::memory_order_relaxed) && !traced() &&
        cc->seen.insert(signature(in, cc->shapeless)).second) {
      std::string fresh;
      std::lock_guard<std::mutex> lock(w.mu);
      for (auto& name : fused_names_between(r, in))
        if (w.met.insert(name).second) fresh += name + "\n";
      if (!fresh.empty()) *new_fused = strdup(fresh.c_str());
    }
    for (size_t i = 0; i < r.size(); i++) outs[i] = wrap(std::move(r[i]));
    *nout = static_cast<int>(r.size());
  });
}

void mlxc_fused_watch(bool on, bool forget) {
  auto& w = fused_watch();
  if (forget) {
    std::lock_guard<std::mutex> lock(w.mu);
    w.met.clear();
    w.epoch++;
  }
  w.on = on;
}

// A fused job's file is MLX's export of the function; its metadata, the lines
//   dflash-fused-job 1
//   shapeless 0|1
//   input <dtype code> <dim>...      (one per input)
//   name <fused kernel name>         (one per kernel the caller's call met)
int mlxc_compiled_export(mlxc_compiled c, const char* path, const mlxc_array* inputs, int n, const char* names) {
  return guard([&] {
    auto cc = static_cast<Compiled*>(c);
    auto in = arrays(inputs, n);
    std::ostringstream meta;
    meta << "dflash-fused-job 1\nshapeless " << (cc->shapeless ? 1 : 0) << "\n";
    for (const auto& a : in) {
      meta << "input " << code_of(a.dtype());
      for (auto d : a.shape()) meta << " " << d;
      meta << "\n";
    }
    std::istringstream ns(names ? names : "");
    for (std::string line; std::getline(ns, line);)
      if (!line.empty()) meta << "name " << line << "\n";
    auto body = cc->body;
    mx::export_function(
        path, [body](const mx::Args& args) { return body(args); }, in, cc->shapeless, meta.str());
  });
}

int mlxc_fused_job_run(const char* path, char** found, char** expected) {
  return guard([&] {
    *found = *expected = nullptr;
    auto imported = std::make_shared<mx::ImportedFunction>(mx::import_function(path));
    std::istringstream meta(imported->metadata());
    std::string line, want;
    bool shapeless = false, header = false;
    std::vector<mx::array> in;
    while (std::getline(meta, line)) {
      std::istringstream f(line);
      std::string kind;
      f >> kind;
      if (kind == "dflash-fused-job") {
        int v = 0;
        f >> v;
        header = v == 1;
      } else if (kind == "shapeless") {
        int v = 0;
        f >> v;
        shapeless = v != 0;
      } else if (kind == "input") {
        int code = -1;
        f >> code;
        mx::Shape shape;
        for (int d; f >> d;) shape.push_back(d);
        in.push_back(mx::zeros(shape, dtype_of(code)));
      } else if (kind == "name") {
        std::string name;
        f >> name;
        want += name + "\n";
      }
    }
    if (!header) throw std::invalid_argument(std::string("not a fused-kernel job: ") + path);
    GraphFunction f = [imported](const std::vector<mx::array>& a) { return (*imported)(a); };
    // The file's scalar constants are read lazily (a load node each), and a compile takes
    // such a node for a scalar input where the exporter's compile saw a constant, naming its
    // kernels otherwise. One plain run reads them first.
    mx::eval(f(in));
    auto compiled = mx::compile(f, shapeless);
    auto out = compiled(in);
    std::string got = lines(fused_names_between(out, in));
    mx::eval(out);
    *found = strdup(got.c_str());
    *expected = strdup(want.c_str());
  });
}

int mlxc_fused_names(const mlxc_array* arrs, int n, char** out) {
  return guard([&] {
    std::vector<std::string> names;
    each_pending_primitive(arrs, n, [&](mx::array& a) {
      if (auto c = dynamic_cast<mx::Compiled*>(&a.primitive())) names.push_back(c->lib_name());
    });
    *out = strdup(lines(distinct(std::move(names))).c_str());
  });
}

int mlxc_set_compile_enabled(bool enabled) {
  return guard([&] {
    if (enabled) mx::enable_compile();
    else mx::disable_compile();
  });
}

// ---- safetensors ----

int mlxc_load_safetensors(mlxc_tensor_map* out, const char* path, mlxc_stream s) {
  return guard([&] {
    auto loaded = mx::load_safetensors(std::string(path), S(s));
    auto m = new TensorMap();
    for (auto& [k, v] : loaded.first) m->tensors.emplace(k, v);
    for (auto& [k, v] : loaded.second) m->meta.emplace(k, v);
    *out = m;
  });
}

int mlxc_tensor_map_new(mlxc_tensor_map* out) {
  return guard([&] { *out = new TensorMap(); });
}

void mlxc_tensor_map_free(mlxc_tensor_map m) { delete static_cast<TensorMap*>(m); }
int mlxc_tensor_map_count(mlxc_tensor_map m) { return static_cast<int>(static_cast<TensorMap*>(m)->tensors.size()); }
int mlxc_tensor_map_meta_count(mlxc_tensor_map m) { return static_cast<int>(static_cast<TensorMap*>(m)->meta.size()); }

int mlxc_tensor_map_at(mlxc_tensor_map m, int i, const char** name, mlxc_array* arr) {
  return guard([&] {
    auto& t = static_cast<TensorMap*>(m)->tensors;
    if (i < 0 || i >= static_cast<int>(t.size())) throw std::out_of_range("tensor map index");
    auto it = std::next(t.begin(), i);
    *name = it->first.c_str();
    *arr = wrap(mx::array(it->second));
  });
}

int mlxc_tensor_map_meta_at(mlxc_tensor_map m, int i, const char** key, const char** value) {
  return guard([&] {
    auto& t = static_cast<TensorMap*>(m)->meta;
    if (i < 0 || i >= static_cast<int>(t.size())) throw std::out_of_range("metadata index");
    auto it = std::next(t.begin(), i);
    *key = it->first.c_str();
    *value = it->second.c_str();
  });
}

int mlxc_tensor_map_put(mlxc_tensor_map m, const char* name, mlxc_array a) {
  return guard([&] { static_cast<TensorMap*>(m)->tensors.insert_or_assign(name, A(a)); });
}

int mlxc_tensor_map_put_meta(mlxc_tensor_map m, const char* key, const char* value) {
  return guard([&] { static_cast<TensorMap*>(m)->meta.insert_or_assign(key, value); });
}

int mlxc_save_safetensors(const char* path, mlxc_tensor_map m) {
  return guard([&] {
    auto tm = static_cast<TensorMap*>(m);
    std::unordered_map<std::string, mx::array> t(tm->tensors.begin(), tm->tensors.end());
    std::unordered_map<std::string, std::string> md(tm->meta.begin(), tm->meta.end());
    mx::save_safetensors(std::string(path), t, md);
  });
}

// ---- distributed ----

namespace {
namespace md = mlx::core::distributed;

std::optional<md::Group> group_of(mlxc_group g) {
  if (g == nullptr) return std::nullopt;
  return *static_cast<md::Group*>(g);
}

std::string backend_of(const char* b) {
  std::string s = (b == nullptr || *b == 0) ? "any" : std::string(b);
  if (s != "any" && s != "ring" && s != "jaccl" && s != "mpi" && s != "nccl") {
    throw std::invalid_argument("unknown distributed backend \"" + s + "\" (any, ring, jaccl, mpi or nccl)");
  }
  return s;
}
}  // namespace

int mlxc_dist_is_available(const char* backend, bool* out) {
  return guard([&] { *out = md::is_available(backend_of(backend)); });
}

int mlxc_dist_init(mlxc_group* out, bool strict, const char* backend) {
  return guard([&] { *out = new md::Group(md::init(strict, backend_of(backend))); });
}

int mlxc_dist_group_free(mlxc_group g) {
  return guard([&] { delete static_cast<md::Group*>(g); });
}

int mlxc_dist_rank(mlxc_group g, int* out) {
  return guard([&] {
    if (g == nullptr) throw std::invalid_argument("null group");
    *out = static_cast<md::Group*>(g)->rank();
  });
}

int mlxc_dist_size(mlxc_group g, int* out) {
  return guard([&] {
    if (g == nullptr) throw std::invalid_argument("null group");
    *out = static_cast<md::Group*>(g)->size();
  });
}

int mlxc_dist_split(mlxc_group* out, mlxc_group g, int color, int key) {
  return guard([&] {
    if (g == nullptr) throw std::invalid_argument("null group");
    *out = new md::Group(static_cast<md::Group*>(g)->split(color, key));
  });
}

int mlxc_dist_collective(mlxc_array* out, int op, mlxc_array x, mlxc_group g) {
  return guard([&] {
    auto& a = A(x);
    auto grp = group_of(g);
    switch (op) {
      case MLXC_D_ALL_SUM: *out = wrap(md::all_sum(a, grp)); break;
      case MLXC_D_ALL_MAX: *out = wrap(md::all_max(a, grp)); break;
      case MLXC_D_ALL_MIN: *out = wrap(md::all_min(a, grp)); break;
      case MLXC_D_ALL_GATHER: *out = wrap(md::all_gather(a, grp)); break;
      case MLXC_D_SUM_SCATTER: *out = wrap(md::sum_scatter(a, grp)); break;
      default: throw std::invalid_argument("unknown collective " + std::to_string(op));
    }
  });
}

int mlxc_dist_send(mlxc_array* out, mlxc_array x, int dst, mlxc_group g) {
  return guard([&] { *out = wrap(md::send(A(x), dst, group_of(g))); });
}

int mlxc_dist_recv(mlxc_array* out, const int* shape, int ndim, int dtype, int src, mlxc_group g) {
  return guard([&] { *out = wrap(md::recv(shape_of(shape, ndim), dtype_of(dtype), src, group_of(g))); });
}

// ---- memory ----

size_t mlxc_active_memory(void) { return mx::get_active_memory(); }
size_t mlxc_peak_memory(void) { return mx::get_peak_memory(); }
void mlxc_reset_peak_memory(void) { mx::reset_peak_memory(); }
size_t mlxc_cache_memory(void) { return mx::get_cache_memory(); }
size_t mlxc_set_memory_limit(size_t limit) { return mx::set_memory_limit(limit); }
size_t mlxc_set_cache_limit(size_t limit) { return mx::set_cache_limit(limit); }
void mlxc_clear_cache(void) { mx::clear_cache(); }
uint64_t mlxc_live_arrays(void) { return g_live.load(std::memory_order_relaxed); }

}  // extern "C"
