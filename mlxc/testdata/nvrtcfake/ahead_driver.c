/* The ahead compiles' test driver: custom kernels compiled as MLX 0.32.4 compiles them
 * (file <function>_<hex of libstdc++'s std::hash of the source>.cu, name expression
 * ns::<function>), some submitted ahead first. Usage: ahead_driver DIR STEP... where a STEP
 * is ahead:<function>:<source> (submit), mlx:<function>:<source> (compile as MLX does,
 * print its output line), plain:<function>:<source> (the same with file <function>.cu) or
 * wait:: (until the compiles ahead are done) or helper:: (compiles ahead run as processes of
 * this program: ahead_driver nvrtc-compile JOB); fused:<module>:<source> (a fused-kernel job
 * for MLX's module of that name, run as this program's fused-compile, which compiles it as
 * MLX does after a pause, or fails at once for a module named fail…) and
 * mlxf:<module>:<source> (compile as MLX compiles its fused module: file <module>.cu, a name
 * expression holding the module's name); then the counts, with the fused jobs' when any. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int jit_named(const char *src, const char *header, const char *option, int cubin, const char *file,
              const char *expr, char *out, size_t cap);
void mlxc_nvrtc_cache_set_dir(const char *dir);
void mlxc_nvrtc_cache_stats(long long *hits, long long *compiles, long long *writes, long long *failures, long long *compile_ns);
void mlxc_nvrtc_ahead(const char *func, const char *source);
void mlxc_nvrtc_ahead_helper(const char *const *argv, int argc);
int mlxc_nvrtc_compile_job(const char *path);
int mlxc_nvrtc_ahead_idle(void);
void mlxc_nvrtc_fused_helper(const char *const *argv, int argc, int max_running);
int mlxc_nvrtc_fused_ahead(const char *modules, const char *path);
void mlxc_nvrtc_fused_stats(long long *submitted, long long *compiled, long long *failed, long long *answered,
                            long long *wait_ns);

/* self_path is this program's file (the helpers run it again), NULL if unknown. */
static const char *self_path(void) {
  static char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return NULL;
  self[n] = 0;
  return self;
}

/* jit_fused compiles src as MLX compiles its fused module named module. */
static int jit_fused(const char *module, const char *src, char *out, size_t cap) {
  char file[200], expr[256];
  snprintf(file, sizeof file, "%s.cu", module);
  snprintf(expr, sizeof expr, "mlx::core::cu::%s_contiguous<uint32_t, 4>", module);
  return jit_named(src, "h1", "-arch=sm_90", 1, file, expr, out, cap);
}

/* fused_compile is the helper's side of a fused job: the file holds the cache's folder, the
 * module and the source, one per line (the source last). */
static int fused_compile(const char *path) {
  static char buf[16384], out[8192];
  FILE *f = fopen(path, "r");
  if (!f) return 2;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char *dir = buf, *module = strchr(dir, '\n'), *src;
  if (!module) return 2;
  *module++ = 0;
  src = strchr(module, '\n');
  if (!src) return 2;
  *src++ = 0;
  if (!strncmp(module, "fail", 4)) return 1;
  usleep(200 * 1000); /* the asking process reaches its compile first, and must wait */
  mlxc_nvrtc_cache_set_dir(dir);
  return jit_fused(module, src, out, sizeof out) ? 1 : 0;
}
void mlxc_nvrtc_ahead_stats(long long *submitted, long long *compiled, long long *present, long long *failed,
                            long long *answered, long long *mismatched, long long *wait_ns);

/* libstd_hash is libstdc++'s std::hash<std::string> on 64-bit targets (_Hash_bytes:
 * MurmurHash2-64A-like, seed 0xc70f6907), written out from its definition. */
static unsigned long long shift_mix(unsigned long long v) { return v ^ (v >> 47); }

static unsigned long long libstd_hash(const char *p, size_t n) {
  const unsigned long long mul = (0xc6a4a793ULL << 32) + 0x5bd1e995ULL;
  unsigned long long h = 0xc70f6907ULL ^ (n * mul);
  size_t aligned = n & ~(size_t)7;
  for (size_t i = 0; i < aligned; i += 8) {
    unsigned long long d;
    memcpy(&d, p + i, 8);
    h ^= shift_mix(d * mul) * mul;
    h *= mul;
  }
  if (n & 7) {
    unsigned long long d = 0;
    for (size_t i = n; i > aligned; i--) d = (d << 8) + (unsigned char)p[i - 1];
    h ^= d;
    h *= mul;
  }
  h = shift_mix(h) * mul;
  return shift_mix(h);
}

int main(int argc, char **argv) {
  if (argc == 3 && !strcmp(argv[1], "nvrtc-compile")) return mlxc_nvrtc_compile_job(argv[2]); /* as a helper */
  if (argc == 3 && !strcmp(argv[1], "fused-compile")) return fused_compile(argv[2]);
  int fused_steps = 0;
  if (argc < 2) return 2;
  mlxc_nvrtc_cache_set_dir(argv[1]);
  for (int i = 2; i < argc; i++) {
    char step[16], func[128];
    const char *src;
    const char *c1 = strchr(argv[i], ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    if (!c2 || c1 - argv[i] >= (long)sizeof step || c2 - c1 - 1 >= (long)sizeof func) return 2;
    snprintf(step, sizeof step, "%.*s", (int)(c1 - argv[i]), argv[i]);
    snprintf(func, sizeof func, "%.*s", (int)(c2 - c1 - 1), c1 + 1);
    src = c2 + 1;
    if (!strcmp(step, "helper")) { /* compiles ahead run as this program's nvrtc-compile */
      const char *self = self_path();
      if (!self) return 2;
      const char *helper[2] = {self, "nvrtc-compile"};
      mlxc_nvrtc_ahead_helper(helper, 2);
      continue;
    }
    if (!strcmp(step, "fused")) { /* a job for module func, run by this program's fused-compile */
      static char path[4200];
      const char *self = self_path();
      if (!self) return 2;
      const char *helper[2] = {self, "fused-compile"};
      mlxc_nvrtc_fused_helper(helper, 2, 2);
      snprintf(path, sizeof path, "%s/.fused-%d-%d.mlxfn", argv[1], (int)getpid(), i);
      FILE *f = fopen(path, "w");
      if (!f) return 2;
      fprintf(f, "%s\n%s\n%s", argv[1], func, src);
      fclose(f);
      if (!mlxc_nvrtc_fused_ahead(func, path)) return 2;
      fused_steps++;
      continue;
    }
    if (!strcmp(step, "mlxf")) {
      char out[8192];
      int e = jit_fused(func, src, out, sizeof out);
      printf("%s\n", out);
      if (e) return 1;
      continue;
    }
    if (!strcmp(step, "wait")) { /* until no compile ahead is queued or running */
      while (!mlxc_nvrtc_ahead_idle()) usleep(1000);
      continue;
    }
    if (!strcmp(step, "ahead")) {
      mlxc_nvrtc_ahead(func, src);
      continue;
    }
    char file[160], expr[160], out[8192];
    if (!strcmp(step, "plain"))
      snprintf(file, sizeof file, "%s.cu", func);
    else
      snprintf(file, sizeof file, "%s_%llx.cu", func, libstd_hash(src, strlen(src)));
    snprintf(expr, sizeof expr, "ns::%s", func);
    int e = jit_named(src, "h1", "-arch=sm_90", 1, file, expr, out, sizeof out);
    printf("%s\n", out);
    if (e) return 1;
  }
  while (!mlxc_nvrtc_ahead_idle()) usleep(1000);
  long long h, c, w, f, ns, sub, comp, pres, fail, ans, mis, wait;
  mlxc_nvrtc_cache_stats(&h, &c, &w, &f, &ns);
  mlxc_nvrtc_ahead_stats(&sub, &comp, &pres, &fail, &ans, &mis, &wait);
  printf("hits=%lld compiles=%lld submitted=%lld ahead=%lld present=%lld failed=%lld answered=%lld mismatched=%lld\n", h,
         c, sub, comp, pres, fail, ans, mis);
  if (fused_steps) {
    long long fs, fc, ff, fa, fw;
    mlxc_nvrtc_fused_stats(&fs, &fc, &ff, &fa, &fw);
    printf("fused: submitted=%lld compiled=%lld failed=%lld answered=%lld waited=%s\n", fs, fc, ff, fa,
           fw > 100 * 1000 * 1000 ? "yes" : "no");
  }
  return 0;
}
