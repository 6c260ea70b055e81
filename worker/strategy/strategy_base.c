/* strategy_base: what every strategy file uses -- errors, allocating
 * device and offloadable memory, the units' names, pointing layers at
 * their parameters. Calls no other strategy file. */
#include <stdarg.h>
#include <stdio.h>

#include "worker/hpu/devmem.h"
#include "worker/strategy/strategy_impl.h"

#define fail hpu__strat_fail

int hpu__strat_fail(hpu_strat *s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(s->err, s->errlen, fmt, ap);
	va_end(ap);
	return -1;
}

int hpu__strat_coll_fail(hpu_strat *s, const char *what, int rc)
{
	const char *msg = hpucoll_comm_errmsg(s->comm);
	return fail(s, "%s failed: %s", what, msg && *msg ? msg : hpucoll_strerror(rc));
}

void *hpu__strat_dalloc(hpu_strat *s, hpu_mem_kind kind, size_t bytes, const char *what)
{
	void *p = hpu__dalloc(kind, bytes, what);
	if (!p)
		fail(s, "%s", hpu__devmem_error());
	return p;
}

/* A model state that ZeRO-Offload may keep outside the device: in the
 * host tier when `where` says so (cpu; nvme keeps its in-memory
 * buffers there too), else device memory. */
void *hpu__strat_salloc(hpu_strat *s, hpu_offload where, hpu_mem_kind kind, size_t bytes,
			const char *what)
{
	void *p = where ? hpu__halloc(kind, bytes, what) : hpu__dalloc(kind, bytes, what);
	if (!p)
		fail(s, "%s", hpu__devmem_error());
	return p;
}

void hpu__strat_point(hpu_strat *s, int k, float *p, float *g)
{
	unit *u = &s->u[k];
	for (int i = u->first; i <= u->last; i++) {
		hpu_layer *l = s->b->layers[i];
		if (p)
			l->pbase = p + (l->off - u->off);
		if (g)
			l->gbase = g + (l->off - u->off);
	}
}

const char *hpu__strat_unit_name(const hpu_strat *s, int k)
{
	return s->b->layers[s->u[k].first]->name;
}

