// CPU stand-ins for the CUDA built-ins that the streamrt operator kernels use (a test aid; see
// emu.py for what is and is not modelled). Every CUDA thread of a block is one std::thread;
// blocks run one after another, so a __shared__ array can be a static variable.
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <memory>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

struct srt_dim3 { unsigned x, y, z; };
static thread_local srt_dim3 threadIdx;
static srt_dim3 blockIdx, blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static

static std::barrier<>* srt_emu_block;  // the running block's __syncthreads
struct srt_emu_warp {                    // one warp's shuffle exchange
  std::barrier<> bar{32};
  unsigned char lane[32][8];
};
static srt_emu_warp* srt_emu_warps;

inline void __syncthreads() { srt_emu_block->arrive_and_wait(); }

// Every lane publishes its value, then reads lane src's (full warps only: the mask is ignored).
template <typename T> inline T srt_emu_shfl(T v, int src) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  srt_emu_warp& w = srt_emu_warps[threadIdx.x >> 5];
  std::memcpy(w.lane[threadIdx.x & 31], &v, sizeof(T));
  w.bar.arrive_and_wait();
  T r;
  std::memcpy(&r, w.lane[src], sizeof(T));
  w.bar.arrive_and_wait();  // nobody overwrites a lane before everyone has read
  return r;
}
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int o) {
  return srt_emu_shfl(v, (int)(threadIdx.x & 31) ^ o);
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, int o) {
  const int l = threadIdx.x & 31;
  return srt_emu_shfl(v, l >= o ? l - o : l);
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

// Run kernel k over a (gx, gy, gz) grid of bx-thread blocks; params[i] points at argument i.
template <typename... P, std::size_t... I>
static void srt_emu_call(void (*k)(P...), void** params, std::index_sequence<I...>) {
  k(*static_cast<std::remove_cvref_t<P>*>(params[I])...);
}
template <typename... P>
static void srt_emu_run(void (*k)(P...), void** params, unsigned gx, unsigned gy, unsigned gz,
                        unsigned bx) {
  blockDim = {bx, 1, 1};
  gridDim = {gx, gy, gz};
  for (unsigned z = 0; z < gz; ++z)
    for (unsigned y = 0; y < gy; ++y)
      for (unsigned x = 0; x < gx; ++x) {
        blockIdx = {x, y, z};
        std::barrier<> block(bx);
        std::unique_ptr<srt_emu_warp[]> warps(new srt_emu_warp[bx / 32]);
        srt_emu_block = &block;
        srt_emu_warps = warps.get();
        std::vector<std::thread> threads;
        threads.reserve(bx);
        for (unsigned t = 0; t < bx; ++t)
          threads.emplace_back([=, &block, &warps] {
            threadIdx = {t, 0, 0};
            srt_emu_call(k, params, std::index_sequence_for<P...>{});
            // a thread that returned no longer holds up the others' barriers (as on a GPU)
            block.arrive_and_drop();
            warps[t >> 5].bar.arrive_and_drop();
          });
        for (auto& t : threads) t.join();
      }
}
