#include "worker/runtime/loader.h"
#include "worker/hpu/prof.h"

#include "worker/device/device.h"
#include "worker/hpu/dataio.h"
#include "worker/hpu/devmem.h"
#include "common/thread.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct slot {
	hpu_batch bt;
	const uint32_t *idx;
	int n;
	/* requested, not yet fetched: changed under mu; 0 stored with
	 * release after the batch, failed and bad are written, so that a
	 * waiter that reads 0 (acquire) needs no lock */
	atomic_int pending;
	int failed;
	size_t bad;
} slot;

struct hpu_loader {
	hpu_dataset ds;
	pthread_t thread;
	int started;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	slot s[2];
	int stop;
};

size_t hpu__field_numel(const hpu_field *f)
{
	size_t n = 1;
	for (int d = 0; d < f->ndim; d++)
		n *= (size_t)f->shape[d];
	return n;
}

/* Samples a fetch asks the caches for before it converts them. */
#define PREFETCH_AHEAD 8

int hpu__batch_fetch(const hpu_dataset *ds, const uint32_t *idx, int n, hpu_batch *bt,
		     size_t *bad)
{
	size_t numel[HPU_MAX_IO];
	void *out[HPU_MAX_IO];
	for (int f = 0; f < ds->nfields; f++)
		numel[f] = hpu__field_numel(&ds->fields[f]);
	bt->n = n;
	bt->idx = idx;
	for (int i = 0; i < n && i < PREFETCH_AHEAD; i++)
		hpu__data_prefetch(ds, idx[i]);
	for (int i = 0; i < n; i++) {
		if (i + PREFETCH_AHEAD < n)
			hpu__data_prefetch(ds, idx[i + PREFETCH_AHEAD]);
		for (int f = 0; f < ds->nfields; f++)
			out[f] = (char *)bt->data[f] + (size_t)i * numel[f] * 4;
		if (ds->fetch(ds->user, idx[i], out) != 0) {
			*bad = idx[i];
			return -1;
		}
	}
	return 0;
}

int hpu__batch_alloc(const hpu_dataset *ds, int max, hpu_batch *bt, const char *what)
{
	for (int f = 0; f < ds->nfields; f++) {
		char name[160];
		snprintf(name, sizeof name, "%s (%s)", what, ds->fields[f].name);
		bt->data[f] = hpu__dev_hbuf_alloc(HPU_MEM_OTHER,
					  (size_t)max * hpu__field_numel(&ds->fields[f]) * 4, name);
		if (!bt->data[f])
			return -1;
	}
	return 0;
}

void hpu__batch_free(hpu_batch *bt)
{
	for (int f = 0; f < HPU_MAX_IO; f++) {
		hpu__dev_hbuf_free(bt->data[f]);
		bt->data[f] = NULL;
	}
}

static void fetch_slot(const hpu_dataset *ds, slot *s)
{
	if (hpu__batch_fetch(ds, s->idx, s->n, &s->bt, &s->bad) < 0)
		s->failed = 1;
}

static void *run(void *arg)
{
	hpu_loader *ld = arg;
	hpu__prof_thread(HPU_PROF_LOADER);
	pthread_mutex_lock(&ld->mu);
	for (;;) {
		int k = ld->s[0].pending ? 0 : ld->s[1].pending ? 1 : -1;
		if (k < 0) {
			if (ld->stop)
				break;
			pthread_cond_wait(&ld->cv, &ld->mu);
			continue;
		}
		slot *s = &ld->s[k];
		pthread_mutex_unlock(&ld->mu);
		int64_t t0 = hpu__prof_t0();
		fetch_slot(&ld->ds, s);
		hpu__prof_span("data", "fetch_batch", NULL, t0, "\"samples\":%d", s->n);
		pthread_mutex_lock(&ld->mu);
		atomic_store_explicit(&s->pending, 0, memory_order_release);
		/* woken after the unlock: the waiter does not wake into a held
		 * lock (a futex wait and wake more, every batch) */
		pthread_mutex_unlock(&ld->mu);
		pthread_cond_broadcast(&ld->cv);
		pthread_mutex_lock(&ld->mu);
	}
	pthread_mutex_unlock(&ld->mu);
	return NULL;
}

hpu_loader *hpu__loader_new(const hpu_dataset *ds, int batch)
{
	hpu_loader *ld = calloc(1, sizeof *ld);
	if (!ld)
		return NULL;
	ld->ds = *ds;
	pthread_mutex_init(&ld->mu, NULL);
	pthread_cond_init(&ld->cv, NULL);
	for (int k = 0; k < 2; k++)
		if (hpu__batch_alloc(ds, batch, &ld->s[k].bt, "data loader batch") < 0)
			goto fail;
	if (hpu__thread_start(&ld->thread, run, ld) != 0)
		goto fail;
	ld->started = 1;
	return ld;
fail:
	hpu__loader_destroy(&ld);
	return NULL;
}

void hpu__loader_request(hpu_loader *ld, int k, const uint32_t *idx, int n)
{
	pthread_mutex_lock(&ld->mu);
	slot *s = &ld->s[k];
	s->idx = idx;
	s->n = n;
	s->failed = 0;
	atomic_store_explicit(&s->pending, 1, memory_order_relaxed);
	pthread_mutex_unlock(&ld->mu);
	pthread_cond_broadcast(&ld->cv); /* after the unlock, as run's */
}

int hpu__loader_wait(hpu_loader *ld, int k, const hpu_batch **bt, size_t *bad)
{
	slot *s = &ld->s[k];
	int failed;
	if (!atomic_load_explicit(&s->pending, memory_order_acquire)) {
		failed = s->failed; /* fetched already: no lock */
	} else {
		pthread_mutex_lock(&ld->mu);
		while (atomic_load_explicit(&s->pending, memory_order_relaxed))
			pthread_cond_wait(&ld->cv, &ld->mu);
		failed = s->failed;
		pthread_mutex_unlock(&ld->mu);
	}
	*bt = &s->bt;
	*bad = s->bad;
	return failed ? -1 : 0;
}

void hpu__loader_destroy(hpu_loader **pld)
{
	hpu_loader *ld = *pld;
	if (!ld)
		return;
	if (ld->started) {
		pthread_mutex_lock(&ld->mu);
		ld->stop = 1;
		pthread_cond_broadcast(&ld->cv);
		pthread_mutex_unlock(&ld->mu);
		pthread_join(ld->thread, NULL);
	}
	for (int k = 0; k < 2; k++)
		hpu__batch_free(&ld->s[k].bt);
	pthread_mutex_destroy(&ld->mu);
	pthread_cond_destroy(&ld->cv);
	free(ld);
	*pld = NULL;
}
