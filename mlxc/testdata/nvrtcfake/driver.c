/* The NVRTC cache's test driver: one process, one compile through caller.c, then the
 * cache's counts. Usage: driver DIR SOURCE HEADER OPTION ptx|cubin */
#include <stdio.h>
#include <string.h>

int jit(const char *src, const char *header, const char *option, int cubin, char *out, size_t cap);
void mlxc_nvrtc_cache_set_dir(const char *dir);
int mlxc_nvrtc_cache_active(void);
void mlxc_nvrtc_cache_stats(long long *hits, long long *compiles, long long *writes, long long *failures, long long *compile_ns);

int main(int argc, char **argv) {
  if (argc != 6) return 2;
  char out[8192];
  mlxc_nvrtc_cache_set_dir(argv[1]);
  int e = jit(argv[2], argv[3], argv[4], !strcmp(argv[5], "cubin"), out, sizeof out);
  long long h, c, w, f;
  long long ns = 0;
  mlxc_nvrtc_cache_stats(&h, &c, &w, &f, &ns);
  printf("%s\nactive=%d hits=%lld compiles=%lld writes=%lld failures=%lld compile_ns=%lld\n", out,
         mlxc_nvrtc_cache_active(), h, c, w, f, ns);
  return e;
}
