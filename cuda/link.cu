// Emulated link (a profile's pace), on the expert loader's copy stream: link_start before a
// chunk's copy notes when the chunk starts crossing; link_wait after the copy holds the stream
// until the chunk has crossed at the profile's rate, `ns` nanoseconds later. Pacing on the GPU
// needs no host thread to wake on time (CPU experts keep every core busy).
extern "C" __global__ void link_start(unsigned long long* clk) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    clk[0] = now;
}

extern "C" __global__ void link_wait(const unsigned long long* clk, unsigned long long ns) {
    const unsigned long long end = clk[0] + ns;
    unsigned long long now;
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now < end);
}
