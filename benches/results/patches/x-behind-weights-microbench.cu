// Microbenchmark: how long 128 blocks of 512 threads take to load a 14336-float x from L2, alone and
// beside a flood of weight loads (cp.async, 143 KB a block), as matvec_qd's down shape does.
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#define NT 512
__device__ __forceinline__ unsigned long long gt() { unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }
__device__ __forceinline__ void cpa(void* s, const void* g) {
  unsigned a = (unsigned)__cvta_generic_to_shared(s);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void bar_wait(unsigned b) {
  asm volatile("{ .reg .pred p; W%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], 0; @!p bra W%=; }" ::"r"(b) : "memory");
}
__device__ __forceinline__ void bulk(unsigned dst, const void* src, unsigned bytes, unsigned b) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(b) : "memory");
}
__global__ void __launch_bounds__(NT, 1) stage(int mode, const float4* x, int nf4, int copies, const uint4* w,
                                               int wper, float* out, unsigned long long* acc) {
  extern __shared__ uint4 sm[];
  __shared__ unsigned long long bars[2];
  const unsigned long long t0 = gt();
  const int t = threadIdx.x;
  const uint4* wb = w + (size_t)blockIdx.x * wper * NT;
  uint4* xs = sm;          // 3584 x 16 B
  uint4* ws = sm + 3584;
  const unsigned bw = sa(&bars[0]), bx = sa(&bars[1]);
  if (t == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bw));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bx));
    asm volatile("fence.mbarrier_init.release.cluster;");
  }
  __syncthreads();
  const float4* xb = x + (size_t)(blockIdx.x % copies) * nf4;
  if (mode & 1) for (int i = 0; i < wper; i++) cpa(ws + i * NT + t, wb + i * NT + t);
  asm volatile("cp.async.commit_group;");
  if ((mode & 16) && t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bw), "r"(wper * NT * 16) : "memory");
    for (int i = 0; i < wper; i++) bulk(sa(ws + i * NT), wb + i * NT, NT * 16, bw);
  }
  if ((mode & 32) && t == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bx), "r"(nf4 * 16) : "memory");
    for (int i = 0; i < nf4; i += 1024) bulk(sa(xs + i), xb + i, min(1024, nf4 - i) * 16, bx);
  }
  float s = 0.f;
  if (mode & 2) {
    float4 v[8];
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const int m = (u * NT + t) * 4 + q;
        v[u * 4 + q] = m < nf4 ? ((mode & 8) ? __ldcg(xb + m) : __ldg(xb + m)) : make_float4(0, 0, 0, 0);
      }
    if (mode & 64) for (int i = 0; i < wper; i++) cpa(ws + i * NT + t, wb + i * NT + t);
#pragma unroll
    for (int i = 0; i < 8; i++) s += v[i].x + v[i].y + v[i].z + v[i].w;
  }
  if (mode & 32) {
    bar_wait(bx);
    const float4* xf = reinterpret_cast<const float4*>(xs);
#pragma unroll
    for (int u = 0; u < 2; u++)
#pragma unroll
      for (int q = 0; q < 4; q++) {
        const int m = (u * NT + t) * 4 + q;
        if (m < nf4) { const float4 v = xf[m]; s += v.x + v.y + v.z + v.w; }
      }
  }
  __syncthreads();
  reinterpret_cast<float*>(sm)[t] = s;
  const unsigned long long t1 = gt();
  if (mode & 4) for (int i = 0; i < wper; i++) cpa(ws + i * NT + t, wb + i * NT + t);
  asm volatile("cp.async.commit_group;");
  asm volatile("cp.async.wait_all;");
  if (mode & 16) bar_wait(bw);
  __syncthreads();
  const unsigned long long t2 = gt();
  if (t == 0) {
    out[blockIdx.x] = reinterpret_cast<float*>(sm)[5] + reinterpret_cast<float*>(ws)[blockIdx.x & 255];
    atomicAdd(acc, t1 - t0);
    atomicAdd(acc + 1, t2 - t0);
  }
}
int main() {
  const int nb = 128, nf4 = 3584, wper = 18;  // 18 x 16 B x 512 = 147 KB a block
  const size_t wblk = (size_t)nb * wper * NT, ncopy = 16;
  float4* x; uint4* w; float* out; unsigned long long* acc;
  cudaMalloc(&x, 128 * (size_t)nf4 * 16); cudaMemset(x, 0, 128 * (size_t)nf4 * 16);
  cudaMalloc(&w, wblk * ncopy * 16); cudaMemset(w, 1, wblk * ncopy * 16);
  cudaMalloc(&out, 4096); cudaMalloc(&acc, 16);
  const int smem = 3584 * 16 + wper * NT * 16;
  cudaFuncSetAttribute(stage, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  struct { const char* name; int mode, nf4, copies; } runs[] = {
      {"x 14336 only", 2, nf4, 1}, {"x 14336 only, bulk", 32, nf4, 1}, {"weights only", 1, nf4, 1},
      {"weights only, bulk", 16, nf4, 1}, {"weights, then x 14336", 3, nf4, 1},
      {"bulk weights, then x 14336", 18, nf4, 1}, {"weights, then bulk x", 33, nf4, 1},
      {"bulk weights, then bulk x", 48, nf4, 1}, {"bulk weights, then x 4096", 18, 1024, 1},
      {"x 14336, then weights", 6, nf4, 1}, {"x issued, weights issued, x used", 66, nf4, 1}, {"x 4096 issued, weights issued", 66, 1024, 1},
  };
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int rep = 0; rep < 2; rep++)
    for (auto& r : runs) {
      const int n = 200;
      for (int i = 0; i < 10; i++) stage<<<nb, NT, smem>>>(r.mode, x, r.nf4, r.copies, w + (i % ncopy) * wblk, wper, out, acc);
      cudaMemset(acc, 0, 16);
      cudaEventRecord(e0);
      for (int i = 0; i < n; i++) stage<<<nb, NT, smem>>>(r.mode, x, r.nf4, r.copies, w + (i % ncopy) * wblk, wper, out, acc);
      cudaEventRecord(e1); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1);
      unsigned long long h[2]; cudaMemcpy(h, acc, 16, cudaMemcpyDeviceToHost);
      printf("%-30s launch %7.2f us   x loaded %7.0f ns   all landed %7.0f ns   (%s)\n", r.name, ms * 1000 / n,
             (double)h[0] / n / nb, (double)h[1] / n / nb, cudaGetErrorString(cudaGetLastError()));
    }
  return 0;
}
