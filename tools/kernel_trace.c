// A kernel timeline for any CUDA program, CUDA graphs and dependent launches included (nsys is not
// on the device machine; CUPTI ships with the toolkit). Built and used on the device machine:
//
//   bash tools/kernel_trace.sh build          -> .gpu/libkernel_trace.so
//   HOB_KTRACE=/tmp/k.csv LD_PRELOAD=.gpu/libkernel_trace.so .gpu/hob bench ...
//   python3 tools/kernel_trace.py /tmp/k.csv  -> per-kernel time, gaps and overlaps per token
//
// Writes one line per kernel execution, memory copy and driver API call:
// start_ns,end_ns,stream,graph_node,name (one clock; copies are named "copy:KIND:BYTES:SRCKIND", API
// calls "api:NAME" with the calling thread as their stream).
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef KREC
#define KREC CUpti_ActivityKernel9
#endif
#ifndef MREC
#define MREC CUpti_ActivityMemcpy5
#endif

static FILE* out;

static void CUPTIAPI requested(uint8_t** buffer, size_t* size, size_t* max_records) {
    *size = 16 << 20;
    *buffer = (uint8_t*)aligned_alloc(8, *size);
    *max_records = 0;
}

static void CUPTIAPI completed(CUcontext ctx, uint32_t stream, uint8_t* buffer, size_t size, size_t valid) {
    (void)ctx;
    (void)stream;
    (void)size;
    CUpti_Activity* r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const KREC* k = (const KREC*)r;
            if (out) fprintf(out, "%llu,%llu,%u,%llu,%s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                             k->streamId, (unsigned long long)k->graphNodeId, k->name);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const MREC* m = (const MREC*)r;
            if (out) fprintf(out, "%llu,%llu,%u,%llu,copy:%u:%llu:%u\n", (unsigned long long)m->start,
                             (unsigned long long)m->end, m->streamId, (unsigned long long)m->graphNodeId,
                             (unsigned)m->copyKind, (unsigned long long)m->bytes, (unsigned)m->srcKind);
        } else if (r->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
            const CUpti_ActivityAPI* a = (const CUpti_ActivityAPI*)r;
            const char* name = "?";
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
            if (out) fprintf(out, "%llu,%llu,%u,0,api:%s\n", (unsigned long long)a->start, (unsigned long long)a->end,
                             a->threadId, name);
        }
    }
    free(buffer);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;
}

__attribute__((constructor)) static void start(void) {
    const char* path = getenv("HOB_KTRACE");
    out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!out) return;
    if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        (getenv("HOB_KTRACE_API") && cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS) ||
        cuptiActivityRegisterCallbacks(requested, completed) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI activity tracing unavailable\n");
        return;
    }
    atexit(finish);
}
