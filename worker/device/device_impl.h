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

#endif
