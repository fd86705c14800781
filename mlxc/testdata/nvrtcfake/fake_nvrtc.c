/* A stand-in for libnvrtc.so.13 (the NVRTC cache's tests): "compiling" a program makes
 * its outputs from its source and options, and each compile is counted in a file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct prog {
  char *src;
  char names[8][128];
  char lowered[8][160];
  int nnames, compiled;
  char out[4096];
};

static void count_compile(void) {
  const char *path = getenv("FAKE_NVRTC_COUNT");
  if (!path) return;
  FILE *f = fopen(path, "a");
  if (f) {
    fputs("compile\n", f);
    fclose(f);
  }
}

int nvrtcVersion(int *major, int *minor) {
  *major = 13;
  *minor = 0;
  return 0;
}

int nvrtcCreateProgram(struct prog **p, const char *src, const char *name, int nh, const char *const *h,
                       const char *const *in) {
  (void)name, (void)nh, (void)h, (void)in;
  *p = calloc(1, sizeof(struct prog));
  (*p)->src = strdup(src);
  return 0;
}

int nvrtcAddNameExpression(struct prog *p, const char *n) {
  if (p->compiled) return 8; /* NVRTC_ERROR_NO_NAME_EXPRESSIONS_AFTER_COMPILATION */
  snprintf(p->names[p->nnames++], 128, "%s", n);
  return 0;
}

int nvrtcCompileProgram(struct prog *p, int n, const char *const *opts) {
  count_compile();
  if (strstr(p->src, "#error")) return 6; /* NVRTC_ERROR_COMPILATION */
  snprintf(p->out, sizeof p->out, "code(%s", p->src);
  for (int i = 0; i < n; i++) {
    strncat(p->out, "|", sizeof p->out - strlen(p->out) - 1);
    strncat(p->out, opts[i], sizeof p->out - strlen(p->out) - 1);
  }
  strncat(p->out, ")", sizeof p->out - strlen(p->out) - 1);
  for (int i = 0; i < p->nnames; i++) snprintf(p->lowered[i], 160, "_Z%zu%s", strlen(p->names[i]), p->names[i]);
  p->compiled = 1;
  return 0;
}

int nvrtcGetLoweredName(struct prog *p, const char *n, const char **out) {
  if (!p->compiled) return 9; /* NVRTC_ERROR_NO_LOWERED_NAMES_BEFORE_COMPILATION */
  for (int i = 0; i < p->nnames; i++)
    if (!strcmp(p->names[i], n)) {
      *out = p->lowered[i];
      return 0;
    }
  return 10; /* NVRTC_ERROR_NAME_EXPRESSION_NOT_VALID */
}

static int code(struct prog *p, const char *kind, size_t *size, char *dst) {
  char buf[4200];
  if (!p->compiled) return 4; /* NVRTC_ERROR_INVALID_PROGRAM */
  snprintf(buf, sizeof buf, "%s:%s", kind, p->out);
  if (size) *size = strlen(buf) + 1;
  if (dst) memcpy(dst, buf, strlen(buf) + 1);
  return 0;
}

int nvrtcGetPTXSize(struct prog *p, size_t *s) { return code(p, "ptx", s, NULL); }
int nvrtcGetPTX(struct prog *p, char *d) { return code(p, "ptx", NULL, d); }
int nvrtcGetCUBINSize(struct prog *p, size_t *s) { return code(p, "cubin", s, NULL); }
int nvrtcGetCUBIN(struct prog *p, char *d) { return code(p, "cubin", NULL, d); }
int nvrtcGetProgramLogSize(struct prog *p, size_t *s) {
  *s = p->compiled ? 1 : 6;
  return 0;
}
int nvrtcGetProgramLog(struct prog *p, char *d) {
  strcpy(d, p->compiled ? "" : "error");
  return 0;
}
int nvrtcDestroyProgram(struct prog **p) {
  free((*p)->src);
  free(*p);
  *p = NULL;
  return 0;
}
