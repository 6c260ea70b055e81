/* checks: see checks.h. The records are host memory; the slots are the
 * caller's (device memory), never read here but from the copy the
 * caller hands to hpu__checks_report. */
#include "worker/ops/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/ops/backend.h"
#include "worker/ops/fp8.h"

/* What one taken slot needs to explain its finding. */
typedef struct record {
	hpu__check_op op;
	char layer[64];    /* the layer running, "" for none */
	const void *key;   /* the input checked (never read) */
	long limit;        /* classes, vocabulary, the bound */
	int rows;          /* rows of per values, 0 where unknown */
	size_t per;
	uint32_t *samples; /* [rows] the rows' dataset samples, or NULL */
	int cap;           /* samples allocated */
	int has_samples;
	const uint32_t *src; /* where they were copied from (the batch's) */
	int live;          /* restored (hpu__checks_restore): read src instead */
} record;

static _Thread_local struct {
	hpu__check_slot *slots; /* device memory: never read here */
	int nslots, used, armed;
	record *rec; /* [nrec] */
	int nrec;
	const uint32_t *samples; /* the batch's, while its layers run */
	int batch_rows;
} T;

void hpu__checks_arm(void *slots, int nslots)
{
	if (nslots > T.nrec) {
		record *r = realloc(T.rec, (size_t)nslots * sizeof *r);
		if (!r) { /* no records, no slots: the ops check eagerly */
			hpu__checks_disarm();
			return;
		}
		memset(r + T.nrec, 0, (size_t)(nslots - T.nrec) * sizeof *r);
		T.rec = r;
		T.nrec = nslots;
	}
	T.slots = slots;
	T.nslots = nslots;
	T.used = 0;
	T.armed = slots != NULL && nslots > 0;
}

void hpu__checks_disarm(void)
{
	T.armed = 0;
}

void hpu__checks_free(void)
{
	for (int i = 0; i < T.nrec; i++)
		free(T.rec[i].samples);
	free(T.rec);
	memset(&T, 0, sizeof T);
}

void hpu__checks_batch(const uint32_t *samples, int rows)
{
	T.samples = samples;
	T.batch_rows = rows;
}

/* The rows' dataset samples into r (where the op's rows are the
 * batch's): a copy, for the batch's buffer is reused before the report. */
static void keep_samples(record *r)
{
	r->has_samples = 0;
	if (!T.samples || r->rows <= 0 || r->rows != T.batch_rows)
		return;
	if (r->cap < r->rows) {
		uint32_t *p = realloc(r->samples, (size_t)r->rows * sizeof *p);
		if (!p)
			return; /* the report names the row only */
		r->samples = p;
		r->cap = r->rows;
	}
	memcpy(r->samples, T.samples, (size_t)r->rows * sizeof *r->samples);
	r->has_samples = 1;
	r->src = T.samples;
}

hpu__check_slot *hpu__checks_take(hpu__check_op op, const void *key, long limit, int rows,
				  size_t per)
{
	/* a table whose memory the host cannot read writes host memory
	 * and waits (CUDA's today): eager there, unless it says its
	 * kernels write the findings into device memory (findings_dev) */
	if (!T.armed || T.used >= T.nslots || !(hpu__be_on_host() || hpu__be()->findings_dev))
		return NULL;
	if (rows == 0) { /* per values in all, the batch's rows' where they divide */
		rows = T.batch_rows > 0 && per % (size_t)T.batch_rows == 0 ? T.batch_rows : 0;
		per = rows ? per / (size_t)rows : 0;
	}
	record *r = &T.rec[T.used];
	r->live = 0;
	r->has_samples = 0;
	r->op = op;
	snprintf(r->layer, sizeof r->layer, "%s", hpu__op_layer_name());
	r->key = key;
	r->limit = limit;
	r->rows = rows;
	r->per = per;
	keep_samples(r);
	return &T.slots[T.used++];
}

long hpu__checks_limit(const void *key)
{
	for (int i = T.armed ? T.used - 1 : -1; i >= 0; i--)
		if (T.rec[i].key == key)
			return T.rec[i].limit;
	return -1;
}

int hpu__checks_used(void)
{
	return T.used;
}

/* What each op checks: its value's name, its range, the op. */
static const struct {
	const char *value, *op;
} ops[] = {
	[HPU__CHECK_XENT_POS] = {"label", "cross-entropy"},
	[HPU__CHECK_XENT] = {"label", "cross-entropy"},
	[HPU__CHECK_EMBEDDING] = {"id", "embedding"},
	[HPU__CHECK_BCE] = {"probability", "binary cross-entropy"},
	[HPU__CHECK_IDS] = {"value", "id check"},
};

/* Where the rows are not known: the flat index. */
static void explain_flat(const record *r, const hpu__check_slot *k, const char *layer, char *msg,
			 size_t len)
{
	char v[48], range[48];
	if (r->op == HPU__CHECK_BCE) {
		snprintf(v, sizeof v, "%g", (double)k->bad_value);
		snprintf(range, sizeof range, "[0, 1]");
	} else {
		snprintf(v, sizeof v, "%d", (int)k->bad_id);
		snprintf(range, sizeof range, "[0, %ld)", r->limit);
	}
	snprintf(msg, len,
		 "layer %s: %s %s at index %ld is outside %s: found after the step (the %s's check, "
		 "deferred)",
		 layer, ops[r->op].value, v, k->bad, range, ops[r->op].op);
}

static void explain(const record *r, const hpu__check_slot *k, char *msg, size_t len)
{
	const char *layer = r->layer[0] ? r->layer : "(none)";
	if (r->rows <= 0 || r->per == 0) {
		explain_flat(r, k, layer, msg, len);
		return;
	}
	size_t row = (size_t)k->bad / r->per, p = (size_t)k->bad % r->per;
	const uint32_t *sm = r->live ? r->src : r->samples;
	unsigned long sample = r->has_samples && sm && row < (size_t)r->rows ? sm[row] : row;
	switch (r->op) {
	case HPU__CHECK_XENT_POS:
	case HPU__CHECK_XENT:
		snprintf(msg, len,
			 "layer %s: label %d at row %zu (dataset sample %lu), position %zu is outside "
			 "[0, %ld) and not -100 (ignored): found after the step (the cross-entropy's "
			 "check, deferred)",
			 layer, (int)k->bad_id, row, sample, p, r->limit);
		break;
	case HPU__CHECK_EMBEDDING:
		snprintf(msg, len,
			 "layer %s: id %d at position %zu of row %zu (dataset sample %lu) is outside "
			 "the vocabulary [0, %ld): found after the step (the embedding's check, "
			 "deferred)",
			 layer, (int)k->bad_id, p, row, sample, r->limit);
		break;
	case HPU__CHECK_BCE:
		snprintf(msg, len,
			 "layer %s: probability %g at row %zu (dataset sample %lu), element %zu is "
			 "outside [0, 1]: found after the step (the binary cross-entropy's check, "
			 "deferred)",
			 layer, (double)k->bad_value, row, sample, p);
		break;
	case HPU__CHECK_IDS:
		snprintf(msg, len,
			 "layer %s: value %d at position %zu of row %zu (dataset sample %lu) is "
			 "outside [0, %ld): found after the step (the id check, deferred)",
			 layer, (int)k->bad_id, p, row, sample, r->limit);
		break;
	}
}

/* A saved arming: its records (without their sample copies). */
struct hpu__checks_snap {
	int used;
	record rec[];
};

hpu__checks_snap *hpu__checks_save(void)
{
	hpu__checks_snap *s = malloc(sizeof *s + (size_t)T.used * sizeof(record));
	if (!s)
		return NULL;
	s->used = T.used;
	for (int i = 0; i < T.used; i++) {
		s->rec[i] = T.rec[i];
		s->rec[i].samples = NULL; /* T.rec keeps its own */
		s->rec[i].cap = 0;
	}
	return s;
}

int hpu__checks_restore(const hpu__checks_snap *s)
{
	if (s->used > T.nrec) {
		record *r = realloc(T.rec, (size_t)s->used * sizeof *r);
		if (!r)
			return -1;
		memset(r + T.nrec, 0, (size_t)(s->used - T.nrec) * sizeof *r);
		T.rec = r;
		T.nrec = s->used;
	}
	for (int i = 0; i < s->used; i++) {
		uint32_t *own = T.rec[i].samples;
		int cap = T.rec[i].cap;
		T.rec[i] = s->rec[i];
		T.rec[i].samples = own;
		T.rec[i].cap = cap;
		T.rec[i].live = 1;
	}
	T.used = s->used;
	return 0;
}

void hpu__checks_snap_free(hpu__checks_snap *s)
{
	free(s);
}

int hpu__checks_report(const void *host_copy, char *msg, size_t len)
{
	const hpu__check_slot *k = host_copy;
	for (int i = 0; i < T.used; i++)
		if (k[i].bad >= 0) {
			explain(&T.rec[i], &k[i], msg, len);
			return 1;
		}
	return 0;
}
