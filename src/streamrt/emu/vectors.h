// CUDA's vector types (vector_types.h) and their make_* functions for the emulator (after shim.h),
// with CUDA's sizes and alignments: a float4 load through a reinterpret_cast pointer reads 16 bytes.
#define SRT_EMU_VEC(T, N, A)                                                              \
  struct alignas(A) N##1 { T x; };                                                       \
  struct alignas(2 * A) N##2 { T x, y; };                                                \
  struct N##3 { T x, y, z; };                                                            \
  struct alignas(4 * A < 16 ? 4 * A : 16) N##4 { T x, y, z, w; };                        \
  inline N##1 make_##N##1(T x) { return {x}; }                                           \
  inline N##2 make_##N##2(T x, T y) { return {x, y}; }                                   \
  inline N##3 make_##N##3(T x, T y, T z) { return {x, y, z}; }                           \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return {x, y, z, w}; }
SRT_EMU_VEC(float, float, 4)
SRT_EMU_VEC(int, int, 4)
SRT_EMU_VEC(unsigned int, uint, 4)
SRT_EMU_VEC(short, short, 2)
SRT_EMU_VEC(unsigned short, ushort, 2)
SRT_EMU_VEC(signed char, char, 1)
SRT_EMU_VEC(unsigned char, uchar, 1)
#undef SRT_EMU_VEC
// the 8-byte element types: CUDA aligns their 2-vectors to 16, their 4-vectors to 16 (the "_16a")
#define SRT_EMU_VEC8(T, N)                                                                \
  struct alignas(8) N##1 { T x; };                                                       \
  struct alignas(16) N##2 { T x, y; };                                                   \
  struct N##3 { T x, y, z; };                                                            \
  struct alignas(16) N##4 { T x, y, z, w; };                                             \
  inline N##1 make_##N##1(T x) { return {x}; }                                           \
  inline N##2 make_##N##2(T x, T y) { return {x, y}; }                                   \
  inline N##3 make_##N##3(T x, T y, T z) { return {x, y, z}; }                           \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return {x, y, z, w}; }
SRT_EMU_VEC8(double, double)
SRT_EMU_VEC8(long long, longlong)
SRT_EMU_VEC8(unsigned long long, ulonglong)
#undef SRT_EMU_VEC8
