// hob's CUDA kernels: this file's device helpers, then one file per family, concatenated in the
// order of src/backend/cuda/kernels.rs (Kernels::SOURCE) into one source that NVRTC compiles at
// run time for the GPU at hand, cached on disk. Activations are f32; weights are read in their
// stored form (f32, f16, bf16, or the planar int8/int4/int2 variants of formats/hob.md) and
// dequantized in registers.
//
// Every kernel waits for the kernel before it (pdl_wait, below) before it touches memory an
// earlier kernel writes or reads: on sm_90 the compute stream launches with programmatic dependent
// launch (src/backend/cuda/kernels.rs tests this for every __global__ function).
//
// Conventions: every matrix is row-major [rows, cols]; a "row_bytes" is the stored bytes of one
// row of codes; scales and mins are f16 [rows, cols / group]. Kind codes match WeightKind in
// src/backend/cuda/mod.rs: 0 f32, 1 f16, 2 bf16, 3 int8, 4 int4, 5 int2, 6 mxfp4 (whose
// "scales" are E8M0 bytes, one per 32 values), 7 int3 (a row: int2's codes of the low two bits,
// cols / 4 bytes, then the high bits, cols / 8 bytes: formats/hob.md), 8 int4k (int4's codes;
// 8-bit sub-scales under a row's f16 pair: int4k_sm), 9 int2k (int2's codes; 4-bit sub-scales:
// int2k_sm), 10 ap8 (a view of an expert's bit planes at one width: ap8.cu).

// No headers: NVRTC needs no include path. f16 values travel as their 16-bit patterns.

#define KIND_F32 0
#define KIND_F16 1
#define KIND_BF16 2
#define KIND_INT8 3
#define KIND_INT4 4
#define KIND_INT2 5
#define KIND_MXFP4 6
#define KIND_INT3 7
#define KIND_INT4K 8
#define KIND_INT2K 9
#define KIND_AP8 10

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Programmatic dependent launch (sm_90 and later; src/backend/cuda/mod.rs Gpu::launch): a kernel
// launched with it may start while the kernel before it in the stream still runs. Every kernel
// calls pdl_wait() before it reads anything an earlier kernel wrote or writes anything an earlier
// kernel may read: that waits until the kernel before has finished and its writes are visible.
// Weights (written only by copies, never by kernels) may be read before it: a matrix product
// issues its first weight loads, then waits, so the loads overlap the previous kernel's tail.
// pdl_trigger() lets the next kernel's blocks be scheduled at once (into whatever an SM has free;
// they then sit in their own pdl_wait). Both are no-ops before sm_90 and in launches without the
// attribute.
__device__ __forceinline__ void pdl_wait() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_trigger() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

// The prologue of a kernel that reads no weights before it waits.
#define PDL_ENTRY() \
    do {            \
        pdl_trigger(); \
        pdl_wait();    \
    } while (0)

typedef unsigned short half_bits;

__device__ __forceinline__ float h2f(half_bits bits) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(bits));
    return f;
}

__device__ __forceinline__ half_bits f2h(float f) {
    half_bits b;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(b) : "f"(f));
    return b;
}

#define NEG_INF __int_as_float(0xff800000)

// MXFP4 (src/quant/mxfp4.rs): e2m1 code c doubled, an integer in [-12, 12] (bit 3 the sign),
// times the block's 2^(e - 128): exact products, as on the CPU. mx_bytes: the four codes in the
// low 16 bits of q as bytes 16 + value, from byte tables by prmt (the magnitude by a code's low 3
// bits; bit 3 picks the negative table's byte); mx_byte_value: byte j of those as
// the float value (its bits put under 2^23's exponent, less 2^23 + 16: exact).
__device__ __forceinline__ u32 mx_bytes(u32 q) {
    const u32 m = q & 0x7777u;  // (a selector's bit 3 would ask prmt for sign replication)
    const u32 pos = __byte_perm(0x13121110u, 0x1c181614u, m);
    const u32 neg = __byte_perm(0x0d0e0f10u, 0x04080a0cu, m);
    return __byte_perm(pos, neg, 0x3210u | ((q & 0x8888u) >> 1));
}
__device__ __forceinline__ float mx_byte_value(u32 b, int j) {
    return __uint_as_float(__byte_perm(b, 0x4b000000u, 0x7440u + j)) - 8388624.0f;
}
__device__ __forceinline__ float e2m1x2(u32 c) {
    return mx_byte_value(mx_bytes(c & 15u), 0);
}
__device__ __forceinline__ float mx_half_scale(u32 e) {
    return __uint_as_float(e >= 2u ? (e - 1u) << 23 : e == 1u ? 0x00400000u : 0x00200000u);
}

__device__ __forceinline__ float bf2f(unsigned short bits) {
    return __uint_as_float(((u32)bits) << 16);
}

// A matrix as the kernels read it: DevMat's layout in src/backend/cuda/mod.rs.
struct Mat {
    const u8* codes;
    const unsigned short* scales;  // f16 bits
    const unsigned short* mins;    // f16 bits
    int rows, cols, group, row_bytes;
};

// int4k (kind 8, formats/hob.md): group g's (scale, min) as int4's f16 bits, scale | min << 16:
// f16(d a) and f16(m b), a the u8 and b the i8 of the group's two bytes in `scales`, d and m the
// row's two f16 in `mins` (the products are exact in f32; one rounding, as the CPU's).
// int4k_ab: from a group's two bytes `ab` and its row's pair `dm` (d | dm << 16).
__device__ __forceinline__ u32 int4k_ab(u32 ab, u32 dm) {
    const float s = h2f((half_bits)(dm & 0xffffu)) * (float)(ab & 0xffu);
    const float mn = h2f((half_bits)(dm >> 16)) * (float)(signed char)(ab >> 8);
    return (u32)f2h(s) | ((u32)f2h(mn) << 16);
}
__device__ __forceinline__ u32 int4k_sm(const Mat& w, size_t g, int r) {
    return int4k_ab(__ldg(w.scales + g), __ldg(reinterpret_cast<const u32*>(w.mins) + r));
}

// int2k (kind 9): group g's (scale, min) bits as int4k_sm's, from the group's byte (a in the low
// nibble, b signed in the high one) and the row's pair.
__device__ __forceinline__ u32 int2k_sm(const Mat& w, size_t g, int r) {
    const u32 v = __ldg(reinterpret_cast<const u8*>(w.scales) + g);
    const u32 ab = (v & 15u) | ((u32)(u8)((signed char)v >> 4) << 8);
    return int4k_ab(ab, __ldg(reinterpret_cast<const u32*>(w.mins) + r));
}

// Asynchronous 16-byte copies into shared memory (cp.async, sm_80 on).
#if __CUDA_ARCH__ >= 800
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(sa), "l"(gmem));
}
#endif

// 16 bytes of shared memory from the first `bytes` (0..16, even) at gmem, the rest zero: an
// asynchronous copy (cp.async, committed and waited for by the caller) from sm_80 on, a plain
// one before (its cp_async_* calls are then no-ops). gmem is 16-byte aligned (read only where
// bytes > 0).
__device__ __forceinline__ void cp_async16z(void* smem, const void* gmem, int bytes) {
#if __CUDA_ARCH__ >= 800
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(sa), "l"(gmem), "r"(bytes));
#else
    union {
        uint4 v;
        unsigned short h[8];
    } u;
    u.v = make_uint4(0, 0, 0, 0);
    if (bytes == 16) {
        u.v = *reinterpret_cast<const uint4*>(gmem);
    } else {
        for (int i = 0; i < bytes / 2; i++) u.h[i] = reinterpret_cast<const unsigned short*>(gmem)[i];
    }
    *reinterpret_cast<uint4*>(smem) = u.v;
#endif
}
// The same for 8 bytes (`bytes` 0 or 8; gmem 8-byte aligned).
__device__ __forceinline__ void cp_async8z(void* smem, const void* gmem, int bytes) {
#if __CUDA_ARCH__ >= 800
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(sa), "l"(gmem), "r"(bytes));
#else
    *reinterpret_cast<uint2*>(smem) = bytes == 8 ? *reinterpret_cast<const uint2*>(gmem) : make_uint2(0, 0);
#endif
}
// 4 bytes (int4k's row pair of a ring step), 4-byte aligned.
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem) {
#if __CUDA_ARCH__ >= 800
    const unsigned sa = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(sa), "l"(gmem));
#else
    *reinterpret_cast<u32*>(smem) = *reinterpret_cast<const u32*>(gmem);
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most N of this thread's committed groups are pending.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}
