// CPU stand-ins for the CUDA built-ins that the streamrt kernels use (a test aid; see emu.py for
// what is and is not modelled). The CUDA threads of a block are fibers (ucontext) on the calling
// OS thread: one runs until it reaches a barrier (__syncthreads, or a warp shuffle) or returns,
// then the next; a barrier opens once every live thread of its block (warp) waits at it. Blocks
// run one after another. Launch coordinates and __shared__ arrays are thread-local to the OS
// thread, so launches on different OS threads (streams) never share them.
#undef _FORTIFY_SOURCE  // its longjmp check refuses a jump between a fiber's stack and another
#include <chrono>
#include <cmath>
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

struct srt_dim3 { unsigned x, y, z; };
static thread_local srt_dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static thread_local

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
// the PTX cvt.f32.f16 / cvt.rn.f16.f32 of srt_ld / srt_st (emu.py swaps the asm for these)
inline float srt_emu_h2f(unsigned short h) { _Float16 x; std::memcpy(&x, &h, 2); return (float)x; }
inline unsigned short srt_emu_f2h(float f) {
  _Float16 x = (_Float16)f;  // round to nearest even, as cvt.rn
  unsigned short h;
  std::memcpy(&h, &x, 2);
  return h;
}

// Run kernel k over a (gx, gy, gz) grid of (bx, by, bz) blocks; params[i] points at argument i.
// Returns 0, or 1 when the threads of a block deadlocked (some wait at a barrier others never
// reach, e.g. __syncthreads in divergent code).
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
                       unsigned bx, unsigned by, unsigned bz) {
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
  gridDim = {gx, gy, gz};
  blockDim = {bx, by, bz};
  srt_emu_warps = warps.data();
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        blockIdx = {x, y, z};
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
        for (unsigned live = n; live;) {
          bool ran = false;
          for (auto& f : fibers)
            if (f.state == SRT_RUN) {
              srt_emu_cur = &f;
              threadIdx = {f.t % bx, f.t / bx % by, f.t / (bx * by)};
              if (!_setjmp(srt_emu_sched)) {
                if (f.started) _longjmp(f.env, 1);
                f.started = true;
                setcontext(&f.ctx);
              }
              ran = true;
            }
          live = 0;
          unsigned at_block = 0;
          for (auto& f : fibers) {
            live += f.state != SRT_DONE;
            at_block += f.state == SRT_BLOCK;
          }
          bool opened = false;
          for (unsigned w = 0; w * 32 < n; ++w) {  // a warp barrier opens when its live lanes wait
            unsigned end = std::min(n, w * 32 + 32), waiting = 0, alive = 0;
            for (unsigned t = w * 32; t < end; ++t) {
              alive += fibers[t].state != SRT_DONE;
              waiting += fibers[t].state == SRT_WARP;
            }
            if (waiting && waiting == alive) {
              for (unsigned t = w * 32; t < end; ++t) fibers[t].state = SRT_RUN;
              opened = true;
            }
          }
          if (!opened && live && at_block == live) {  // every live thread at __syncthreads
            for (auto& f : fibers)
              if (f.state == SRT_BLOCK) f.state = SRT_RUN;
            opened = true;
          }
          if (live && !ran && !opened) return 1;
        }
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
