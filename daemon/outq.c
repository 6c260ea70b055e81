/* outq: a singly linked list with a byte count and, per rank, the
 * output lines dropped since the last notice. */
#include "daemon/outq.h"

#include <stdlib.h>
#include <string.h>

int hpud__outq_init(hpud_outq *q, int first_rank, int nranks)
{
	memset(q, 0, sizeof *q);
	if (nranks > 0 &&
	    !(q->drops = calloc((size_t)nranks, sizeof *q->drops)))
		return -1;
	q->first_rank = first_rank;
	q->nranks = nranks > 0 ? nranks : 0;
	return 0;
}

void hpud__outq_free(hpud_outq *q)
{
	while (q->head)
		hpud__outq_pop(q);
	for (int i = 0; i < q->nranks; i++)
		free(q->drops[i].last);
	free(q->drops);
	memset(q, 0, sizeof *q);
}

int hpud__outq_push(hpud_outq *q, uint8_t *body, size_t len)
{
	hpud_outq_msg *m = malloc(sizeof *m);
	if (!m) {
		free(body);
		return -1;
	}
	m->next = NULL;
	m->body = body;
	m->len = len;
	if (q->tail)
		q->tail->next = m;
	else
		q->head = m;
	q->tail = m;
	q->bytes += len + HPUD_OUTQ_OVERHEAD;
	q->messages++;
	return 0;
}

int hpud__outq_push_line(hpud_outq *q, int rank, size_t text_len, uint8_t *body, size_t len)
{
	if (!q->dropping)
		return hpud__outq_push(q, body, len) == 0;
	free(body);
	hpud__outq_count_drop(q, rank, text_len);
	return 0;
}

int hpud__outq_push_record(hpud_outq *q, size_t bound, uint8_t *body, size_t len)
{
	if (!q->dropping && q->bytes + len + HPUD_OUTQ_OVERHEAD <= bound)
		return hpud__outq_push(q, body, len) == 0;
	free(body);
	return 0;
}

int hpud__outq_full(const hpud_outq *q, size_t bound)
{
	return q->bytes > bound;
}

int hpud__outq_room(const hpud_outq *q, size_t bound)
{
	return q->bytes <= bound / 2;
}

void hpud__outq_stall(hpud_outq *q)
{
	q->dropping = 1;
}

int hpud__outq_dropping(const hpud_outq *q)
{
	return q->dropping;
}

void hpud__outq_count_drop(hpud_outq *q, int rank, size_t text_len)
{
	if (rank < 0)
		return;
	q->total.lines++;
	q->total.bytes += (long long)text_len;
	if (rank >= q->first_rank && rank - q->first_rank < q->nranks) {
		q->drops[rank - q->first_rank].lines++;
		q->drops[rank - q->first_rank].bytes += (long long)text_len;
	}
}

void hpud__outq_keep_line(hpud_outq *q, int rank, int is_err, const char *text, size_t len)
{
	if (rank < q->first_rank || rank - q->first_rank >= q->nranks) {
		hpud__outq_count_drop(q, rank, len);
		return;
	}
	hpud_outq_drops *d = &q->drops[rank - q->first_rank];
	char *copy = malloc(len + 1);
	if (!copy) {
		hpud__outq_count_drop(q, rank, len);
		return;
	}
	memcpy(copy, text, len);
	copy[len] = 0;
	if (d->last) {
		hpud__outq_count_drop(q, rank, d->last_len);
		free(d->last);
	}
	d->last = copy;
	d->last_len = len;
	d->last_err = is_err;
}

const hpud_outq_msg *hpud__outq_peek(const hpud_outq *q)
{
	return q->head;
}

void hpud__outq_pop(hpud_outq *q)
{
	hpud_outq_msg *m = q->head;
	if (!m)
		return;
	q->head = m->next;
	if (!q->head)
		q->tail = NULL;
	q->bytes -= m->len + HPUD_OUTQ_OVERHEAD;
	q->messages--;
	free(m->body);
	free(m);
}

int hpud__outq_caught_up(const hpud_outq *q, size_t bound)
{
	return q->dropping && q->bytes <= bound / 2;
}

int hpud__outq_has_drops(const hpud_outq *q)
{
	for (int i = 0; i < q->nranks; i++)
		if (q->drops[i].lines || q->drops[i].last)
			return 1;
	return 0;
}

int hpud__outq_take_drops(hpud_outq *q, int *rank, hpud_outq_drops *d)
{
	for (int i = 0; i < q->nranks; i++)
		if (q->drops[i].lines || q->drops[i].last) {
			*rank = q->first_rank + i;
			*d = q->drops[i];
			memset(&q->drops[i], 0, sizeof q->drops[i]);
			return 1;
		}
	q->dropping = 0;
	return 0;
}
