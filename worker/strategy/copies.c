/* copies: the bytes a step copies between host and device (copies.h). */
#include "worker/strategy/copies.h"

#include <stdio.h>
#include <string.h>

/* The gradients' collective over every unit: staged out and back. */
static void grads(const hpu_plan *p, const hpu_plan_step *st, hpu_plan_copies *c)
{
	const hpu_plan_entry *ge = &p->e[HPU_PLAN_GRADS];
	uint64_t esz = p->grad_comm16 ? 2 : hpu__plan_esize(ge), out = 0, back = 0;
	for (int k = 0; k < st->nunits; k++) {
		const hpu_plan_unit *u = &st->units[k];
		switch (ge->coll) {
		case HPU_PLAN_ALL_REDUCE:
		case HPU_PLAN_ALL_REDUCE_FLAT: /* the buffer out, the sum back */
			out += u->len * esz;
			back += u->len * esz;
			break;
		case HPU_PLAN_REDUCE_SCATTER:
		case HPU_PLAN_REDUCE_SCATTER_BUCKETS: /* the unit out, the piece back */
			out += u->len * esz;
			back += u->piece * esz;
			break;
		default:
			break;
		}
	}
	/* zero2/3 reduce-scatter a bucket every micro-step */
	uint64_t times = ge->coll == HPU_PLAN_REDUCE_SCATTER_BUCKETS ? (uint64_t)st->accum : 1;
	c->d2h[HPU_COPY_GRADS] = out * times;
	c->h2d[HPU_COPY_GRADS] = back * times;
}

/* ZeRO's parameter all-gathers: the piece out where it is on the device,
 * the others' pieces back, and the own piece too where it is not. */
static void params(const hpu_plan *p, const hpu_plan_step *st, hpu_plan_copies *c)
{
	const hpu_plan_entry *pe = &p->e[HPU_PLAN_PARAMS];
	uint64_t esz = hpu__plan_esize(pe);
	int ondev = pe->where == HPU_PLAN_DEVICE;
	for (int k = 0; k < st->nunits; k++) {
		const hpu_plan_unit *u = &st->units[k];
		uint64_t times;
		if (pe->coll == HPU_PLAN_ALL_GATHER_STEP)
			times = 1;
		else if (pe->coll == HPU_PLAN_ALL_GATHER_LAYER)
			times = u->persistent ? 1 : (uint64_t)st->accum * (uint64_t)u->gathers;
		else
			return;
		/* in place (colls_in_place): libhpucoll moves every piece itself,
		 * the own one from the host tier too */
		uint64_t out = p->world > 1 && ondev && !st->colls_in_place ? u->piece : 0;
		uint64_t back = st->colls_in_place ? 0 : (u->len - u->piece) + (ondev ? 0 : u->piece);
		c->d2h[HPU_COPY_PARAMS] += times * out * esz;
		c->h2d[HPU_COPY_PARAMS] += times * back * esz;
	}
}

/* The offload tier's traffic (copies.h): the gradient pieces landing in
 * the host tier, and what crosses to the side the update runs on. */
static void offload(const hpu_plan *p, const hpu_plan_step *st, hpu_plan_copies *c)
{
	const hpu_plan_entry *ge = &p->e[HPU_PLAN_GRADS], *pe = &p->e[HPU_PLAN_PARAMS];
	int host = hpu__plan_on_host(p->update), gh = hpu__plan_on_host(ge->where),
	    ph = hpu__plan_on_host(pe->where);
	uint64_t gsz = hpu__plan_esize(ge), in = 0, out = 0;
	for (int k = 0; k < st->nunits; k++) {
		const hpu_plan_unit *u = &st->units[k];
		uint64_t n = u->piece ? u->piece : u->len; /* the range the rank updates */
		if (ge->sharded && gh) /* landed every micro-step */
			out += (uint64_t)st->accum * n * gsz;
		if (gh != host) /* to the update */
			*(host ? &out : &in) += n * gsz;
		if (ph != host && p->mixed) /* the 16-bit rounding back */
			*(host ? &in : &out) += n * 2;
		else if (ph != host) { /* fp32: there and back */
			in += n * 4;
			out += n * 4;
		}
	}
	c->h2d[HPU_COPY_OFFLOAD] = in;
	c->d2h[HPU_COPY_OFFLOAD] = out;
}

static void totals(hpu_plan_copies *c)
{
	for (int k = 0; k < HPU_COPY_N; k++) {
		c->h2d_total += c->h2d[k];
		c->d2h_total += c->d2h[k];
	}
}

void hpu__plan_copies(const hpu_plan *p, const hpu_plan_step *st, hpu_plan_copies *c)
{
	memset(c, 0, sizeof *c);
	c->exact = !st->regathers || p->e[HPU_PLAN_PARAMS].coll != HPU_PLAN_ALL_GATHER_LAYER;
	offload(p, st, c);
	if (st->host_can_read) { /* read in place: nothing else is copied */
		totals(c);
		return;
	}
	uint64_t samples = (uint64_t)st->micro * (uint64_t)st->accum;
	if (!st->eager) /* the ops' deferred checks come back too: as many as they took */
		c->exact = 0;
	c->h2d[HPU_COPY_BATCH] = samples * st->sample_bytes;
	c->d2h[HPU_COPY_LOSS] = (uint64_t)(st->eager ? 2 : 1) * (uint64_t)st->accum * 8 *
				(uint64_t)st->nloss;
	c->h2d[HPU_COPY_STEP] = 24 + (st->clip && st->grads_host ? 8 : 0);
	c->d2h[HPU_COPY_STEP] = (uint64_t)(st->host_decides ? 2 : 1) * st->vars_bytes;
	if (p->world > 1 && !st->colls_in_place) { /* the flag's all-reduce, the norm's
						     * (F64: staged but in place) */
		uint64_t b = (st->grads_direct ? 0 : 4) + (st->sharded && st->clip ? 8 : 0);
		c->h2d[HPU_COPY_STEP] += b;
		c->d2h[HPU_COPY_STEP] += b;
	}
	c->h2d[HPU_COPY_HOSTLAYERS] = (uint64_t)st->accum * st->staged_h2d;
	c->d2h[HPU_COPY_HOSTLAYERS] = (uint64_t)st->accum * st->staged_d2h;
	if (p->world > 1) { /* at 1 the collectives are the identity */
		if (!st->grads_direct && !st->colls_in_place) /* else device to device, or in place */
			grads(p, st, c);
		c->h2d[HPU_COPY_BUFFERS] = c->d2h[HPU_COPY_BUFFERS] = (uint64_t)st->synced_buffers * 4;
	}
	params(p, st, c);
	totals(c);
}

const char *hpu__plan_copy_name(hpu_plan_copy c)
{
	static const char *const n[] = {"batch", "loss", "gradients", "parameters", "buffers",
					"offload",
					"host-only layers", "step's scalars"};
	return (unsigned)c < HPU_COPY_N ? n[c] : "?";
}

void hpu__plan_copies_describe(const hpu_plan_copies *c, int d2h, char *out, size_t outlen)
{
	const uint64_t *v = d2h ? c->d2h : c->h2d;
	size_t n = (size_t)snprintf(out, outlen, "%s%llu bytes %s", c->exact ? "" : "at least ",
				    (unsigned long long)(d2h ? c->d2h_total : c->h2d_total),
				    d2h ? "device-to-host" : "host-to-device");
	const char *sep = " (";
	for (int k = 0; k < HPU_COPY_N && n < outlen; k++) {
		if (!v[k])
			continue;
		n += (size_t)snprintf(out + n, outlen - n, "%s%s %llu", sep,
				      hpu__plan_copy_name((hpu_plan_copy)k),
				      (unsigned long long)v[k]);
		sep = ", ";
	}
	if (*sep == ',' && n < outlen)
		snprintf(out + n, outlen - n, ")");
}
