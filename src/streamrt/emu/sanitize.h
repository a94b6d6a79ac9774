// The sanitizer's build of a kernel (-DSRT_EMU_SANITIZE, with g++'s -fsanitize=kernel-address
// calling back on every load and store: build.SANITIZE). The launcher gives this OS thread a
// table of ranges before a launch (srt_emu_san_set): each a copy of an allocation a pointer
// argument reaches, with a redzone either side, and a shadow byte per byte of the allocation.
// An access inside a range ORs its bytes' shadow (1 read, 2 write); one touching a redzone is
// out of bounds: the first is kept (srt_emu_san_get) and the access lands in the redzone, our
// memory, so nothing of the program's is corrupted. Other addresses (the kernel's stack, its
// __shared__ arrays, the shim's state) pass unrecorded. The handlers are not instrumented.
#ifdef SRT_EMU_SANITIZE
#define SRT_EMU_NOSAN extern "C" __attribute__((visibility("hidden"), no_sanitize_address))
struct srt_emu_san_range {
  unsigned long long lo, hi;  // the host addresses of the copy of the allocation's bytes
  unsigned char* shadow;      // hi - lo bytes
};
struct srt_emu_san_oob {  // the first out-of-bounds access of a launch
  long long range, offset;  // its range, its first byte from that range's lo
  unsigned long long size, count;
  int write;
};
static thread_local srt_emu_san_range* srt_emu_san_ranges;
static thread_local unsigned srt_emu_san_n;
static thread_local unsigned long long srt_emu_san_rz;
static thread_local srt_emu_san_oob srt_emu_san_first;

extern "C" __attribute__((no_sanitize_address)) void srt_emu_san_set(srt_emu_san_range* r, unsigned n, unsigned long long rz) {
  srt_emu_san_ranges = r;
  srt_emu_san_n = n;
  srt_emu_san_rz = rz;
  srt_emu_san_first = {-1, 0, 0, 0, 0};
}
extern "C" __attribute__((no_sanitize_address)) void srt_emu_san_get(srt_emu_san_oob* out) { *out = srt_emu_san_first; }
SRT_EMU_NOSAN void srt_emu_touch(const void* p, unsigned long long n, int how) {
  const unsigned long long a = reinterpret_cast<unsigned long long>(p), rz = srt_emu_san_rz;
  for (unsigned i = 0; i < srt_emu_san_n; ++i) {
    const srt_emu_san_range& r = srt_emu_san_ranges[i];
    if (a + n <= r.lo - rz || a >= r.hi + rz) continue;
    if (a >= r.lo && a + n <= r.hi) {
      unsigned char* s = r.shadow + (a - r.lo);
      for (unsigned long long k = 0; k < n; ++k) s[k] |= how;
    } else if (!srt_emu_san_first.count++) {
      srt_emu_san_first = {i, (long long)(a - r.lo), n, 1, (how & 2) ? 1 : 0};
    }
    return;
  }
}
#define SRT_EMU_SAN_SIZED(N)                                                             \
  SRT_EMU_NOSAN void __asan_load##N##_noabort(void* p) { srt_emu_touch(p, N, 1); }  \
  SRT_EMU_NOSAN void __asan_store##N##_noabort(void* p) { srt_emu_touch(p, N, 2); }
SRT_EMU_SAN_SIZED(1)
SRT_EMU_SAN_SIZED(2)
SRT_EMU_SAN_SIZED(4)
SRT_EMU_SAN_SIZED(8)
SRT_EMU_SAN_SIZED(16)
SRT_EMU_NOSAN void __asan_loadN_noabort(void* p, unsigned long n) { srt_emu_touch(p, n, 1); }
SRT_EMU_NOSAN void __asan_storeN_noabort(void* p, unsigned long n) { srt_emu_touch(p, n, 2); }
SRT_EMU_NOSAN void __asan_handle_no_return() {}
#endif
