/* Calls NVRTC as MLX's JIT module does (the NVRTC cache's tests): create with an
 * in-memory header, add the kernel's name, compile, read the lowered name and the code,
 * destroy. Built as a shared library linked to libnvrtc.so.13, so its references are
 * versioned like libmlx's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct prog;
int nvrtcCreateProgram(struct prog **, const char *, const char *, int, const char *const *, const char *const *);
int nvrtcAddNameExpression(struct prog *, const char *);
int nvrtcCompileProgram(struct prog *, int, const char *const *);
int nvrtcGetLoweredName(struct prog *, const char *, const char **);
int nvrtcGetPTXSize(struct prog *, size_t *);
int nvrtcGetPTX(struct prog *, char *);
int nvrtcGetCUBINSize(struct prog *, size_t *);
int nvrtcGetCUBIN(struct prog *, char *);
int nvrtcGetProgramLogSize(struct prog *, size_t *);
int nvrtcGetProgramLog(struct prog *, char *);
int nvrtcDestroyProgram(struct prog **);

/* jit_named compiles src as file with one name expression, as MLX's JIT module does, and
 * writes "lowered=<name> code=<bytes>" or "error=<step> <code> log=<log>" to out. */
int jit_named(const char *src, const char *header, const char *option, int cubin, const char *file,
              const char *expr, char *out, size_t cap) {
  struct prog *p;
  const char *headers[1] = {header}, *names[1] = {"utils.cuh"}, *opts[1] = {option};
  int e = nvrtcCreateProgram(&p, src, file, 1, headers, names);
  if (e) return snprintf(out, cap, "error=create %d", e), 1;
  nvrtcAddNameExpression(p, expr);
  e = nvrtcCompileProgram(p, 1, opts);
  if (e) {
    size_t n = 0;
    nvrtcGetProgramLogSize(p, &n);
    char *log = malloc(n);
    nvrtcGetProgramLog(p, log);
    snprintf(out, cap, "error=compile %d log=%s", e, log);
    free(log);
    nvrtcDestroyProgram(&p);
    return 1;
  }
  const char *low = NULL;
  e = nvrtcGetLoweredName(p, expr, &low);
  if (e) return snprintf(out, cap, "error=lowered %d", e), 1;
  size_t n = 0;
  e = cubin ? nvrtcGetCUBINSize(p, &n) : nvrtcGetPTXSize(p, &n);
  if (e) return snprintf(out, cap, "error=size %d", e), 1;
  char *code = malloc(n);
  e = cubin ? nvrtcGetCUBIN(p, code) : nvrtcGetPTX(p, code);
  if (e) return snprintf(out, cap, "error=code %d", e), 1;
  snprintf(out, cap, "lowered=%s code=%.*s", low, (int)n, code);
  free(code);
  nvrtcDestroyProgram(&p);
  return 0;
}

int jit(const char *src, const char *header, const char *option, int cubin, char *out, size_t cap) {
  return jit_named(src, header, option, cubin, "kernel.cu", "ns::kernel", out, cap);
}
