/* The cpu device's functions that the strict CPU device shares (its
 * memory is host memory too, only guarded). Internal to worker/device. */
#ifndef HPU_DEVICE_IMPL_H
#define HPU_DEVICE_IMPL_H

#include "worker/device/device.h"

void hpu__dev_cpu_copy(hpu__dev_queue *q, void *dst, const void *src, size_t n);
void hpu__dev_cpu_fill(hpu__dev_queue *q, void *dst, int byte, size_t n);
void hpu__dev_cpu_record(hpu__dev_queue *q, hpu__dev_event *ev);
void hpu__dev_cpu_wait(const hpu__dev_event *ev);
void *hpu__dev_cpu_host_alloc(size_t bytes);
void hpu__dev_cpu_host_free(void *p);

/* The members of an hpu__device that the cpu and strict CPU devices
 * share in their initializers: the functions above, the CPU kernels and
 * the cpu run-time ops. */
#define HPU__DEV_CPU_SHARED                                                                        \
	.copy = hpu__dev_cpu_copy, .fill = hpu__dev_cpu_fill, .record = hpu__dev_cpu_record,      \
	.wait = hpu__dev_cpu_wait, .host_alloc = hpu__dev_cpu_host_alloc,                          \
	.host_free = hpu__dev_cpu_host_free, .ops = hpu__be, .rt = &hpu__dev_cpu_rtops

/* cpu-strict's kernels-only mode (device_kernels.c): 1 when
 * HPU_STRICT_KERNELS=1; the table whose every function is a device call
 * around the CPU's kernel (the backend's, else hpu__be_host's). */
int hpu__dev_strict_kernels(void);
const hpu__backend *hpu__dev_kernels_table(void);
/* Makes the ops' scratch (autocast, fp8) device memory, as a GPU's is;
 * for the process's life (the worker's). */
void hpu__dev_kernels_scratch(void);

#endif
