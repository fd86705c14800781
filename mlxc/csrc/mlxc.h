/*
 * mlxc: dflash-mlx's own C API over MLX's C++ API.
 *
 * Conventions (in the spirit of mlx-c, written for our needs):
 *  - Arrays are opaque heap handles (mlxc_array). Every handle returned by a
 *    function must be released with mlxc_array_free exactly once.
 *  - Functions return 0 on success and non-zero on failure; the failure text is
 *    kept per thread and read with mlxc_last_error(). All MLX work runs on one
 *    OS thread, so the per-thread slot is the caller's.
 *  - Results come back through the leading out-parameters.
 *  - Every op takes an explicit stream (mlxc_stream by value). index < 0 means
 *    "the default stream of that device on this thread".
 *  - No C++ exception ever leaves this library.
 */
#ifndef MLXC_H
#define MLXC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void* mlxc_array;

/* Same order as mlx::core::Dtype::Val. */
typedef enum {
  MLXC_BOOL = 0,
  MLXC_UINT8,
  MLXC_UINT16,
  MLXC_UINT32,
  MLXC_UINT64,
  MLXC_INT8,
  MLXC_INT16,
  MLXC_INT32,
  MLXC_INT64,
  MLXC_FLOAT16,
  MLXC_FLOAT32,
  MLXC_FLOAT64,
  MLXC_BFLOAT16,
  MLXC_COMPLEX64,
} mlxc_dtype;

typedef struct {
  int device_type; /* 0 = cpu, 1 = gpu */
  int device_index;
  int index; /* < 0: default stream of the device on this thread */
} mlxc_stream;

/* ---- runtime, version, devices ---- */
const char* mlxc_last_error(void);
const char* mlxc_runtime_version(void); /* mlx::core::version() */
const char* mlxc_header_version(void);  /* from mlx/version.h at compile time */
int mlxc_check_version(void);           /* non-zero when they differ */
int mlxc_device_count(int device_type);
int mlxc_gpu_backend(void); /* 0 none, 1 cuda, 2 metal */
int mlxc_set_default_device(int device_type, int index);
int mlxc_default_device(int* device_type, int* index);
int mlxc_new_stream(mlxc_stream* out, int device_type, int index);
int mlxc_default_stream(mlxc_stream* out, int device_type, int index);
int mlxc_synchronize(mlxc_stream s);
int mlxc_device_info(char** out, int device_type, int index); /* "k=v\n" lines; free with mlxc_free_string */
void mlxc_free_string(char* s);

/* ---- arrays ---- */
void mlxc_array_free(mlxc_array a);
void mlxc_array_free_many(const mlxc_array* arrs, int n); /* mlxc_array_free on each */
int mlxc_array_from_data(mlxc_array* out, const void* data, const int* shape, int ndim, int dtype);
int mlxc_array_scalar_f(mlxc_array* out, double v, int dtype);
int mlxc_array_scalar_i(mlxc_array* out, int64_t v, int dtype);
int mlxc_array_ndim(mlxc_array a);
int mlxc_array_shape(mlxc_array a, int* shape, int cap); /* returns ndim */
int mlxc_array_dtype(mlxc_array a);
size_t mlxc_array_size(mlxc_array a);
size_t mlxc_array_nbytes(mlxc_array a);
int mlxc_array_copy_to(mlxc_array a, void* dst, size_t nbytes); /* evaluates, makes contiguous, copies */
/* where an evaluated array's buffer lives: 0 not CUDA with MLX 0.32 (or not evaluated), 1 CUDA unified memory, 2 CUDA device memory */
int mlxc_array_location(mlxc_array a);
int mlxc_array_clone(mlxc_array* out, mlxc_array a);             /* a second handle to the same array */
int mlxc_array_item_f64(mlxc_array a, double* out);
int mlxc_array_item_i64(mlxc_array a, int64_t* out);
int mlxc_eval(const mlxc_array* arrs, int n);
/* Number of distinct primitives not yet evaluated in the graphs of arrs (≈ kernels an eval launches). */
int mlxc_graph_nodes(const mlxc_array* arrs, int n, int64_t* out);
int mlxc_graph_ops(const mlxc_array* arrs, int n, char** out); /* "primitive=count\n" lines; free with mlxc_free_string */
int mlxc_graph_list(const mlxc_array* arrs, int n, char** out); /* a line per pending node, inputs first; free with mlxc_free_string */
int mlxc_async_eval(const mlxc_array* arrs, int n);

/* ---- elementwise and simple ops ---- */
enum {
  MLXC_U_NEG = 0, MLXC_U_EXP, MLXC_U_LOG, MLXC_U_LOG1P, MLXC_U_SIGMOID, MLXC_U_TANH, MLXC_U_SQRT,
  MLXC_U_RSQRT, MLXC_U_SQUARE, MLXC_U_ABS, MLXC_U_SIN, MLXC_U_COS, MLXC_U_SILU, MLXC_U_SOFTPLUS,
  MLXC_U_LOGICAL_NOT, MLXC_U_ISNAN, MLXC_U_ERF, MLXC_U_STOP_GRADIENT, MLXC_U_COPY, MLXC_U_CONTIGUOUS,
  MLXC_U_FLOOR, MLXC_U_CEIL, MLXC_U_RECIPROCAL
};
int mlxc_unary(mlxc_array* out, int op, mlxc_array a, mlxc_stream s);

enum {
  MLXC_B_ADD = 0, MLXC_B_SUB, MLXC_B_MUL, MLXC_B_DIV, MLXC_B_MAXIMUM, MLXC_B_MINIMUM, MLXC_B_POWER,
  MLXC_B_EQUAL, MLXC_B_NOT_EQUAL, MLXC_B_GREATER, MLXC_B_GREATER_EQUAL, MLXC_B_LESS, MLXC_B_LESS_EQUAL,
  MLXC_B_LOGICAL_AND, MLXC_B_LOGICAL_OR, MLXC_B_MATMUL, MLXC_B_LOGADDEXP, MLXC_B_REMAINDER
};
int mlxc_binary(mlxc_array* out, int op, mlxc_array a, mlxc_array b, mlxc_stream s);

enum { MLXC_R_SUM = 0, MLXC_R_MEAN, MLXC_R_MAX, MLXC_R_MIN, MLXC_R_ALL, MLXC_R_ANY, MLXC_R_LOGSUMEXP, MLXC_R_PROD };
int mlxc_reduce(mlxc_array* out, int op, mlxc_array a, const int* axes, int naxes, bool keepdims, mlxc_stream s);

int mlxc_where(mlxc_array* out, mlxc_array cond, mlxc_array x, mlxc_array y, mlxc_stream s);
int mlxc_addmm(mlxc_array* out, mlxc_array c, mlxc_array a, mlxc_array b, float alpha, float beta, mlxc_stream s);
int mlxc_astype(mlxc_array* out, mlxc_array a, int dtype, mlxc_stream s);
int mlxc_view(mlxc_array* out, mlxc_array a, int dtype, mlxc_stream s);
int mlxc_reshape(mlxc_array* out, mlxc_array a, const int* shape, int ndim, mlxc_stream s);
int mlxc_transpose(mlxc_array* out, mlxc_array a, const int* axes, int naxes, mlxc_stream s);
int mlxc_swapaxes(mlxc_array* out, mlxc_array a, int axis1, int axis2, mlxc_stream s);
int mlxc_expand_dims(mlxc_array* out, mlxc_array a, const int* axes, int naxes, mlxc_stream s);
int mlxc_squeeze(mlxc_array* out, mlxc_array a, const int* axes, int naxes, mlxc_stream s);
int mlxc_broadcast_to(mlxc_array* out, mlxc_array a, const int* shape, int ndim, mlxc_stream s);
int mlxc_flatten(mlxc_array* out, mlxc_array a, int start, int end, mlxc_stream s);
int mlxc_concatenate(mlxc_array* out, const mlxc_array* arrs, int n, int axis, mlxc_stream s);
int mlxc_stack(mlxc_array* out, const mlxc_array* arrs, int n, int axis, mlxc_stream s);
int mlxc_split_sections(mlxc_array* outs, int cap, mlxc_array a, const int* indices, int nidx, int axis, mlxc_stream s);
int mlxc_slice(mlxc_array* out, mlxc_array a, const int* start, const int* stop, const int* strides, int ndim, mlxc_stream s);
int mlxc_slice_dynamic(mlxc_array* out, mlxc_array a, mlxc_array start, const int* axes, int naxes, const int* size, int ndim, mlxc_stream s);
int mlxc_slice_update(mlxc_array* out, mlxc_array src, mlxc_array upd, const int* start, const int* stop, const int* strides, int ndim, mlxc_stream s);
int mlxc_slice_update_dynamic(mlxc_array* out, mlxc_array src, mlxc_array upd, mlxc_array start, const int* axes, int naxes, mlxc_stream s);
int mlxc_take(mlxc_array* out, mlxc_array a, mlxc_array idx, int axis, bool has_axis, mlxc_stream s);
int mlxc_take_along_axis(mlxc_array* out, mlxc_array a, mlxc_array idx, int axis, mlxc_stream s);
int mlxc_put_along_axis(mlxc_array* out, mlxc_array a, mlxc_array idx, mlxc_array vals, int axis, mlxc_stream s);
int mlxc_argmax(mlxc_array* out, mlxc_array a, int axis, bool keepdims, mlxc_stream s);
int mlxc_argpartition(mlxc_array* out, mlxc_array a, int kth, int axis, mlxc_stream s);
int mlxc_topk(mlxc_array* out, mlxc_array a, int k, int axis, mlxc_stream s);
int mlxc_sort(mlxc_array* out, mlxc_array a, int axis, mlxc_stream s);
int mlxc_argsort(mlxc_array* out, mlxc_array a, int axis, mlxc_stream s);
int mlxc_softmax(mlxc_array* out, mlxc_array a, const int* axes, int naxes, bool precise, mlxc_stream s);
int mlxc_cumsum(mlxc_array* out, mlxc_array a, int axis, bool reverse, bool inclusive, mlxc_stream s);
int mlxc_arange(mlxc_array* out, double start, double stop, double step, int dtype, mlxc_stream s);
int mlxc_full(mlxc_array* out, const int* shape, int ndim, mlxc_array val, int dtype, mlxc_stream s);
int mlxc_zeros(mlxc_array* out, const int* shape, int ndim, int dtype, mlxc_stream s);
int mlxc_conv1d(mlxc_array* out, mlxc_array in, mlxc_array w, int stride, int padding, int dilation, int groups, mlxc_stream s);
int mlxc_tril(mlxc_array* out, mlxc_array a, int k, mlxc_stream s);

/* ---- fast ---- */
int mlxc_rms_norm(mlxc_array* out, mlxc_array x, mlxc_array weight /* may be NULL */, float eps, mlxc_stream s);
int mlxc_layer_norm(mlxc_array* out, mlxc_array x, mlxc_array weight, mlxc_array bias, float eps, mlxc_stream s);
/* freqs may be NULL (then base is used); offset_arr may be NULL (then offset is used). */
int mlxc_rope(mlxc_array* out, mlxc_array x, int dims, bool traditional, float base, float scale, int offset,
              mlxc_array offset_arr, mlxc_array freqs, mlxc_stream s);
/* mask_mode: "", "causal" or "array" (then mask must be given). sinks may be NULL. */
int mlxc_sdpa(mlxc_array* out, mlxc_array q, mlxc_array k, mlxc_array v, float scale, const char* mask_mode,
              mlxc_array mask, mlxc_array sinks, mlxc_stream s);

/* ---- quantization ---- */
int mlxc_quantize(mlxc_array* wq, mlxc_array* scales, mlxc_array* biases, mlxc_array w, int group_size, int bits,
                  const char* mode, mlxc_stream s);
int mlxc_dequantize(mlxc_array* out, mlxc_array wq, mlxc_array scales, mlxc_array biases, int group_size, int bits,
                    const char* mode, int out_dtype /* <0: default */, mlxc_stream s);
int mlxc_quantized_matmul(mlxc_array* out, mlxc_array x, mlxc_array w, mlxc_array scales, mlxc_array biases,
                          bool transpose, int group_size, int bits, const char* mode, mlxc_stream s);
int mlxc_gather_qmm(mlxc_array* out, mlxc_array x, mlxc_array w, mlxc_array scales, mlxc_array biases,
                    mlxc_array lhs_idx, mlxc_array rhs_idx, bool transpose, int group_size, int bits,
                    const char* mode, bool sorted, mlxc_stream s);
int mlxc_gather_mm(mlxc_array* out, mlxc_array a, mlxc_array b, mlxc_array lhs_idx, mlxc_array rhs_idx, bool sorted,
                   mlxc_stream s);

/* ---- random (explicit keys only) ---- */
int mlxc_random_key(mlxc_array* out, uint64_t seed);
int mlxc_random_split(mlxc_array* out, mlxc_array key, int num, mlxc_stream s);
int mlxc_random_categorical(mlxc_array* out, mlxc_array logits, int axis, mlxc_array key, mlxc_stream s);
int mlxc_random_uniform(mlxc_array* out, mlxc_array low, mlxc_array high, const int* shape, int ndim, int dtype,
                        mlxc_array key, mlxc_stream s);
int mlxc_random_normal(mlxc_array* out, const int* shape, int ndim, int dtype, float loc, float scale, mlxc_array key,
                       mlxc_stream s);

/* ---- custom kernels ---- */
typedef void* mlxc_kernel;
int mlxc_cuda_available(void);
int mlxc_cuda_multiprocessors(void);
int mlxc_metal_available(void);
/* A disk cache in front of NVRTC (nvrtc_cache.cpp): "" turns it off. */
void mlxc_nvrtc_cache_set_dir(const char* dir);
int mlxc_nvrtc_cache_active(void); /* 1: libmlx's NVRTC calls reach the cache */
void mlxc_nvrtc_cache_stats(long long* hits, long long* compiles, long long* writes, long long* write_failures,
                            long long* compile_ns);
/* Compiles a custom kernel's program ahead of MLX's own compile of it (nvrtc_cache.cpp). */
void mlxc_nvrtc_ahead(const char* func, const char* source);
int mlxc_nvrtc_ahead_idle(void); /* 1: no ahead compile queued or running */
void mlxc_nvrtc_ahead_helper(const char* const* argv, int argc); /* compiles ahead run as argv + job file */
int mlxc_nvrtc_compile_job(const char* path);                     /* the helper's work: 0 done */
/* Fused-kernel jobs: MLX's own fused kernels compiled by a helper process that runs the same compiled function
 * (mlxc_compiled_export, mlxc_fused_job_run), at most max_running at once. modules: the kernels' names, one per
 * line. mlxc_nvrtc_fused_ahead returns 1 when queued (the job's file is then removed by the cache), 0 when not. */
void mlxc_nvrtc_fused_helper(const char* const* argv, int argc, int max_running);
int mlxc_nvrtc_fused_ahead(const char* modules, const char* path);
void mlxc_nvrtc_fused_stats(long long* submitted, long long* compiled, long long* failed, long long* answered,
                            long long* wait_ns);
void mlxc_nvrtc_ahead_stats(long long* submitted, long long* compiled, long long* present, long long* failed,
                            long long* answered, long long* mismatched, long long* wait_ns);
/* backend: 1 cuda, 2 metal. names are NUL-separated lists with counts. */
int mlxc_kernel_new(mlxc_kernel* out, int backend, const char* name, const char* const* inputs, int nin,
                    const char* const* outputs, int nout, const char* source, const char* header,
                    bool ensure_row_contiguous, int shared_memory_or_atomic);
void mlxc_kernel_free(mlxc_kernel k);
/* out_shapes: concatenated dims; out_ndims: per output. template args: names + kinds (0 int, 1 bool, 2 dtype) + values. */
int mlxc_kernel_apply(mlxc_array* outs, mlxc_kernel k, const mlxc_array* inputs, int nin, const int* out_shapes,
                      const int* out_ndims, const int* out_dtypes, int nout, const int* grid, const int* group,
                      const char* const* targ_names, const int* targ_kinds, const int* targ_vals, int ntarg,
                      bool has_init, float init_value, mlxc_stream s);

/* ---- compile ---- */
typedef void* mlxc_compiled;
/* The callback builds the graph: it receives n inputs (borrowed handles, valid during the call) and must write up
 * to cap outputs into outs and return the count, or -1 on error (the message goes through
 * mlxc_set_callback_error). Output handles must be new (e.g. from mlxc_array_clone): the library takes them over
 * and frees them, also the ones written before an error. */
typedef int (*mlxc_graph_fn)(uintptr_t payload, const mlxc_array* inputs, int n, mlxc_array* outs, int cap);
void mlxc_set_callback_error(const char* msg);
int mlxc_compile(mlxc_compiled* out, mlxc_graph_fn fn, uintptr_t payload, bool shapeless);
void mlxc_compiled_free(mlxc_compiled c);
/* new_fused (may be NULL): while mlxc_fused_watch is on, set to the names of the fused kernels a call meets
 * that no call in this process met before (one per line; free with mlxc_free_string), else NULL. A function
 * is looked at once per input signature. */
int mlxc_compiled_call(mlxc_array* outs, int cap, int* nout, mlxc_compiled c, const mlxc_array* inputs, int n,
                       char** new_fused);
/* forget: also forget the kernels and signatures met so far. */
void mlxc_fused_watch(bool on, bool forget);
/* Writes c's function, traced on inputs' shapes and dtypes, to path in MLX's export format: a fused-kernel job
 * for names (one per line), which mlxc_fused_job_run runs in another process. */
int mlxc_compiled_export(mlxc_compiled c, const char* path, const mlxc_array* inputs, int n, const char* names);
/* Runs a fused-kernel job: compiles its function, runs it on zeros of its inputs' shapes and evaluates it.
 * found: the names of the fused kernels it met; expected: the job's. One per line, freed with
 * mlxc_free_string. */
int mlxc_fused_job_run(const char* path, char** found, char** expected);
/* The distinct names of the fused (compiled) nodes behind arrs, sorted, one per line. */
int mlxc_fused_names(const mlxc_array* arrs, int n, char** out);
int mlxc_set_compile_enabled(bool enabled);

/* ---- safetensors ---- */
typedef void* mlxc_tensor_map;
int mlxc_load_safetensors(mlxc_tensor_map* out, const char* path, mlxc_stream s);
int mlxc_tensor_map_new(mlxc_tensor_map* out);
void mlxc_tensor_map_free(mlxc_tensor_map m);
int mlxc_tensor_map_count(mlxc_tensor_map m);
int mlxc_tensor_map_meta_count(mlxc_tensor_map m);
/* i-th entry (order of an internal sorted list); name is valid until the map is freed. */
int mlxc_tensor_map_at(mlxc_tensor_map m, int i, const char** name, mlxc_array* arr);
int mlxc_tensor_map_meta_at(mlxc_tensor_map m, int i, const char** key, const char** value);
int mlxc_tensor_map_put(mlxc_tensor_map m, const char* name, mlxc_array a);
int mlxc_tensor_map_put_meta(mlxc_tensor_map m, const char* key, const char* value);
int mlxc_save_safetensors(const char* path, mlxc_tensor_map m);

/* ---- memory ---- */
size_t mlxc_active_memory(void);
size_t mlxc_peak_memory(void);
void mlxc_reset_peak_memory(void);
size_t mlxc_cache_memory(void);
size_t mlxc_set_memory_limit(size_t limit);
size_t mlxc_set_cache_limit(size_t limit);
void mlxc_clear_cache(void);
uint64_t mlxc_live_arrays(void); /* handles created and not yet freed (leak checks) */

/* ---- distributed (mlx::core::distributed) ----
 * A group is an opaque heap handle, freed with mlxc_dist_group_free. A null group in an
 * op means MLX's default group (the first one initialised). The collectives are lazy graph
 * ops like any other; each backend runs them on the stream it chooses (ring, JACCL and
 * MPI on the CPU, NCCL on the GPU). backend: "any", "ring", "jaccl", "mpi" or "nccl". */
typedef void* mlxc_group;
int mlxc_dist_is_available(const char* backend, bool* out);
int mlxc_dist_init(mlxc_group* out, bool strict, const char* backend);
int mlxc_dist_group_free(mlxc_group g);
int mlxc_dist_rank(mlxc_group g, int* out);
int mlxc_dist_size(mlxc_group g, int* out);
int mlxc_dist_split(mlxc_group* out, mlxc_group g, int color, int key);
enum { MLXC_D_ALL_SUM = 0, MLXC_D_ALL_MAX, MLXC_D_ALL_MIN, MLXC_D_ALL_GATHER, MLXC_D_SUM_SCATTER };
int mlxc_dist_collective(mlxc_array* out, int op, mlxc_array x, mlxc_group g);
int mlxc_dist_send(mlxc_array* out, mlxc_array x, int dst, mlxc_group g);
int mlxc_dist_recv(mlxc_array* out, const int* shape, int ndim, int dtype, int src, mlxc_group g);

/* ---- host profiler (hostprof.cpp; Linux only, diagnostic) ---- */
/* 0 on success; a nonzero code names the failing step (8: not supported here). */
int mlxc_hostprof_start(int interval_us, int max_samples);
void mlxc_hostprof_label(int label); /* 0 pauses recording */
int mlxc_hostprof_stop(const char* path);
void mlxc_hostprof_note_thread(void); /* called by the eval entry points */

#ifdef __cplusplus
}
#endif
#endif
