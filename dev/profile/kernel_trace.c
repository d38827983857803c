// A CUPTI injection library that records every kernel a CUDA program runs (graph replays
// included, without serialising them) and writes one CSV line per kernel at exit:
//   start_ns,end_ns,grid_x,grid_y,grid_z,block_x,block_y,block_z,regs,graph_id,graph_node,name
// Used to profile cubellm's graph-replayed decode step as it runs (dev/README.md,
// docs/investigations/decode-step.md):
//   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv ./cubellm ...
// With KERNEL_TRACE_COPIES set, memory copies and sets go to that file too, one CSV line each:
//   start_ns,end_ns,bytes,kind   (kind: the CUPTI copy kind, or "memset")
// Build (headers and libcupti from the nvidia-cuda-cupti wheel that PyTorch ships):
//   gcc -O2 -shared -fPIC -I$CU13/include kernel_trace.c -L$CU13/lib -l:libcupti.so.13
//       -o libkernel_trace.so   (crt/ headers: add -I of a full CUDA include dir)
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_SIZE (8 * 1024 * 1024)
#define ALIGN 8

static FILE *out;
static FILE *copies;

static void write_copy(CUpti_Activity *record) {
  if (!copies) return;
  if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
    CUpti_ActivityMemcpy6 *m = (CUpti_ActivityMemcpy6 *)record;
    fprintf(copies, "%llu,%llu,%llu,%u\n", (unsigned long long)m->start,
            (unsigned long long)m->end, (unsigned long long)m->bytes, (unsigned)m->copyKind);
  } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
    CUpti_ActivityMemset4 *m = (CUpti_ActivityMemset4 *)record;
    fprintf(copies, "%llu,%llu,%llu,memset\n", (unsigned long long)m->start,
            (unsigned long long)m->end, (unsigned long long)m->bytes);
  }
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
  uint8_t *b = (uint8_t *)malloc(BUF_SIZE + ALIGN);
  *buffer = b + (ALIGN - ((uintptr_t)b & (ALIGN - 1))) % ALIGN;
  *size = BUF_SIZE;
  *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer,
                                      size_t size, size_t valid) {
  (void)ctx;
  (void)stream;
  (void)size;
  CUpti_Activity *record = NULL;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
        record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
      write_copy(record);
      continue;
    }
    CUpti_ActivityKernel10 *k = (CUpti_ActivityKernel10 *)record;
    if (out)
      fprintf(out, "%llu,%llu,%d,%d,%d,%d,%d,%d,%u,%u,%llu,%s\n", (unsigned long long)k->start,
              (unsigned long long)k->end, k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY,
              k->blockZ, (unsigned)k->registersPerThread, k->graphId,
              (unsigned long long)k->graphNodeId, k->name ? k->name : "?");
  }
  // The buffer was offset for alignment; the leak of one small header per buffer is accepted.
}

static void at_exit(void) {
  cuptiActivityFlushAll(1);
  if (out) {
    fclose(out);
    out = NULL;
  }
  if (copies) {
    fclose(copies);
    copies = NULL;
  }
}

int InitializeInjection(void) {
  const char *path = getenv("KERNEL_TRACE_OUT");
  out = fopen(path ? path : "kernel_trace.csv", "w");
  if (!out) return 0;
  fprintf(out, "start_ns,end_ns,grid_x,grid_y,grid_z,block_x,block_y,block_z,regs,graph_id,"
               "graph_node,name\n");
  if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS)
    return 0;
  if (cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS) return 0;
  const char *copies_path = getenv("KERNEL_TRACE_COPIES");
  if (copies_path && (copies = fopen(copies_path, "w")) != NULL) {
    fprintf(copies, "start_ns,end_ns,bytes,kind\n");
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
  }
  atexit(at_exit);
  return 1;
}
