// How long after the last block of a kernel ends does a dependent (PDL) one-block kernel's
// griddepcontrol.wait return, against the same block spinning on a counter the first kernel's
// blocks increment (fence + atomic)? Times from %globaltimer.
#include <cstdio>
#include <cuda_runtime.h>
typedef unsigned long long u64;
__device__ u64 t_end_max;      // latest end of a primary block (after its writes)
__device__ u64 t_wait;         // secondary: wait returned
__device__ unsigned counter;
__device__ __forceinline__ u64 now() { u64 t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); return t; }

__global__ void primary(float* buf, int n, int iters, int signal) {
    asm volatile("griddepcontrol.launch_dependents;");
    // some streaming work so blocks end at different times
    float acc = 0.f;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        acc += buf[i];
    for (int k = 0; k < iters; k++) acc = acc * 1.0001f + 0.5f;
    if (acc == 1234.5f) buf[0] = acc;
    buf[n + blockIdx.x * blockDim.x + threadIdx.x] = acc;  // a write the secondary may read
    __syncthreads();
    if (threadIdx.x == 0) {
        const u64 t = now();
        if (signal) {
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            atomicAdd(&counter, 1u);
        }
        atomicMax(&t_end_max, t);
    }
}
__global__ void secondary(int mode, unsigned target) {
    asm volatile("griddepcontrol.launch_dependents;");
    if (mode == 0) {
        asm volatile("griddepcontrol.wait;" ::: "memory");
    } else {
        if (threadIdx.x == 0) {
            while (*(volatile unsigned*)&counter < target) {}
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
            counter = 0;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) t_wait = now();
}
__global__ void reset() { t_end_max = 0; }

int main() {
    int n = 1 << 24;  // 64 MB
    float* buf; cudaMalloc(&buf, (n + 1 << 20) * sizeof(float) + 64 * 1024 * 1024);
    cudaMemset(buf, 0, n * sizeof(float));
    cudaStream_t s; cudaStreamCreate(&s);
    cudaLaunchAttribute attr; attr.id = cudaLaunchAttributeProgrammaticStreamSerialization; attr.val.programmaticStreamSerializationAllowed = 1;
    for (int blocks : {132, 512, 1024}) for (int mode = 0; mode < 2; mode++) {
        double sum = 0, mn = 1e18, mx = 0; int reps = 200;
        for (int r = 0; r < reps + 5; r++) {
            reset<<<1, 1, 0, s>>>();
            cudaLaunchConfig_t c1 = {}; c1.gridDim = blocks; c1.blockDim = 256; c1.stream = s; c1.attrs = &attr; c1.numAttrs = 1;
            cudaLaunchKernelEx(&c1, primary, buf, n, 200, mode);
            cudaLaunchConfig_t c2 = {}; c2.gridDim = 1; c2.blockDim = 1024; c2.stream = s; c2.attrs = &attr; c2.numAttrs = 1;
            cudaLaunchKernelEx(&c2, secondary, mode, (unsigned)blocks);
            cudaStreamSynchronize(s);
            u64 a, b; cudaMemcpyFromSymbol(&a, t_end_max, 8); cudaMemcpyFromSymbol(&b, t_wait, 8);
            if (r >= 5) { double d = (double)(long long)(b - a); sum += d; mn = d < mn ? d : mn; mx = d > mx ? d : mx; }
        }
        printf("blocks %d %s: after the last primary block %.0f ns mean (min %.0f, max %.0f)\n", blocks,
               mode ? "spin on counter" : "griddepcontrol.wait", sum / reps, mn, mx);
    }
    cudaError_t e = cudaGetLastError(); printf("%s\n", cudaGetErrorString(e));
}
