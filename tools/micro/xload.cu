// Micro-benchmark of the dp4a kernels' x staging (benches/results/2026-11-27-h100-int2-column-slices.md, section 4):
// 1 to 132 blocks of 512 threads each read Mixtral's 14336-value down x (57 KB) into shared memory, alone (no weight
// stream beside it). Built on the device machine, which has nvcc (from the repository root):
//   /usr/local/cuda/bin/nvcc -arch=sm_90 -O3 -std=c++17 -o /tmp/xload tools/micro/xload.cu && /tmp/xload
// A: every block the same x, in qdstage's pattern (a thread's 2 words of 16 values, 64 contiguous bytes each)
// B: a copy of x per block (same pattern): whether every block reading the same lines costs anything
// C: the same x, loads coalesced (lane-contiguous float4s)
// D: the same x, four cp.async.bulk (TMA) copies per block into shared memory (sm_90)
// E, F: kernels.cu's qdstage itself for int2 and int4 (loads and conversion to byte planes)
// Prints, per form and grid, the time per launch (back to back) and each block's time from entry to x staged.
#include <cstdio>
#include <cuda.h>
#include <cuda_runtime.h>
#include "../../cuda/kernels.cu"  // qdstage and its traits
#define N 14336
__device__ unsigned long long g_ns[4096];
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

template <int MODE>
__global__ void __launch_bounds__(512) k(const float* __restrict__ x, float* out, size_t stride) {
    extern __shared__ float4 sm[];
    unsigned long long t0 = gt();
    const float4* x4 = reinterpret_cast<const float4*>(x + (MODE == 1 ? blockIdx.x * stride : 0));
    float acc = 0.f;
    if (MODE == 3) {
        __shared__ alignas(8) unsigned long long bar;
        if (threadIdx.x == 0) {
            unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
            asm volatile("mbarrier.init.shared.b64 [%0], 1;" :: "r"(b));
            asm volatile("fence.mbarrier_init.release.cluster;");
        }
        __syncthreads();
        unsigned b = (unsigned)__cvta_generic_to_shared(&bar);
        if (threadIdx.x == 0) {
            asm volatile("mbarrier.arrive.expect_tx.shared.b64 _, [%0], %1;" :: "r"(b), "r"(N * 4));
            // 4 bulk copies of N/4 floats each
            for (int i = 0; i < 4; i++) {
                unsigned d = (unsigned)__cvta_generic_to_shared(sm + i * (N / 16));
                asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                             :: "r"(d), "l"(x4 + i * (N / 16)), "r"(N), "r"(b) : "memory");
            }
        }
        unsigned done = 0;
        while (!done) {
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }" : "=r"(done) : "r"(b));
        }
        float4 v = sm[threadIdx.x];
        acc = v.x + v.y + v.z + v.w;
    } else {
        float4 v[8];
        const int nw = N / 16;  // words of 16 floats
#pragma unroll
        for (int u = 0; u < 2; u++) {
            int m = u * 512 + threadIdx.x;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                int idx = MODE == 2 ? (u * 512 * 4 + q * 512 + threadIdx.x) : (m * 4 + q);
                v[u * 4 + q] = (MODE == 2 ? idx < N / 4 : m < nw) ? __ldg(x4 + idx) : make_float4(0, 0, 0, 0);
            }
        }
#pragma unroll
        for (int i = 0; i < 8; i++) { acc += v[i].x + v[i].y + v[i].z + v[i].w; }
        sm[threadIdx.x] = make_float4(acc, acc, acc, acc);
    }
    __syncthreads();
    if (threadIdx.x == 0) g_ns[blockIdx.x] = gt() - t0;
    if (acc == 12345.f) out[threadIdx.x] = acc;
}

template <int KIND>
__global__ void __launch_bounds__(512) kq(const float* __restrict__ x, float* out, size_t stride) {
    extern __shared__ float4 qsm[];
    unsigned long long t0 = gt();
    constexpr int CC = QTraits<KIND>::CC;
    const int tn = N / CC;
    u32* xq = reinterpret_cast<u32*>(qsm);
    float2* xsx = reinterpret_cast<float2*>(qsm + ((tn + 31) & ~31) * qd_parts<KIND>() * QDTraits<KIND>::S);
    qdstage<KIND, 2>(x, nullptr, tn, xq, xsx, [] {});
    if (threadIdx.x == 0) g_ns[blockIdx.x] = gt() - t0;
    if (xsx[threadIdx.x % tn].x == 12345.f) out[threadIdx.x] = 1.f;
}
// Time `kern` (kernel(x, out, stride)) on `blocks` blocks of 512 threads: launches back to back,
// and each block's own time to x staged (g_ns).
typedef void (*Kernel)(const float*, float*, size_t);
void run(const char* name, Kernel kern, const float* x, float* out, size_t stride, int blocks) {
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 100000);
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 10; i++) kern<<<blocks, 512, 60000>>>(x, out, stride);
    cudaEventRecord(a);
    const int R = 200;
    for (int i = 0; i < R; i++) kern<<<blocks, 512, 60000>>>(x, out, stride);
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    unsigned long long ns[4096]; cudaMemcpyFromSymbol(ns, g_ns, sizeof(ns));
    double s = 0, mx = 0; for (int i = 0; i < blocks; i++) { s += ns[i]; if (ns[i] > mx) mx = ns[i]; }
    printf("%-40s blocks %4d: %.2f us per launch, in-block mean %.0f ns max %.0f ns  err %s\n", name, blocks, ms * 1000 / R, s / blocks, mx,
           cudaGetErrorString(cudaGetLastError()));
}

int main() {
    float *x, *out; size_t stride = N + 64;
    cudaMalloc(&x, stride * 4 * 512); cudaMalloc(&out, 4096 * 4);
    cudaMemset(x, 0x3f, stride * 4 * 512);
    for (int blocks : {1, 8, 32, 128, 132}) {
        run("A same x, qdstage pattern", k<0>, x, out, stride, blocks);
        run("B distinct x per block", k<1>, x, out, stride, blocks);
        run("C same x, coalesced", k<2>, x, out, stride, blocks);
        run("D same x, TMA bulk", k<3>, x, out, stride, blocks);
        run("E qdstage int2 (loads + conversion)", kq<KIND_INT2>, x, out, stride, blocks);
        run("F qdstage int4", kq<KIND_INT4>, x, out, stride, blocks);
    }
    return 0;
}
