// A disk cache in front of NVRTC for MLX's CUDA backend.
//
// Why: MLX compiles every custom kernel (fast::cuda_kernel) with NVRTC in every process and
// keeps none of them on disk (its JIT module cache is asked not to for custom kernels), so
// each process paid ~15 s of compiles before its first tokens on an H200. This file defines
// the NVRTC entry points MLX calls; the executable exports them (cgo links with
// -rdynamic), so libmlx's references bind here first, and each call goes on to the real
// libnvrtc (found with RTLD_NEXT) unless the cache answers it.
//
// Invariants:
// - A program is answered from the cache only when everything that shapes its compiled
//   code is byte-for-byte what the entry was made from: NVRTC's version, the options
//   (target architecture included), the name expressions, the source, its file name,
//   every in-memory header with its include name and every file the source includes by
//   absolute path. The entry stores all of that and the
//   comparison is exact (no hash decides).
// - An answered program is still created in the real NVRTC, so anything the cache does not
//   hold (an output kind or a lowered name it never recorded) compiles it for real then.
// - Entries are written whole (temporary file, then rename) and read back with a checksum;
//   a damaged or foreign file is a miss, never an error.
// - Programs the cache never saw (created before it was enabled, or by other callers) pass
//   through untouched. With no folder set the cache is off and every call passes through.
#if defined(__linux__)

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mlxc.h"

namespace {

// NVRTC's C types and the result codes used here (nvrtc.h: nvrtcResult, nvrtcProgram).
using nvrtc_result = int;
constexpr nvrtc_result kSuccess = 0;
constexpr nvrtc_result kInvalidInput = 3;
constexpr nvrtc_result kInternalError = 11;
struct nvrtc_program_st;
using nvrtc_program = nvrtc_program_st*;

// The real libnvrtc's functions, looked up once (null where no NVRTC is loaded: the CPU
// and Metal builds, where nothing calls these).
struct RealNVRTC {
  nvrtc_result (*create)(nvrtc_program*, const char*, const char*, int, const char* const*, const char* const*);
  nvrtc_result (*add_name)(nvrtc_program, const char*);
  nvrtc_result (*compile)(nvrtc_program, int, const char* const*);
  nvrtc_result (*lowered)(nvrtc_program, const char*, const char**);
  nvrtc_result (*ptx_size)(nvrtc_program, size_t*);
  nvrtc_result (*ptx)(nvrtc_program, char*);
  nvrtc_result (*cubin_size)(nvrtc_program, size_t*);
  nvrtc_result (*cubin)(nvrtc_program, char*);
  nvrtc_result (*log_size)(nvrtc_program, size_t*);
  nvrtc_result (*log)(nvrtc_program, char*);
  nvrtc_result (*destroy)(nvrtc_program*);
  nvrtc_result (*version)(int*, int*);
};

template <typename F>
void next_symbol(F& f, const char* name) {
  f = reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

const RealNVRTC& real() {
  static const RealNVRTC r = [] {
    RealNVRTC r{};
    next_symbol(r.create, "nvrtcCreateProgram");
    next_symbol(r.add_name, "nvrtcAddNameExpression");
    next_symbol(r.compile, "nvrtcCompileProgram");
    next_symbol(r.lowered, "nvrtcGetLoweredName");
    next_symbol(r.ptx_size, "nvrtcGetPTXSize");
    next_symbol(r.ptx, "nvrtcGetPTX");
    next_symbol(r.cubin_size, "nvrtcGetCUBINSize");
    next_symbol(r.cubin, "nvrtcGetCUBIN");
    next_symbol(r.log_size, "nvrtcGetProgramLogSize");
    next_symbol(r.log, "nvrtcGetProgramLog");
    next_symbol(r.destroy, "nvrtcDestroyProgram");
    next_symbol(r.version, "nvrtcVersion");
    return r;
  }();
  return r;
}

// Output kinds an entry can hold.
enum Kind : uint8_t { kPTX = 0, kCUBIN = 1 };

// What one compile produced, as far as its caller asked for it.
struct Outputs {
  std::map<std::string, std::string> lowered;  // name expression → lowered name
  std::map<uint8_t, std::string> code;         // Kind → PTX (with its NUL) or CUBIN bytes
};

// A program the cache follows.
struct Program {
  std::string source;
  std::string key;        // source, headers and names so far; the options join at compile
  std::vector<std::string> names;
  bool keyed = false;     // the compile was asked for: key is whole
  bool answered = false;  // answered from an entry; NVRTC has not compiled it
  bool compiled = false;  // NVRTC compiled it (successfully)
  bool recorded = false;  // outputs gained something worth writing
  Outputs out;
  std::vector<std::string> compile_options;
};

struct Cache {
  std::mutex mu;
  std::string dir;  // "" = off
  std::map<nvrtc_program, std::unique_ptr<Program>> programs;
  std::atomic<long long> hits{0}, compiles{0}, writes{0}, write_failures{0};
  // compile_ns is the wall time spent in NVRTC's own compile, every program's.
  std::atomic<long long> compile_ns{0};
};

Cache& cache() {
  static Cache c;
  return c;
}

void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; i++) s.push_back(char((v >> (8 * i)) & 0xff));
}

void put_bytes(std::string& s, const std::string& b) {
  put_u64(s, b.size());
  s += b;
}

struct Reader {
  const std::string& s;
  size_t at = 0;
  bool ok = true;
  uint64_t u64() {
    if (s.size() - at < 8) {
      ok = false;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= uint64_t(uint8_t(s[at + i])) << (8 * i);
    at += 8;
    return v;
  }
  std::string bytes() {
    uint64_t n = u64();
    if (!ok || n > s.size() - at) {
      ok = false;
      return {};
    }
    std::string b = s.substr(at, n);
    at += n;
    return b;
  }
};

uint64_t fnv1a(const std::string& s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

constexpr const char* kMagic = "dflash-mlx nvrtc cache 1\n";

// entry_path names a key's file: two independent hashes of the key (the file holds the
// key itself, compared whole on reading).
std::string entry_path(const std::string& dir, const std::string& key) {
  char name[64];
  std::snprintf(name, sizeof name, "%016llx%016llx.bin", (unsigned long long)fnv1a(key),
                (unsigned long long)fnv1a(key, 0x9e3779b97f4a7c15ull));
  return dir + "/" + name;
}

std::string encode(const std::string& key, const Outputs& out) {
  std::string s = kMagic;
  put_bytes(s, key);
  put_u64(s, out.lowered.size());
  for (auto& [name, low] : out.lowered) {
    put_bytes(s, name);
    put_bytes(s, low);
  }
  put_u64(s, out.code.size());
  for (auto& [kind, bytes] : out.code) {
    put_u64(s, kind);
    put_bytes(s, bytes);
  }
  put_u64(s, fnv1a(s));
  return s;
}

bool decode(const std::string& s, const std::string& key, Outputs& out) {
  size_t magic = std::strlen(kMagic);
  if (s.size() < magic + 8 || s.compare(0, magic, kMagic) != 0) return false;
  std::string body = s.substr(0, s.size() - 8);
  Reader sum{s, s.size() - 8};
  if (sum.u64() != fnv1a(body)) return false;
  Reader r{body, magic};
  if (r.bytes() != key || !r.ok) return false;
  uint64_t n = r.u64();
  for (uint64_t i = 0; r.ok && i < n; i++) {
    std::string name = r.bytes();
    std::string low = r.bytes();
    out.lowered[name] = low;
  }
  uint64_t k = r.u64();
  for (uint64_t i = 0; r.ok && i < k; i++) {
    uint64_t kind = r.u64();
    out.code[uint8_t(kind)] = r.bytes();
  }
  return r.ok && r.at == body.size();
}

bool read_entry(const std::string& path, const std::string& key, Outputs& out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  return decode(s, key, out);
}

// write_entry writes the file whole: a temporary file in the same folder, then a rename,
// so a reader sees the old entry, the new one or none.
bool write_entry(const std::string& path, const std::string& data) {
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n <= 0) break;
    done += size_t(n);
  }
  bool ok = done == data.size() && fsync(fd) == 0;
  ok = close(fd) == 0 && ok;
  if (ok && rename(tmp.c_str(), path.c_str()) == 0) return true;
  unlink(tmp.c_str());
  return false;
}

// included_files appends to out the text of every file the source includes by absolute
// path, each with its path (NVRTC reads those from the file system: our kernels' bodies
// are such files, content-addressed, but a file edited in place must not meet its old
// code). False when one cannot be read: such a program is not cached.
bool included_files(const std::string& src, std::string& out) {
  size_t at = 0;
  while ((at = src.find("#include \"/", at)) != std::string::npos) {
    size_t start = at + 10, end = src.find('"', start);
    if (end == std::string::npos) return false;
    std::string path = src.substr(start, end - start);
    at = end;
    std::ifstream f(path, std::ios::binary);
    if (!f) return false;
    put_bytes(out, path);
    put_bytes(out, std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>()));
  }
  return true;
}

// follow returns the cache's record of p, or null when the cache does not follow it.
Program* follow(nvrtc_program p) {
  auto& c = cache();
  auto it = c.programs.find(p);
  return it == c.programs.end() ? nullptr : it->second.get();
}

// timed_compile runs NVRTC's compile and adds its wall time to the cache's count.
nvrtc_result timed_compile(nvrtc_program p, int n, const char* const* opts) {
  auto start = std::chrono::steady_clock::now();
  nvrtc_result r = real().compile(p, n, opts);
  cache().compile_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// compile_now compiles an answered program for real when the caller asks for something
// its entry lacks (c.mu held).
nvrtc_result compile_now(nvrtc_program p, Program& rec) {
  if (!rec.answered || rec.compiled) return kSuccess;
  std::vector<const char*> opts;
  for (auto& o : rec.compile_options) opts.push_back(o.c_str());
  nvrtc_result r = timed_compile(p, int(opts.size()), opts.data());
  if (r != kSuccess) return r;
  rec.compiled = true;
  cache().compiles++;
  return kSuccess;
}

nvrtc_result get_code(nvrtc_program p, Kind kind, size_t* size, char* dst) {
  auto& c = cache();
  auto& r = real();
  auto size_fn = kind == kPTX ? r.ptx_size : r.cubin_size;
  auto get_fn = kind == kPTX ? r.ptx : r.cubin;
  if (!size_fn || !get_fn) return kInternalError;
  std::lock_guard<std::mutex> lock(c.mu);
  Program* rec = follow(p);
  if (rec && rec->answered) {
    auto it = rec->out.code.find(kind);
    if (it != rec->out.code.end()) {
      if (size) *size = it->second.size();
      if (dst) std::memcpy(dst, it->second.data(), it->second.size());
      return kSuccess;
    }
    if (nvrtc_result e = compile_now(p, *rec); e != kSuccess) return e;
  }
  size_t n = 0;
  nvrtc_result e = size_fn(p, &n);
  if (e != kSuccess) return e;
  if (size) *size = n;
  if (!dst) return kSuccess;
  e = get_fn(p, dst);
  if (e == kSuccess && rec && rec->compiled && rec->keyed) {
    rec->out.code[kind] = std::string(dst, n);
    rec->recorded = true;
  }
  return e;
}

}  // namespace

extern "C" {

nvrtc_result nvrtcCompileProgram(nvrtc_program prog, int num_options, const char* const* options);

void mlxc_nvrtc_cache_set_dir(const char* dir) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.dir = dir ? dir : "";
  while (c.dir.size() > 1 && c.dir.back() == '/') c.dir.pop_back();
  if (!c.dir.empty()) mkdir(c.dir.c_str(), 0755);
}

// mlxc_nvrtc_cache_active reports whether a global lookup of NVRTC's compile entry point
// finds this file's (so libmlx's calls come here): the executable must export it.
int mlxc_nvrtc_cache_active(void) {
  return dlsym(RTLD_DEFAULT, "nvrtcCompileProgram") == reinterpret_cast<void*>(&nvrtcCompileProgram) ? 1 : 0;
}

void mlxc_nvrtc_cache_stats(long long* hits, long long* compiles, long long* writes, long long* write_failures,
                            long long* compile_ns) {
  auto& c = cache();
  *compile_ns = c.compile_ns;
  *hits = c.hits;
  *compiles = c.compiles;
  *writes = c.writes;
  *write_failures = c.write_failures;
}

nvrtc_result nvrtcCreateProgram(nvrtc_program* prog, const char* src, const char* name, int num_headers,
                                const char* const* headers, const char* const* include_names) {
  if (!real().create) return kInternalError;
  nvrtc_result e = real().create(prog, src, name, num_headers, headers, include_names);
  auto& c = cache();
  if (e != kSuccess || !src) return e;
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.dir.empty()) return e;
  auto rec = std::make_unique<Program>();
  rec->source = src;
  put_bytes(rec->key, src);
  put_bytes(rec->key, name ? name : "");
  put_u64(rec->key, uint64_t(num_headers));
  for (int i = 0; i < num_headers; i++) {
    put_bytes(rec->key, headers && headers[i] ? headers[i] : "");
    put_bytes(rec->key, include_names && include_names[i] ? include_names[i] : "");
  }
  c.programs[*prog] = std::move(rec);
  return e;
}

nvrtc_result nvrtcAddNameExpression(nvrtc_program prog, const char* const expr) {
  if (!real().add_name) return kInternalError;
  nvrtc_result e = real().add_name(prog, expr);
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (Program* rec = follow(prog); rec && e == kSuccess && expr) rec->names.push_back(expr);
  return e;
}

nvrtc_result nvrtcCompileProgram(nvrtc_program prog, int num_options, const char* const* options) {
  auto& r = real();
  if (!r.compile) return kInternalError;
  auto& c = cache();
  std::unique_lock<std::mutex> lock(c.mu);
  Program* rec = follow(prog);
  std::string included;
  if (rec && !rec->keyed && !included_files(rec->source, included)) {
    c.programs.erase(prog);
    rec = nullptr;
  }
  if (!rec || rec->keyed) {
    lock.unlock();
    return timed_compile(prog, num_options, options);
  }
  int major = 0, minor = 0;
  if (r.version) r.version(&major, &minor);
  std::string key = "nvrtc " + std::to_string(major) + "." + std::to_string(minor) + "\n";
  put_u64(key, uint64_t(num_options));
  for (int i = 0; i < num_options; i++) {
    rec->compile_options.push_back(options[i] ? options[i] : "");
    put_bytes(key, rec->compile_options.back());
  }
  put_u64(key, rec->names.size());
  for (auto& n : rec->names) put_bytes(key, n);
  rec->key = key + rec->key + included;
  rec->keyed = true;
  Outputs out;
  if (read_entry(entry_path(c.dir, rec->key), rec->key, out)) {
    rec->out = std::move(out);
    rec->answered = true;
    c.hits++;
    return kSuccess;
  }
  lock.unlock();
  nvrtc_result e = timed_compile(prog, num_options, options);
  lock.lock();
  if (e == kSuccess) {
    if (Program* again = follow(prog)) again->compiled = true;
    c.compiles++;
  }
  return e;
}

nvrtc_result nvrtcGetLoweredName(nvrtc_program prog, const char* const expr, const char** lowered) {
  auto& r = real();
  if (!r.lowered) return kInternalError;
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  Program* rec = follow(prog);
  if (rec && rec->answered && expr) {
    auto it = rec->out.lowered.find(expr);
    if (it != rec->out.lowered.end()) {
      if (lowered) *lowered = it->second.c_str();  // lives until the program is destroyed
      return kSuccess;
    }
    if (nvrtc_result e = compile_now(prog, *rec); e != kSuccess) return e;
  }
  nvrtc_result e = r.lowered(prog, expr, lowered);
  if (e == kSuccess && rec && rec->compiled && rec->keyed && expr && lowered && *lowered) {
    rec->out.lowered[expr] = *lowered;
    rec->recorded = true;
  }
  return e;
}

nvrtc_result nvrtcGetPTXSize(nvrtc_program prog, size_t* size) {
  if (!size) return kInvalidInput;
  return get_code(prog, kPTX, size, nullptr);
}

nvrtc_result nvrtcGetPTX(nvrtc_program prog, char* ptx) {
  if (!ptx) return kInvalidInput;
  return get_code(prog, kPTX, nullptr, ptx);
}

nvrtc_result nvrtcGetCUBINSize(nvrtc_program prog, size_t* size) {
  if (!size) return kInvalidInput;
  return get_code(prog, kCUBIN, size, nullptr);
}

nvrtc_result nvrtcGetCUBIN(nvrtc_program prog, char* cubin) {
  if (!cubin) return kInvalidInput;
  return get_code(prog, kCUBIN, nullptr, cubin);
}

// An answered program has an empty log (a successful compile's log may hold warnings; the
// caller reads the log only on failure).
nvrtc_result nvrtcGetProgramLogSize(nvrtc_program prog, size_t* size) {
  if (!real().log_size) return kInternalError;
  {
    auto& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (Program* rec = follow(prog); rec && rec->answered && !rec->compiled && size) {
      *size = 1;
      return kSuccess;
    }
  }
  return real().log_size(prog, size);
}

nvrtc_result nvrtcGetProgramLog(nvrtc_program prog, char* log) {
  if (!real().log) return kInternalError;
  {
    auto& c = cache();
    std::lock_guard<std::mutex> lock(c.mu);
    if (Program* rec = follow(prog); rec && rec->answered && !rec->compiled && log) {
      log[0] = 0;
      return kSuccess;
    }
  }
  return real().log(prog, log);
}

// Destroying a compiled program writes what its caller took from it (outputs and lowered
// names, with what an answered entry held before) as one entry.
nvrtc_result nvrtcDestroyProgram(nvrtc_program* prog) {
  if (!real().destroy) return kInternalError;
  auto& c = cache();
  std::unique_ptr<Program> rec;
  std::string dir;
  if (prog) {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.programs.find(*prog);
    if (it != c.programs.end()) {
      rec = std::move(it->second);
      c.programs.erase(it);
    }
    dir = c.dir;
  }
  if (rec && rec->compiled && rec->recorded && !dir.empty()) {
    if (write_entry(entry_path(dir, rec->key), encode(rec->key, rec->out))) {
      c.writes++;
    } else {
      c.write_failures++;
    }
  }
  return real().destroy(prog);
}

}  // extern "C"

#else  // not Linux: no NVRTC to stand in front of

extern "C" {
void mlxc_nvrtc_cache_set_dir(const char*) {}
int mlxc_nvrtc_cache_active(void) { return 0; }
void mlxc_nvrtc_cache_stats(long long* hits, long long* compiles, long long* writes, long long* write_failures,
                            long long* compile_ns) {
  *hits = *compiles = *writes = *write_failures = *compile_ns = 0;
}
}

#endif
