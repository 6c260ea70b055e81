#include "loader.h"
#include "prof.h"

#include "devmem.h"

#include <pthread.h>
#include <stdlib.h>

typedef struct slot {
	float *x;
	int32_t *labels;
	const uint32_t *idx;
	int n;
	int pending; /* requested, not yet fetched */
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

static void fetch_slot(const hpu_dataset *ds, slot *s)
{
	for (int i = 0; i < s->n; i++) {
		size_t k = s->idx[i];
		if (ds->fetch(ds->user, k, s->x + (size_t)i * ds->sample_size,
			      s->labels + (size_t)i * ds->label_size) != 0) {
			s->failed = 1;
			s->bad = k;
			return;
		}
	}
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
		s->pending = 0;
		pthread_cond_broadcast(&ld->cv);
	}
	pthread_mutex_unlock(&ld->mu);
	return NULL;
}

hpu_loader *hpu_loader_new(const hpu_dataset *ds, int batch)
{
	hpu_loader *ld = calloc(1, sizeof *ld);
	if (!ld)
		return NULL;
	ld->ds = *ds;
	pthread_mutex_init(&ld->mu, NULL);
	pthread_cond_init(&ld->cv, NULL);
	for (int k = 0; k < 2; k++) {
		ld->s[k].x = hpu__dalloc(HPU_MEM_OTHER, (size_t)batch * ds->sample_size * sizeof(float),
					"data loader batch");
		ld->s[k].labels = hpu__dalloc(HPU_MEM_OTHER, (size_t)batch * ds->label_size * sizeof(int32_t),
					     "data loader labels");
		if (!ld->s[k].x || !ld->s[k].labels)
			goto fail;
	}
	if (pthread_create(&ld->thread, NULL, run, ld) != 0)
		goto fail;
	ld->started = 1;
	return ld;
fail:
	hpu_loader_destroy(&ld);
	return NULL;
}

void hpu_loader_request(hpu_loader *ld, int k, const uint32_t *idx, int n)
{
	pthread_mutex_lock(&ld->mu);
	slot *s = &ld->s[k];
	s->idx = idx;
	s->n = n;
	s->failed = 0;
	s->pending = 1;
	pthread_cond_broadcast(&ld->cv);
	pthread_mutex_unlock(&ld->mu);
}

int hpu_loader_wait(hpu_loader *ld, int k, float **x, int32_t **labels,
		    size_t *bad)
{
	slot *s = &ld->s[k];
	pthread_mutex_lock(&ld->mu);
	while (s->pending)
		pthread_cond_wait(&ld->cv, &ld->mu);
	int failed = s->failed;
	pthread_mutex_unlock(&ld->mu);
	*x = s->x;
	*labels = s->labels;
	*bad = s->bad;
	return failed ? -1 : 0;
}

void hpu_loader_destroy(hpu_loader **pld)
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
	for (int k = 0; k < 2; k++) {
		hpu__dfree(ld->s[k].x);
		hpu__dfree(ld->s[k].labels);
	}
	pthread_mutex_destroy(&ld->mu);
	pthread_cond_destroy(&ld->cv);
	free(ld);
	*pld = NULL;
}
