// cuda_fp16.h for the emulator (after shim.h): __half is the host's _Float16, so its arithmetic,
// comparisons and float conversions are the language's, each operation rounded to nearest even as
// the GPU's __hadd/__hmul... round; a kernel's `#include <cuda_fp16.h>` is dropped by build.py.
// Only what kernels commonly use; a missing name is a compile error naming it.
typedef _Float16 __half;
typedef __half half;
struct __half2 { __half x, y; };
typedef __half2 half2;
struct __half_raw { unsigned short x; };

inline __half __float2half(float f) { return (__half)f; }
inline __half __float2half_rn(float f) { return (__half)f; }
inline __half __double2half(double d) { return (__half)(float)d; }
inline float __half2float(__half h) { return (float)h; }
inline __half __int2half_rn(int i) { return (__half)(float)i; }
inline __half __uint2half_rn(unsigned i) { return (__half)(float)i; }
inline int __half2int_rz(__half h) { return (int)(float)h; }
inline int __half2int_rn(__half h) { return (int)std::nearbyint((float)h); }
inline unsigned short __half_as_ushort(__half h) { unsigned short u; std::memcpy(&u, &h, 2); return u; }
inline __half __ushort_as_half(unsigned short u) { __half h; std::memcpy(&h, &u, 2); return h; }
inline short __half_as_short(__half h) { short u; std::memcpy(&u, &h, 2); return u; }
inline __half __short_as_half(short u) { __half h; std::memcpy(&h, &u, 2); return h; }

inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hdiv(__half a, __half b) { return a / b; }
inline __half __hneg(__half a) { return -a; }
inline __half __habs(__half a) { return a < (__half)0 ? -a : a; }
inline __half __hfma(__half a, __half b, __half c) { return (__half)std::fmaf((float)a, (float)b, (float)c); }
inline __half __hmax(__half a, __half b) { return a != a ? b : (b != b ? a : (a > b ? a : b)); }
inline __half __hmin(__half a, __half b) { return a != a ? b : (b != b ? a : (a < b ? a : b)); }
inline bool __heq(__half a, __half b) { return a == b; }
inline bool __hne(__half a, __half b) { return a != b; }
inline bool __hlt(__half a, __half b) { return a < b; }
inline bool __hle(__half a, __half b) { return a <= b; }
inline bool __hgt(__half a, __half b) { return a > b; }
inline bool __hge(__half a, __half b) { return a >= b; }
inline bool __hisnan(__half a) { return a != a; }
inline int __hisinf(__half a) { float f = (float)a; return std::isinf(f) ? (f < 0 ? -1 : 1) : 0; }

#define SRT_EMU_HMATH(name, fn) inline __half name(__half a) { return (__half)fn((float)a); }
SRT_EMU_HMATH(hexp, std::exp)
SRT_EMU_HMATH(hexp2, std::exp2)
SRT_EMU_HMATH(hlog, std::log)
SRT_EMU_HMATH(hlog2, std::log2)
SRT_EMU_HMATH(hsqrt, std::sqrt)
SRT_EMU_HMATH(hsin, std::sin)
SRT_EMU_HMATH(hcos, std::cos)
SRT_EMU_HMATH(hfloor, std::floor)
SRT_EMU_HMATH(hceil, std::ceil)
SRT_EMU_HMATH(htrunc, std::trunc)
SRT_EMU_HMATH(hrint, std::nearbyint)
#undef SRT_EMU_HMATH
inline __half hrsqrt(__half a) { return (__half)(1.0f / std::sqrt((float)a)); }
inline __half hrcp(__half a) { return (__half)(1.0f / (float)a); }

inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __half2half2(__half a) { return {a, a}; }
inline __half2 __float2half2_rn(float f) { return {(__half)f, (__half)f}; }
inline __half2 __floats2half2_rn(float a, float b) { return {(__half)a, (__half)b}; }
inline float2 __half22float2(__half2 h) { return {(float)h.x, (float)h.y}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return (float)h.x; }
inline float __high2float(__half2 h) { return (float)h.y; }
inline __half2 __hadd2(__half2 a, __half2 b) { return {a.x + b.x, a.y + b.y}; }
inline __half2 __hsub2(__half2 a, __half2 b) { return {a.x - b.x, a.y - b.y}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {a.x * b.x, a.y * b.y}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)};
}

// atomicAdd on __half (sm_70+): a CAS loop on the 16 bits, as a GPU's is one atomic operation
inline __half atomicAdd(__half* p, __half v) {
  SRT_EMU_TOUCH(p, 2, 3);
  std::atomic_ref<unsigned short> bits(*reinterpret_cast<unsigned short*>(p));
  unsigned short old = bits.load(), want;
  do {
    want = __half_as_ushort(__ushort_as_half(old) + v);
  } while (!bits.compare_exchange_weak(old, want));
  return __ushort_as_half(old);
}
