// More of CUDA's device intrinsics for the emulator (after shim.h): read-only loads, bit and
// integer tricks, float <-> integer conversions with a rounding mode, and the block-wide votes
// __syncthreads_count/_and/_or (three block barriers each, so every thread's vote is in before
// any reads the tally, and every read is done before the next call resets it).
template <typename T> inline T __ldg(const T* p) { return *p; }
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T __ldca(const T* p) { return *p; }
template <typename T> inline T __ldcs(const T* p) { return *p; }
template <typename T> inline T __ldlu(const T* p) { return *p; }
template <typename T> inline void __stcg(T* p, T v) { *p = v; }
template <typename T> inline void __stcs(T* p, T v) { *p = v; }
template <typename T> inline void __stwt(T* p, T v) { *p = v; }

inline unsigned __brev(unsigned x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0f0f0f0fu) | ((x & 0x0f0f0f0fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return ((unsigned long long)__brev((unsigned)x) << 32) | __brev((unsigned)(x >> 32));
}
inline int __mulhi(int a, int b) { return (int)(((long long)a * b) >> 32); }
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a * b) >> 32); }
inline long long __mul64hi(long long a, long long b) { return (long long)(((__int128)a * b) >> 64); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
}
// 24-bit multiplies: the low 24 bits of each operand, sign-extended for __mul24
inline int __mul24(int a, int b) { return ((a << 8) >> 8) * ((b << 8) >> 8); }
inline unsigned __umul24(unsigned a, unsigned b) { return (a & 0xffffffu) * (b & 0xffffffu); }
inline unsigned __sad(int a, int b, unsigned c) { return (unsigned)(a > b ? a - b : b - a) + c; }
inline unsigned __usad(unsigned a, unsigned b, unsigned c) { return (a > b ? a - b : b - a) + c; }
inline int __hadd(int a, int b) { return (int)(((long long)a + b) >> 1); }
inline int __rhadd(int a, int b) { return (int)(((long long)a + b + 1) >> 1); }
inline unsigned __uhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b) >> 1); }
inline unsigned __urhadd(unsigned a, unsigned b) { return (unsigned)(((unsigned long long)a + b + 1) >> 1); }

// conversions with CUDA's rounding suffixes: rn nearest even, rz toward zero, rd down, ru up
#define SRT_EMU_CVT(from, F, to, T)                                                        \
  inline T __##from##2##to##_rn(F x) { return (T)std::nearbyint(x); }                     \
  inline T __##from##2##to##_rz(F x) { return (T)std::trunc(x); }                         \
  inline T __##from##2##to##_rd(F x) { return (T)std::floor(x); }                         \
  inline T __##from##2##to##_ru(F x) { return (T)std::ceil(x); }
SRT_EMU_CVT(float, float, int, int)
SRT_EMU_CVT(float, float, uint, unsigned)
SRT_EMU_CVT(float, float, ll, long long)
SRT_EMU_CVT(float, float, ull, unsigned long long)
SRT_EMU_CVT(double, double, int, int)
SRT_EMU_CVT(double, double, uint, unsigned)
SRT_EMU_CVT(double, double, ll, long long)
SRT_EMU_CVT(double, double, ull, unsigned long long)
#undef SRT_EMU_CVT
inline float __int2float_rn(int x) { return (float)x; }
inline float __uint2float_rn(unsigned x) { return (float)x; }
inline float __ll2float_rn(long long x) { return (float)x; }
inline double __int2double_rn(int x) { return (double)x; }
inline double __ll2double_rn(long long x) { return (double)x; }
inline float __double2float_rn(double x) { return (float)x; }


inline int srt_emu_block_vote(int pred, int kind) {  // kind: 0 count, 1 and, 2 or
  static thread_local int tally;  // one per OS thread: shared by the fibers of one block
  const bool first = threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0;
  __syncthreads();  // the previous call's readers are done
  if (first) tally = 0;
  __syncthreads();
  if (pred) __atomic_fetch_add(&tally, 1, __ATOMIC_RELAXED);
  __syncthreads();
  const int n = tally, threads = (int)(blockDim.x * blockDim.y * blockDim.z);
  return kind == 0 ? n : kind == 1 ? (n == threads) : (n != 0);
}
inline int __syncthreads_count(int pred) { return srt_emu_block_vote(pred, 0); }
inline int __syncthreads_and(int pred) { return srt_emu_block_vote(pred, 1); }
inline int __syncthreads_or(int pred) { return srt_emu_block_vote(pred, 2); }
