// CPU stand-ins for the CUDA built-ins that CUDA C kernels use (see streamrt/emu/__init__.py for
// what is and is not modelled). The CUDA threads of a block are fibers (ucontext) on the calling
// OS thread: one runs until it reaches a barrier (__syncthreads, or a warp shuffle) or returns,
// then the next, in an order chosen per launch (srt_emu_order); a barrier opens once every live
// thread of its block (warp) waits at it. Blocks run one after another. Launch coordinates and
// __shared__ arrays are thread-local to the OS thread, so launches on different OS threads
// (streams) never share them.
#undef _FORTIFY_SOURCE  // its longjmp check refuses a jump between a fiber's stack and another
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <math.h>
#include <memory>
#include <thread>
#include <type_traits>
#include <setjmp.h>
#include <ucontext.h>
#include <utility>
#include <vector>

// the sanitizer's build (-DSRT_EMU_SANITIZE, sanitize.h): accesses the compiler does not
// instrument (the atomics' read-modify-writes) are reported by hand
#ifdef SRT_EMU_SANITIZE
extern "C" void srt_emu_touch(const void* p, unsigned long long n, int how);
#define SRT_EMU_TOUCH(p, n, how) srt_emu_touch((p), (n), (how))
#else
#define SRT_EMU_TOUCH(p, n, how) ((void)0)
#endif

struct srt_dim3 { unsigned x, y, z; };
static thread_local srt_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __constant__ static
#define __shared__ static thread_local
constexpr int warpSize = 32;
// dynamic shared memory (extern __shared__ T name[]: build.py makes it a pointer to this), as
// large as the launch's shared_mem bytes; one per OS thread, so per block, as __shared__ arrays
static thread_local unsigned char* srt_emu_dyn_smem;

enum srt_emu_wait { SRT_RUN = 0, SRT_BLOCK = 1, SRT_WARP = 2, SRT_DONE = 3 };
struct srt_emu_fiber {
  ucontext_t ctx;  // the start of the thread (setcontext once)
  jmp_buf env;     // where it waits (_setjmp/_longjmp after that: no signal-mask system calls)
  unsigned t = 0;
  int state = SRT_RUN;
  bool started = false;
};
struct srt_emu_warp { unsigned char lane[32][8]; };
static thread_local jmp_buf srt_emu_sched;
static thread_local srt_emu_fiber* srt_emu_cur;
static thread_local srt_emu_warp* srt_emu_warps;

// Park the running CUDA thread at a barrier of the given kind; returns once the barrier opened.
inline void srt_emu_wait_at(int kind) {
  srt_emu_cur->state = kind;
  if (!_setjmp(srt_emu_cur->env)) _longjmp(srt_emu_sched, 1);
}

inline void __syncthreads() { srt_emu_wait_at(SRT_BLOCK); }

// Every lane publishes its value, then reads lane src's (the mask is ignored: every lane of the
// warp must take part; a lane past the end of a partial warp reads stale bytes, as undefined).
template <typename T> inline T srt_emu_shfl(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  srt_emu_warp& w = srt_emu_warps[srt_emu_cur->t >> 5];  // warps: 32 consecutive linear ids
  std::memcpy(w.lane[srt_emu_cur->t & 31], &v, sizeof(T));
  srt_emu_wait_at(SRT_WARP);
  T r;
  std::memcpy(&r, w.lane[src], sizeof(T));
  srt_emu_wait_at(SRT_WARP);  // nobody overwrites a lane before everyone has read
  return r;
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int o) {
  return srt_emu_shfl(v, (int)(srt_emu_cur->t & 31) ^ o);
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, int o) {
  const int l = srt_emu_cur->t & 31;
  return srt_emu_shfl(v, l >= o ? l - o : l);
}

template <typename T> inline T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int l = srt_emu_cur->t & 31;
  return srt_emu_shfl(v, (l & ~(width - 1)) + (src & (width - 1)));
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned o, int width = 32) {
  const int l = srt_emu_cur->t & 31;
  return srt_emu_shfl(v, (l & (width - 1)) + (int)o < width ? l + (int)o : l);
}
inline void __syncwarp(unsigned = 0xffffffffu) { srt_emu_wait_at(SRT_WARP); }
// Votes: every lane publishes its predicate, then each reads the lanes of its warp that exist
// (a partial last warp has fewer); the mask is ignored, as for shuffles.
inline unsigned __ballot_sync(unsigned, int pred) {
  const unsigned t = srt_emu_cur->t, w = t >> 5;
  const unsigned n = blockDim.x * blockDim.y * blockDim.z;
  const unsigned lanes = std::min(32u, n - w * 32);
  srt_emu_warp& wp = srt_emu_warps[w];
  wp.lane[t & 31][0] = pred != 0;
  srt_emu_wait_at(SRT_WARP);
  unsigned r = 0;
  for (unsigned i = 0; i < lanes; ++i) r |= (unsigned)wp.lane[i][0] << i;
  srt_emu_wait_at(SRT_WARP);
  return r;
}
inline int __all_sync(unsigned m, int pred) {
  const unsigned t = srt_emu_cur->t, n = blockDim.x * blockDim.y * blockDim.z;
  const unsigned lanes = std::min(32u, n - (t >> 5) * 32);
  return __ballot_sync(m, pred) == (lanes == 32 ? 0xffffffffu : (1u << lanes) - 1);
}
inline int __any_sync(unsigned m, int pred) { return __ballot_sync(m, pred) != 0; }
inline unsigned __activemask() { return 0xffffffffu; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __clz(int x) { return x ? __builtin_clz((unsigned)x) : 32; }

// Atomics: real read-modify-writes (std::atomic_ref), since launches on different streams run
// on different OS threads at once; each returns the old value, as CUDA's.
template <typename T, typename F> inline T srt_emu_rmw(T* p, F f) {
  SRT_EMU_TOUCH(p, sizeof(T), 3);
  std::atomic_ref<T> a(*p);
  T old = a.load();
  while (!a.compare_exchange_weak(old, f(old))) {}
  return old;
}
#define SRT_EMU_ATOMIC(NAME, T, EXPR) \
  inline T NAME(T* p, T v) { return srt_emu_rmw(p, [v](T o) -> T { return EXPR; }); }
#define SRT_EMU_ATOMICS_INT(T)                              \
  SRT_EMU_ATOMIC(atomicAdd, T, o + v)                       \
  SRT_EMU_ATOMIC(atomicSub, T, o - v)                       \
  SRT_EMU_ATOMIC(atomicMax, T, o < v ? v : o)               \
  SRT_EMU_ATOMIC(atomicMin, T, v < o ? v : o)               \
  SRT_EMU_ATOMIC(atomicExch, T, v)                          \
  SRT_EMU_ATOMIC(atomicAnd, T, o & v)                       \
  SRT_EMU_ATOMIC(atomicOr, T, o | v)                        \
  SRT_EMU_ATOMIC(atomicXor, T, o ^ v)                       \
  inline T atomicCAS(T* p, T cmp, T v) {                    \
    SRT_EMU_TOUCH(p, sizeof(T), 3);                         \
    std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v); \
    return cmp;                                             \
  }
SRT_EMU_ATOMICS_INT(int)
SRT_EMU_ATOMICS_INT(unsigned)
SRT_EMU_ATOMICS_INT(long long)
SRT_EMU_ATOMICS_INT(unsigned long long)
SRT_EMU_ATOMIC(atomicAdd, float, o + v)
SRT_EMU_ATOMIC(atomicAdd, double, o + v)
SRT_EMU_ATOMIC(atomicExch, float, v)
SRT_EMU_ATOMIC(atomicMax, float, o < v ? v : o)
SRT_EMU_ATOMIC(atomicMin, float, v < o ? v : o)
inline unsigned short atomicCAS(unsigned short* p, unsigned short cmp, unsigned short v) {
  SRT_EMU_TOUCH(p, 2, 3);
  std::atomic_ref<unsigned short>(*p).compare_exchange_strong(cmp, v);
  return cmp;
}
inline unsigned atomicInc(unsigned* p, unsigned v) {
  return srt_emu_rmw(p, [v](unsigned o) { return o >= v ? 0u : o + 1; });
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// CUDA's device math beyond <cmath>: min/max of every arithmetic type, the fast intrinsics
using std::max;
using std::min;
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : x > 1.f ? 1.f : x; }
inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
inline double __dadd_rn(double a, double b) { volatile double r = a + b; return r; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __float_as_float(float f) { return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, 4); return f; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }

// A nanosecond counter. Kernels call it in spin loops (a gate waiting for a host flag): each call
// sleeps a moment, so a spinning kernel does not starve the host of its few cores.
inline long long clock64() {
  std::this_thread::sleep_for(std::chrono::microseconds(20));
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
inline double __dmul_rn(double a, double b) { volatile double r = a * b; return r; }
// the PTX cvt.f32.f16 / cvt.rn.f16.f32 of srt_ld / srt_st (build.py swaps the asm for these)
inline float srt_emu_h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
inline unsigned short srt_emu_f2h(float f) {
  _Float16 x = (_Float16)f;  // round to nearest even, as cvt.rn
  unsigned short h;
  std::memcpy(&h, &x, 2);
  return h;
}

// The orders the scheduler can run a block's threads and a grid's blocks in (runner.py ORDERS).
// forward (the default) and reverse make passes over the runnable threads of a block in thread
// order (reverse order), a barrier opening after a pass: warps move in lockstep from shuffle to
// shuffle. ahead, behind and random run one warp at a time, opening its shuffles at once, so a
// warp runs to its next __syncthreads before the next warp starts, as warps may drift apart on a
// GPU: ahead takes warps in order (warp 0 first), behind in reverse (warp 0 last), random in a
// seeded random order drawn at each __syncthreads, its lanes in a random order too. Blocks run
// in grid order, reversed for reverse and behind, shuffled for random.
enum srt_emu_order {
  SRT_FORWARD = 0, SRT_REVERSE = 1, SRT_AHEAD = 2, SRT_BEHIND = 3, SRT_RANDOM = 4
};
struct srt_emu_rng {  // splitmix64: the same sequence for a seed on every host
  unsigned long long s;
  unsigned long long next() {
    unsigned long long z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  template <typename V> void shuffle(V& v) {  // Fisher-Yates (std::shuffle differs per library)
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }
};

// Resume fiber f until it parks at a barrier or returns.
static void srt_emu_resume(srt_emu_fiber& f) {
  srt_emu_cur = &f;
  threadIdx = {f.t % blockDim.x, f.t / blockDim.x % blockDim.y, f.t / (blockDim.x * blockDim.y)};
  if (!_setjmp(srt_emu_sched)) {
    if (f.started) _longjmp(f.env, 1);
    f.started = true;
    setcontext(&f.ctx);
  }
}

// Run the threads of the current block to their end in the given order; false when they
// deadlock (some wait at a barrier others never reach, e.g. __syncthreads in divergent code).
// Counts per warp (runnable, alive, waiting at a shuffle) keep each scheduling step O(warps).
static bool srt_emu_block(std::vector<srt_emu_fiber>& fs, int order, srt_emu_rng& rng) {
  const unsigned n = fs.size(), nw = (n + 31) / 32;
  std::vector<unsigned> wrun(nw), walive(nw), wwait(nw, 0), lanes, prio(nw);
  for (unsigned w = 0; w < nw; ++w) wrun[w] = walive[w] = std::min(n, w * 32 + 32) - w * 32;
  for (unsigned w = 0; w < nw; ++w) prio[w] = order == SRT_BEHIND ? nw - 1 - w : w;  // warp order
  if (order == SRT_RANDOM) rng.shuffle(prio);
  unsigned live = n, at_block = 0;
  auto run = [&](unsigned t) {
    srt_emu_resume(fs[t]);
    const unsigned w = t >> 5;
    --wrun[w];
    if (fs[t].state == SRT_DONE) --live, --walive[w];
    else if (fs[t].state == SRT_BLOCK) ++at_block;
    else ++wwait[w];
  };
  auto open_warp = [&](unsigned w) {  // once its live lanes all wait at the shuffle
    if (!wwait[w] || wwait[w] != walive[w]) return false;
    for (unsigned t = w * 32; t < std::min(n, w * 32 + 32); ++t)
      if (fs[t].state == SRT_WARP) fs[t].state = SRT_RUN;
    wrun[w] = wwait[w];
    wwait[w] = 0;
    return true;
  };
  auto open_block = [&] {  // once every live thread waits at __syncthreads
    if (!live || at_block != live) return false;
    for (auto& f : fs)
      if (f.state == SRT_BLOCK) f.state = SRT_RUN, ++wrun[f.t >> 5];
    at_block = 0;
    if (order == SRT_RANDOM) rng.shuffle(prio);  // a new warp order after each __syncthreads
    return true;
  };
  while (live) {
    if (order == SRT_FORWARD || order == SRT_REVERSE) {
      bool ran = false, opened = false;
      for (unsigned i = 0; i < n; ++i) {
        const unsigned t = order == SRT_FORWARD ? i : n - 1 - i;
        if (fs[t].state == SRT_RUN) run(t), ran = true;
      }
      for (unsigned w = 0; w < nw; ++w) opened |= open_warp(w);
      opened |= open_block();
      if (!ran && !opened) return false;
      continue;
    }
    unsigned w = nw;  // the first warp in prio order that can run
    for (unsigned p : prio)
      if (wrun[p]) {
        w = p;
        break;
      }
    if (w == nw) {
      if (!open_block()) return false;
      continue;
    }
    lanes.clear();
    for (unsigned t = w * 32; t < std::min(n, w * 32 + 32); ++t)
      if (fs[t].state == SRT_RUN) lanes.push_back(t);
    if (order == SRT_BEHIND) std::reverse(lanes.begin(), lanes.end());
    if (order == SRT_RANDOM) rng.shuffle(lanes);
    for (unsigned t : lanes) run(t);
    open_warp(w);
    open_block();
  }
  return true;
}

// Bounds checks of fixed-size arrays (__shared__ and local ones): build.py compiles with
// -fsanitize=bounds,object-size, whose checks call these handlers (defined here and hidden, so no
// libubsan is linked). It abandons the launch before the stray access happens (on a GPU it would read or
// corrupt a neighbouring array silently, or fault), and srt_emu_run returns 2.
#define SRT_EMU_HANDLER extern "C" __attribute__((visibility("hidden"))) void
struct srt_emu_src_loc { const char* file; unsigned line, column; };  // ubsan's SourceLocation
static thread_local jmp_buf srt_emu_abort;
static thread_local unsigned srt_emu_oob_line;  // of the out-of-bounds index, in the .cpp
SRT_EMU_HANDLER __ubsan_handle_out_of_bounds(void* data, void*) {
  srt_emu_oob_line = static_cast<srt_emu_src_loc*>(data)->line;  // data starts with the location
  _longjmp(srt_emu_abort, 1);
}
SRT_EMU_HANDLER __ubsan_handle_out_of_bounds_abort(void* d, void* i) {
  __ubsan_handle_out_of_bounds(d, i);
}
// -fsanitize=object-size: an access past the end of an object whose size the compiler sees, as
// a __shared__ array passed by pointer into an inlined helper (srt_block_sum's sh)
SRT_EMU_HANDLER __ubsan_handle_type_mismatch_v1(void* d, void* p) {
  __ubsan_handle_out_of_bounds(d, p);
}
SRT_EMU_HANDLER __ubsan_handle_type_mismatch_v1_abort(void* d, void* p) {
  __ubsan_handle_out_of_bounds(d, p);
}

// Run kernel k over a (gx, gy, gz) grid of (bx, by, bz) blocks in the given order (random: from
// seed), with smem bytes of dynamic shared memory; params[i] points at argument i. Returns 0,
// 1 when the threads of a block deadlocked, or
// 2 when one indexed a fixed-size array out of its bounds (srt_emu_oob_line says where).
template <typename... P, std::size_t... I>
static void srt_emu_call(void (*k)(P...), void** params, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cvref_t<P>*>(params[I])...);
}
static thread_local void (*srt_emu_body)();  // runs the kernel for srt_emu_cur
static void srt_emu_entry() {
  srt_emu_body();
  srt_emu_cur->state = SRT_DONE;
  _longjmp(srt_emu_sched, 1);  // never returns: back to the scheduler
}
template <typename... P>
static int srt_emu_run(void (*k)(P...), void** params, unsigned gx, unsigned gy, unsigned gz,
                       unsigned bx, unsigned by, unsigned bz, int order, unsigned long long seed,
                       unsigned long long smem) {
  static thread_local void (*kern)(P...);
  static thread_local void** args;
  kern = k;
  args = params;
  srt_emu_body = [] { srt_emu_call(kern, args, std::index_sequence_for<P...>{}); };
  constexpr std::size_t STACK = 128 << 10;  // per CUDA thread
  const unsigned n = bx * by * bz;  // threads of a block; t = x + bx * (y + by * z), as CUDA's
  std::vector<srt_emu_fiber> fibers(n);
  std::unique_ptr<char[]> stacks(new char[STACK * n]);
  std::vector<srt_emu_warp> warps((n + 31) / 32);
  std::vector<std::max_align_t> dyn((smem + sizeof(std::max_align_t) - 1) / sizeof(std::max_align_t));
  srt_emu_dyn_smem = reinterpret_cast<unsigned char*>(dyn.data());
  gridDim = {gx, gy, gz};
  blockDim = {bx, by, bz};
  srt_emu_warps = warps.data();
  srt_emu_rng rng{seed};
  if (_setjmp(srt_emu_abort)) return 2;  // from the bounds-check handler, on a fiber's stack
  const unsigned long long nblocks = (unsigned long long)gx * gy * gz;
  std::vector<unsigned long long> perm;  // random: the order of the blocks
  if (order == SRT_RANDOM) {
    perm.resize(nblocks);
    for (unsigned long long i = 0; i < nblocks; ++i) perm[i] = i;
    rng.shuffle(perm);
  }
  for (unsigned long long i = 0; i < nblocks; ++i) {  // x fastest, as CUDA's linear block id
    const unsigned long long b = order == SRT_RANDOM                          ? perm[i]
                                 : order == SRT_REVERSE || order == SRT_BEHIND ? nblocks - 1 - i
                                                                               : i;
    blockIdx = {unsigned(b % gx), unsigned(b / gx % gy), unsigned(b / gx / gy)};
    for (unsigned t = 0; t < n; ++t) {
      srt_emu_fiber& f = fibers[t];
      f.t = t;
      f.state = SRT_RUN;
      f.started = false;
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = stacks.get() + STACK * t;
      f.ctx.uc_stack.ss_size = STACK;
      f.ctx.uc_link = nullptr;
      makecontext(&f.ctx, srt_emu_entry, 0);
    }
    if (!srt_emu_block(fibers, order, rng)) return 1;
  }
  return 0;
}

// The size of each parameter of kernel k, into out (at most max); returns how many it has.
template <typename... P>
static unsigned srt_emu_sizes(void (*)(P...), unsigned long long* out, unsigned max) {
  const unsigned long long s[] = {sizeof(std::remove_cvref_t<P>)..., 0};
  for (unsigned i = 0; i < sizeof...(P) && i < max; ++i) out[i] = s[i];
  return sizeof...(P);
}
