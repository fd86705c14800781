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

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <thread>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mlxc.h"

extern char** environ;

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
  // What the program was created with (kept to learn MLX's custom-kernel recipe).
  std::string file_name;
  std::vector<std::string> headers, include_names;
  std::string key;        // source, headers and names so far; the options join at compile
  std::vector<std::string> names;
  bool keyed = false;     // the compile was asked for: key is whole
  bool answered = false;  // answered from an entry; NVRTC has not compiled it
  bool compiled = false;  // NVRTC compiled it (successfully)
  bool recorded = false;  // outputs gained something worth writing
  Outputs out;
  std::vector<std::string> compile_options;
};

// kFunc stands for a custom kernel's function name in a learned recipe.
constexpr const char* kFunc = "\x01func\x01";

// KernelRecipe is how MLX compiles a custom kernel (fast::cuda_kernel), learned from the
// first one this process sees compile: the program's file name, in-memory headers, options,
// name expressions and the outputs it takes, with the kernel's function name replaced by
// kFunc where it appears. Every custom kernel compiles with the same recipe (one MLX build,
// one device), so any other kernel's source can be compiled ahead the same way.
struct KernelRecipe {
  bool known = false;
  // hashed_file: the file name is the function's name, "_", the source's std::hash in
  // lower-case hex and ".cu" (MLX 0.32.4); otherwise file_name holds kFunc.
  bool hashed_file = false;
  std::string file_name;
  std::vector<std::string> headers, include_names, options, names;
  std::vector<uint8_t> kinds;
};

// An ahead compile: a custom kernel's source, queued before MLX asks for it; or a fused-kernel
// job (fused_job: its file, modules: the names of the fused kernels MLX will compile for it).
struct AheadJob {
  std::string func, source, key;
  std::string fused_job;
  std::vector<std::string> modules;
};

// Ahead holds compiles started before MLX asks for them (mlxc_nvrtc_ahead): MLX compiles
// one program at a time as it meets them, so a graph with ten new kernels waited for ten
// compiles in a row. Each of up to 8 threads runs one compile at a time, in a helper process
// when one is set (spawn_job), else itself.
struct Ahead {
  KernelRecipe recipe;
  std::deque<AheadJob> queue;                   // waiting for a thread
  std::vector<AheadJob> deferred;               // submitted before the recipe was known
  std::map<std::string, int> inflight;          // keys being compiled
  std::map<std::string, std::string> submitted;  // function name → the key compiled ahead
  std::condition_variable work, done;
  int threads = 0;
  // off: MLX built the first programs otherwise than submitted (another MLX's generator),
  // so every compile ahead would be wasted work beside MLX's own: none is started.
  bool off = false;
  // helper: the command a compile ahead runs as (mlxc_nvrtc_ahead_helper; its last
  // argument is the job's file); empty: compiles run on the threads themselves.
  std::vector<std::string> helper;
  // Fused-kernel jobs (mlxc_nvrtc_fused_ahead): MLX names the program of one of its fused
  // kernels after the kernel (<name>.cu), so a compile of a module a job is compiling waits
  // for that job. fused_helper is the command a job runs as, its file appended.
  std::vector<std::string> fused_helper;
  std::map<std::string, int> fused_pending;  // module → jobs in flight that compile it
  // fused_running counts fused-kernel helpers running: each holds a GPU context of its own
  // (hundreds of MB), so at most fused_max run at once beside a model loading
  // (mlxc_nvrtc_fused_helper sets it from the device's memory).
  int fused_running = 0, fused_max = 2;
  std::atomic<long long> fused_submitted{0}, fused_compiled{0}, fused_failed{0}, fused_answered{0}, fused_wait_ns{0};
  std::atomic<long long> submitted_n{0}, compiled{0}, present{0}, failed{0}, answered{0}, mismatched{0}, wait_ns{0};
};

struct Cache {
  std::mutex mu;
  std::string dir;  // "" = off
  std::map<nvrtc_program, std::unique_ptr<Program>> programs;
  std::atomic<long long> hits{0}, compiles{0}, writes{0}, write_failures{0};
  // compile_ns is the wall time spent in NVRTC's own compile, every program's.
  std::atomic<long long> compile_ns{0};
  Ahead ahead;
};

// The cache is never destroyed: ahead-compile threads may still run while the process
// exits, and must not meet a destroyed mutex.
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}

void put_u64(std::string& s, uint64_t v) {
  for (int i = 0; i < 8; i++) s.push_back(char((v >> (8 * i)) & 0xff));
}

void put_bytes(std::string& s, const std::string& b) {
  put_u64(s, b.size());
  s += b;
}

// create_key is the part of a program's key known at its creation: source, file name and
// in-memory headers with their include names.
std::string create_key(const std::string& src, const std::string& name, const std::vector<std::string>& headers,
                       const std::vector<std::string>& include_names) {
  std::string k;
  put_bytes(k, src);
  put_bytes(k, name);
  put_u64(k, uint64_t(headers.size()));
  for (size_t i = 0; i < headers.size(); i++) {
    put_bytes(k, headers[i]);
    put_bytes(k, i < include_names.size() ? include_names[i] : "");
  }
  return k;
}

// full_key is a program's whole key at its compile: NVRTC's version, the options, the
// name expressions, the creation's part and the absolutely included files' text.
std::string full_key(int major, int minor, const std::vector<std::string>& options,
                     const std::vector<std::string>& names, const std::string& created, const std::string& included) {
  std::string key = "nvrtc " + std::to_string(major) + "." + std::to_string(minor) + "\n";
  put_u64(key, uint64_t(options.size()));
  for (auto& o : options) put_bytes(key, o);
  put_u64(key, names.size());
  for (auto& n : names) put_bytes(key, n);
  return key + created + included;
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

// kernel_function is the name of the custom kernel a source defines (MLX names them
// custom_kernel_…), "" for any other program.
std::string kernel_function(const std::string& src) {
  const std::string mark = "__global__ void custom_kernel_";
  size_t at = src.find(mark);
  if (at == std::string::npos) return "";
  size_t start = at + std::strlen("__global__ void "), end = start;
  while (end < src.size() && (std::isalnum(static_cast<unsigned char>(src[end])) || src[end] == '_')) end++;
  return src.substr(start, end - start);
}

// hashed_file_name is func_<hex of std::hash(source)>.cu, the file name MLX 0.32.4 gives a
// custom kernel's program (std::hash<std::string> is libstdc++'s, as libmlx's is).
std::string hashed_file_name(const std::string& func, const std::string& source) {
  char hex[32];
  std::snprintf(hex, sizeof hex, "%zx", std::hash<std::string>{}(source));
  return func + "_" + hex + ".cu";
}

// recipe_file_name is the file name the recipe gives a program of func with source.
std::string recipe_file_name(const KernelRecipe& k, const std::string& func, const std::string& source);

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  for (size_t at = 0; (at = s.find(from, at)) != std::string::npos; at += to.size()) s.replace(at, from.size(), to);
  return s;
}

// learn_recipe takes MLX's custom-kernel recipe from a program it compiled (c.mu held),
// once, and queues what was submitted before it was known.
void enqueue_locked(AheadJob job);
void start_thread_locked();

void learn_recipe(const Program& rec) {
  auto& a = cache().ahead;
  std::string func = kernel_function(rec.source);
  if (a.recipe.known || func.empty() || rec.out.code.empty()) return;
  KernelRecipe k;
  k.hashed_file = rec.file_name == hashed_file_name(func, rec.source);
  k.file_name = replace_all(rec.file_name, func, kFunc);
  k.headers = rec.headers;
  k.include_names = rec.include_names;
  k.options = rec.compile_options;
  for (auto& n : rec.names) k.names.push_back(replace_all(n, func, kFunc));
  for (auto& [kind, code] : rec.out.code) k.kinds.push_back(kind);
  k.known = true;
  a.recipe = std::move(k);
  std::vector<AheadJob> deferred;
  deferred.swap(a.deferred);
  for (auto& j : deferred) enqueue_locked(std::move(j));
}

std::string recipe_file_name(const KernelRecipe& k, const std::string& func, const std::string& source) {
  return k.hashed_file ? hashed_file_name(func, source) : replace_all(k.file_name, kFunc, func);
}

// CompileJob is everything one compile ahead needs, so that another process can run it.
struct CompileJob {
  std::string source, file;
  std::vector<std::string> headers, include_names, options, names;
  std::vector<uint8_t> kinds;
  std::string key, dir;
};

CompileJob make_job(const AheadJob& job, const KernelRecipe& k, const std::string& dir) {
  CompileJob j{job.source, recipe_file_name(k, job.func, job.source), k.headers, k.include_names, k.options, {}, k.kinds,
               job.key, dir};
  for (auto& n : k.names) j.names.push_back(replace_all(n, kFunc, job.func));
  return j;
}

constexpr const char* kJobMagic = "dflash-mlx nvrtc job 1\n";

void put_list(std::string& s, const std::vector<std::string>& v) {
  put_u64(s, v.size());
  for (auto& x : v) put_bytes(s, x);
}

std::string encode_job(const CompileJob& j) {
  std::string s = kJobMagic;
  put_bytes(s, j.source);
  put_bytes(s, j.file);
  put_list(s, j.headers);
  put_list(s, j.include_names);
  put_list(s, j.options);
  put_list(s, j.names);
  put_bytes(s, std::string(j.kinds.begin(), j.kinds.end()));
  put_bytes(s, j.key);
  put_bytes(s, j.dir);
  return s;
}

bool decode_job(const std::string& s, CompileJob& j) {
  size_t magic = std::strlen(kJobMagic);
  if (s.size() < magic || s.compare(0, magic, kJobMagic) != 0) return false;
  Reader r{s, magic};
  auto list = [&r](std::vector<std::string>& v) {
    uint64_t n = r.u64();
    for (uint64_t i = 0; r.ok && i < n; i++) v.push_back(r.bytes());
  };
  j.source = r.bytes();
  j.file = r.bytes();
  list(j.headers);
  list(j.include_names);
  list(j.options);
  list(j.names);
  std::string kinds = r.bytes();
  j.kinds.assign(kinds.begin(), kinds.end());
  j.key = r.bytes();
  j.dir = r.bytes();
  return r.ok && r.at == s.size() && !j.dir.empty();
}

// run_job compiles a job on the real NVRTC and writes its entry.
bool run_job(const CompileJob& j) {
  auto& r = real();
  if (!r.create || !r.add_name || !r.compile || !r.lowered || !r.destroy) return false;
  std::vector<const char*> hs, ins, opts;
  for (auto& h : j.headers) hs.push_back(h.c_str());
  for (auto& n : j.include_names) ins.push_back(n.c_str());
  for (auto& o : j.options) opts.push_back(o.c_str());
  nvrtc_program p = nullptr;
  if (r.create(&p, j.source.c_str(), j.file.c_str(), int(hs.size()), hs.empty() ? nullptr : hs.data(),
               ins.empty() ? nullptr : ins.data()) != kSuccess) {
    return false;
  }
  bool ok = true;
  for (auto& n : j.names) ok = ok && r.add_name(p, n.c_str()) == kSuccess;
  ok = ok && timed_compile(p, int(opts.size()), opts.empty() ? nullptr : opts.data()) == kSuccess;
  Outputs out;
  for (auto& n : j.names) {
    const char* low = nullptr;
    ok = ok && r.lowered(p, n.c_str(), &low) == kSuccess && low;
    if (ok) out.lowered[n] = low;
  }
  for (uint8_t kind : j.kinds) {
    auto size_fn = kind == kPTX ? r.ptx_size : r.cubin_size;
    auto get_fn = kind == kPTX ? r.ptx : r.cubin;
    size_t n = 0;
    ok = ok && size_fn && get_fn && size_fn(p, &n) == kSuccess;
    if (!ok) break;
    std::string code(n, '\0');
    ok = get_fn(p, code.data()) == kSuccess;
    out.code[kind] = std::move(code);
  }
  r.destroy(&p);
  return ok && write_entry(entry_path(j.dir, j.key), encode(j.key, out));
}

// remove_stale_jobs deletes job files (compiles ahead's and fused-kernel jobs') a day old or
// more: a process that ended while its job ran leaves the file behind (a live one is
// seconds old).
void remove_stale_jobs(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  time_t now = time(nullptr);
  while (dirent* e = readdir(d)) {
    if (std::strncmp(e->d_name, ".job-", 5) != 0 && std::strncmp(e->d_name, ".fused-", 7) != 0) continue;
    std::string path = dir + "/" + e->d_name;
    struct stat st;
    if (stat(path.c_str(), &st) == 0 && now - st.st_mtime >= 24 * 3600) unlink(path.c_str());
  }
  closedir(d);
}

// spawn_job runs a job in a process of its own: helper's arguments, then a file holding the
// job. NVRTC compiles one program at a time in a process (its compiles on threads of one
// process took as long as one after another on an H200), so compiles ahead that are to
// run at the same time need processes.
bool run_helper(const std::vector<std::string>& helper, const std::string& path);

bool spawn_job(const CompileJob& j, const std::vector<std::string>& helper) {
  static std::atomic<long long> seq{0};
  std::string path = j.dir + "/.job-" + std::to_string(getpid()) + "-" + std::to_string(seq++);
  if (!write_entry(path, encode_job(j))) return false;
  bool ok = run_helper(helper, path);
  unlink(path.c_str());
  return ok;
}

// run_helper runs helper's arguments and then path as a process and reports whether it
// exited with 0.
bool run_helper(const std::vector<std::string>& helper, const std::string& path) {
  if (helper.empty()) return false;
  std::vector<char*> argv;
  for (auto& a : helper) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(const_cast<char*>(path.c_str()));
  argv.push_back(nullptr);
  // The helper says nothing on the caller's terminal (a setting's warning would repeat
  // once per compile): its exit status is its answer.
  posix_spawn_file_actions_t quiet;
  posix_spawn_file_actions_init(&quiet);
  posix_spawn_file_actions_addopen(&quiet, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&quiet, 2, "/dev/null", O_WRONLY, 0);
  pid_t pid = 0;
  int status = 0;
  bool ok = posix_spawn(&pid, argv[0], &quiet, nullptr, argv.data(), environ) == 0 && waitpid(pid, &status, 0) == pid &&
            WIFEXITED(status) && WEXITSTATUS(status) == 0;
  posix_spawn_file_actions_destroy(&quiet);
  return ok;
}

// ahead_thread runs queued jobs until the process ends: the first one that can start (a
// fused-kernel job waits for a free helper slot, while compiles behind it go ahead).
void ahead_thread() {
  auto& c = cache();
  auto& a = c.ahead;
  std::unique_lock<std::mutex> lock(c.mu);
  for (;;) {
    std::deque<AheadJob>::iterator next;
    a.work.wait(lock, [&] {
      next = std::find_if(a.queue.begin(), a.queue.end(),
                          [&](const AheadJob& j) { return j.fused_job.empty() || a.fused_running < a.fused_max; });
      return next != a.queue.end();
    });
    AheadJob job = std::move(*next);
    a.queue.erase(next);
    if (!job.fused_job.empty()) {
      a.fused_running++;
      std::vector<std::string> helper = a.fused_helper;
      lock.unlock();
      bool ok = run_helper(helper, job.fused_job);
      unlink(job.fused_job.c_str());
      lock.lock();
      a.fused_running--;
      (ok ? a.fused_compiled : a.fused_failed)++;
      for (auto& m : job.modules)
        if (--a.fused_pending[m] <= 0) a.fused_pending.erase(m);
      a.done.notify_all();
      a.work.notify_all();  // a helper slot is free
      continue;
    }
    CompileJob j = make_job(job, a.recipe, c.dir);
    std::vector<std::string> helper = a.helper;
    lock.unlock();
    bool ok = !j.dir.empty() && (helper.empty() ? run_job(j) : spawn_job(j, helper));
    lock.lock();
    (ok ? a.compiled : a.failed)++;
    a.inflight.erase(job.key);
    a.done.notify_all();
  }
}

// enqueue_locked keys a job with the recipe and queues it unless its entry is on disk or
// it is queued already (c.mu held, recipe known).
void enqueue_locked(AheadJob job) {
  auto& c = cache();
  auto& a = c.ahead;
  if (c.dir.empty() || a.off || a.submitted.count(job.func)) return;
  std::string included;
  if (!included_files(job.source, included)) return;
  auto& r = real();
  int major = 0, minor = 0;
  if (r.version) r.version(&major, &minor);
  std::vector<std::string> names;
  for (auto& n : a.recipe.names) names.push_back(replace_all(n, kFunc, job.func));
  std::string created = create_key(job.source, recipe_file_name(a.recipe, job.func, job.source), a.recipe.headers,
                                   a.recipe.include_names);
  job.key = full_key(major, minor, a.recipe.options, names, created, included);
  a.submitted[job.func] = job.key;
  if (a.inflight.count(job.key)) return;
  if (access(entry_path(c.dir, job.key).c_str(), R_OK) == 0) {
    a.present++;
    return;
  }
  a.inflight[job.key] = 1;
  a.queue.push_back(std::move(job));
  start_thread_locked();
}

// start_thread_locked starts one more thread for the queue, up to 8 and one fewer than the
// machine's cores (c.mu held).
void start_thread_locked() {
  auto& a = cache().ahead;
  int want = int(std::min(8u, std::max(1u, std::thread::hardware_concurrency() - 1)));
  if (a.threads < want) {
    a.threads++;
    std::thread(ahead_thread).detach();
  }
  a.work.notify_one();
}

// fused_module is the module of a fused-kernel job in flight that the program MLX now
// compiles belongs to, "" if none: MLX gives a fused kernel's program the file name
// <module>.cu and name expressions that hold the module's name.
std::string fused_module(const Ahead& a, const Program& rec) {
  for (const auto& [m, n] : a.fused_pending) {
    if (rec.file_name == m + ".cu") return m;
    for (const auto& name : rec.names)
      if (name.find(m) != std::string::npos) return m;
  }
  return "";
}

// await_fused waits (c.mu held through lock) while a fused-kernel job compiles the program
// MLX now compiles, and reports whether one did. The wait is bounded (kFusedWait): a helper
// that hangs (a GPU that will not start a context, say) costs that much, and MLX then
// compiles the program here.
constexpr auto kFusedWait = std::chrono::seconds(120);

bool await_fused(std::unique_lock<std::mutex>& lock, const Program& rec) {
  auto& a = cache().ahead;
  std::string m = fused_module(a, rec);
  if (m.empty()) return false;
  auto start = std::chrono::steady_clock::now();
  a.done.wait_for(lock, kFusedWait, [&] { return a.fused_pending.count(m) == 0; });
  a.fused_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  return true;
}

// await_ahead waits (c.mu held through lock) while the program MLX now compiles is being
// compiled ahead, and reports whether it was submitted ahead with this very key; a kernel
// submitted under another key counts as a mismatch (the recipe or the source's form
// differs from MLX's: the ahead compile is then wasted, never used).
bool await_ahead(std::unique_lock<std::mutex>& lock, const Program& rec) {
  auto& a = cache().ahead;
  std::string func = kernel_function(rec.source);
  if (func.empty()) return false;
  auto it = a.submitted.find(func);
  if (it == a.submitted.end()) return false;
  if (it->second != rec.key) {
    a.mismatched++;
    if (a.mismatched >= 2 && a.answered == 0) {
      a.off = true;
      for (auto& j : a.queue) a.inflight.erase(j.key);
      a.queue.clear();
      a.deferred.clear();
      a.done.notify_all();
    }
    return false;
  }
  if (a.inflight.count(rec.key)) {
    auto start = std::chrono::steady_clock::now();
    a.done.wait(lock, [&] { return a.inflight.count(rec.key) == 0; });
    a.wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }
  return true;
}

}  // namespace

extern "C" {

nvrtc_result nvrtcCompileProgram(nvrtc_program prog, int num_options, const char* const* options);

void mlxc_nvrtc_cache_set_dir(const char* dir) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.dir = dir ? dir : "";
  while (c.dir.size() > 1 && c.dir.back() == '/') c.dir.pop_back();
  if (!c.dir.empty()) {
    mkdir(c.dir.c_str(), 0755);
    remove_stale_jobs(c.dir);
  }
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

// mlxc_nvrtc_ahead starts compiling a custom kernel's program (the source MLX will build
// for it, function name func) on a thread of its own, so that MLX's compile of it is
// answered from the cache; before MLX's first custom-kernel compile it is kept until then.
void mlxc_nvrtc_ahead(const char* func, const char* source) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.dir.empty() || !func || !source) return;
  c.ahead.submitted_n++;
  AheadJob job{func, source, ""};
  if (!c.ahead.recipe.known) {
    c.ahead.deferred.push_back(std::move(job));
    return;
  }
  enqueue_locked(std::move(job));
}

// mlxc_nvrtc_ahead_helper sets the command compiles ahead run as (argc arguments, then the
// job's file; see mlxc_nvrtc_compile_job); argc 0: on the cache's threads.
void mlxc_nvrtc_ahead_helper(const char* const* argv, int argc) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.ahead.helper.clear();
  for (int i = 0; i < argc; i++) c.ahead.helper.push_back(argv[i] ? argv[i] : "");
}

// mlxc_nvrtc_fused_helper sets the command fused-kernel jobs run as (argc arguments, then the
// job's file; argc 0: none run) and how many run at once (at least 1).
void mlxc_nvrtc_fused_helper(const char* const* argv, int argc, int max_running) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.ahead.fused_max = std::max(1, max_running);
  c.ahead.fused_helper.clear();
  for (int i = 0; i < argc; i++) c.ahead.fused_helper.push_back(argv[i] ? argv[i] : "");
}

// mlxc_nvrtc_fused_ahead queues a fused-kernel job: the helper process runs the file at
// path, whose function's fused kernels are the modules (one name per line), so that their
// programs reach the cache before MLX compiles them here. 1: queued, and the file is the
// cache's to remove; 0: not (no cache folder or no helper), the caller's.
int mlxc_nvrtc_fused_ahead(const char* modules, const char* path) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto& a = c.ahead;
  if (c.dir.empty() || a.fused_helper.empty() || !modules || !path) return 0;
  AheadJob job;
  job.fused_job = path;
  std::string all = modules;
  for (size_t at = 0; at < all.size();) {
    size_t end = all.find('\n', at);
    if (end == std::string::npos) end = all.size();
    if (end > at) job.modules.push_back(all.substr(at, end - at));
    at = end + 1;
  }
  if (job.modules.empty()) return 0;
  for (auto& m : job.modules) a.fused_pending[m]++;
  a.fused_submitted++;
  a.queue.push_back(std::move(job));
  start_thread_locked();
  return 1;
}

void mlxc_nvrtc_fused_stats(long long* submitted, long long* compiled, long long* failed, long long* answered,
                            long long* wait_ns) {
  auto& a = cache().ahead;
  *submitted = a.fused_submitted;
  *compiled = a.fused_compiled;
  *failed = a.fused_failed;
  *answered = a.fused_answered;
  *wait_ns = a.fused_wait_ns;
}

// mlxc_nvrtc_compile_job runs the compile ahead a job file describes (in the helper
// process): 0 when its entry was written.
int mlxc_nvrtc_compile_job(const char* path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return 2;
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  CompileJob j;
  if (!decode_job(s, j)) return 2;
  return run_job(j) ? 0 : 1;
}

// mlxc_nvrtc_ahead_idle reports whether no ahead compile is queued or running.
int mlxc_nvrtc_ahead_idle(void) {
  auto& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.ahead.queue.empty() && c.ahead.inflight.empty() && c.ahead.fused_pending.empty() ? 1 : 0;
}

void mlxc_nvrtc_ahead_stats(long long* submitted, long long* compiled, long long* present, long long* failed,
                            long long* answered, long long* mismatched, long long* wait_ns) {
  auto& a = cache().ahead;
  *submitted = a.submitted_n;
  *compiled = a.compiled;
  *present = a.present;
  *failed = a.failed;
  *answered = a.answered;
  *mismatched = a.mismatched;
  *wait_ns = a.wait_ns;
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
  rec->file_name = name ? name : "";
  for (int i = 0; i < num_headers; i++) {
    rec->headers.push_back(headers && headers[i] ? headers[i] : "");
    rec->include_names.push_back(include_names && include_names[i] ? include_names[i] : "");
  }
  rec->key = create_key(rec->source, rec->file_name, rec->headers, rec->include_names);
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
  for (int i = 0; i < num_options; i++) rec->compile_options.push_back(options[i] ? options[i] : "");
  rec->key = full_key(major, minor, rec->compile_options, rec->names, rec->key, included);
  rec->keyed = true;
  bool ahead = await_ahead(lock, *rec);
  Outputs out;
  bool hit = read_entry(entry_path(c.dir, rec->key), rec->key, out);
  // A fused-kernel job is waited for only when the entry is not there yet (a job for a
  // module whose entry an earlier process wrote would only delay MLX).
  bool fused = !hit && !ahead && await_fused(lock, *rec);
  if (fused) hit = read_entry(entry_path(c.dir, rec->key), rec->key, out);
  if (hit) {
    rec->out = std::move(out);
    rec->answered = true;
    c.hits++;
    if (ahead) c.ahead.answered++;
    if (fused) c.ahead.fused_answered++;
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
    if (rec && rec->keyed && (rec->compiled || rec->answered)) learn_recipe(*rec);
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
void mlxc_nvrtc_ahead(const char*, const char*) {}
void mlxc_nvrtc_ahead_helper(const char* const*, int) {}
int mlxc_nvrtc_compile_job(const char*) { return 2; }
void mlxc_nvrtc_fused_helper(const char* const*, int, int) {}
int mlxc_nvrtc_fused_ahead(const char*, const char*) { return 0; }
void mlxc_nvrtc_fused_stats(long long* submitted, long long* compiled, long long* failed, long long* answered,
                            long long* wait_ns) {
  *submitted = *compiled = *failed = *answered = *wait_ns = 0;
}
int mlxc_nvrtc_ahead_idle(void) { return 1; }
void mlxc_nvrtc_ahead_stats(long long* submitted, long long* compiled, long long* present, long long* failed,
                            long long* answered, long long* mismatched, long long* wait_ns) {
  *submitted = *compiled = *present = *failed = *answered = *mismatched = *wait_ns = 0;
}
void mlxc_nvrtc_cache_stats(long long* hits, long long* compiles, long long* writes, long long* write_failures,
                            long long* compile_ns) {
  *hits = *compiles = *writes = *write_failures = *compile_ns = 0;
}
}

#endif
