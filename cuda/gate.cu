// Gated decode: an offloaded decode token routed on the device against a directory of the cached
// experts (src/experts/engine/gated.rs). The directory is the resident table ([layers][experts][3]
// MatEntry, each entry the expert's slot while cached, some slot's matrices otherwise) and a
// presence flag per expert. A layer whose k experts are all present runs on with no host round
// trip; a layer with a miss holds the compute stream in moe_gate until the host has placed the
// miss (its load on the copy stream) and moe_gate_apply has opened the gate.

// After the layer's routes (route_topk's k indices, then k weights): they go to the host's
// mailbox (page-locked, mapped: [0] a state, then the 2k routes; the state 1 all present, 2 a
// miss), and on a miss the kernel waits until `gate` is set, then clears it. One warp. It lets
// the launches after it start only when it ends (no early trigger): the routed launch after it
// reads the directory the host may have just changed.
// `replay` (a flag word, then this layer's 2k routes), where its flag is 1: the routes replayed
// from a trace (hob bench --replay-trace) replace the router's, in `routes` too.
// With CPU experts (`hidden` > 0): the layer's input xs follows the routes in the mailbox on a
// miss, and the flag of the layer's CPU result (`extra_flag`, the word after it; moe_combine adds
// the result where it is set) is cleared before the host can set it.
// A gate the host leaves shut GATE_TIMEOUT_NS (a host blocked elsewhere: a deadlock) is given
// up: `abandoned` (mapped) gets layer + 1 and the token runs on; the host fails the token.
#define GATE_TIMEOUT_NS 120000000000ull
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
extern "C" __global__ void moe_gate(float* routes, const int* present, int k, int n_experts,
                                    float* mail, int* gate, const float* replay_flag,
                                    const float* replay, const float* xs, int hidden,
                                    float* extra_flag, int* abandoned, int layer) {
    pdl_wait();
    const int t = threadIdx.x;
    const bool replayed = __float_as_int(__ldcg(replay_flag)) == 1;
    int miss = 0;
    if (t == 0 && extra_flag) *extra_flag = 0.f;
    if (t < 2 * k) {
        const float r = replayed ? __ldcg(replay + t) : __ldcg(routes + t);
        if (replayed) routes[t] = r;
        mail[1 + t] = r;
        if (t < k) {
            const int e = __float_as_int(r);
            miss = e < 0 || e >= n_experts || __ldcg(present + e) == 0;
        }
        // Each writer's routes (and replayed routes) visible to the host and the device before
        // the state word says they are there.
        __threadfence_system();
    }
    miss = __any_sync(0xffffffffu, miss);
    if (miss && hidden > 0) {
        for (int i = t; i < hidden; i += 32) mail[1 + 2 * k + i] = __ldcg(xs + i);
        __threadfence_system();
    }
    __syncwarp();
    if (t != 0) return;
    reinterpret_cast<volatile float*>(mail)[0] = __int_as_float(miss ? 2 : 1);
    __threadfence_system();
    if (!miss) return;
    // A gate given up earlier in the token: the rest run through (the host fails the token).
    if (*reinterpret_cast<volatile int*>(abandoned) != 0) return;
    volatile int* g = gate;
    const unsigned long long t0 = global_ns();
    while (*g == 0) {
#if __CUDA_ARCH__ >= 700
        __nanosleep(200);
#endif
        if (global_ns() - t0 > GATE_TIMEOUT_NS) {
            *reinterpret_cast<volatile int*>(abandoned) = layer + 1;
            __threadfence_system();
            return;
        }
    }
    *g = 0;
    __threadfence();
}

// Directory changes as the host writes them (mapped page-locked memory): an expert's index in
// the table ([layer * experts + expert]), whether it is present now, and (present) its matrices.
struct GateEntry {
    int index, present, pad0, pad1;
    MatEntry m[3];
};

// Apply n directory changes (each index at most once), then, where `gate` is not null, open it
// (a layer's gate: moe_gate waits for it). On the gate's own stream, after the loads it needs.
extern "C" __global__ void moe_gate_apply(const GateEntry* __restrict__ u, int n, MatEntry* tab,
                                          int* present, int* gate) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int at = u[i].index;
        if (u[i].present) {
            tab[at * 3 + 0] = u[i].m[0];
            tab[at * 3 + 1] = u[i].m[1];
            tab[at * 3 + 2] = u[i].m[2];
        }
        present[at] = u[i].present;
    }
    // Every thread's changes visible device-wide before the gate opens.
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0 && gate) *reinterpret_cast<volatile int*>(gate) = 1;
}
