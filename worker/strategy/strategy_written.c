/* strategy_written: cpu-strict's check that a layer writes what hpu.h
 * says it writes: every value of each output in its forward and of each
 * din it is given in its backward (overwritten, not added to). Before the
 * call each such fp32 tensor is filled with a marker (a signalling NaN of
 * its own payload, which no arithmetic makes); after it, any marker left,
 * or the marker quieted by an operation on it (+=), is a value the layer
 * did not write. On cpu those values would hold what
 * the memory held before (another tensor's leftovers): the layer trains
 * on garbage, differently on each device. Off elsewhere, while a step is
 * recorded (the call records, computing nothing), and where the steps are
 * recordable (HPU_STRICT_STEP=1, --graphs): there an op's check of its
 * data is read after the step, and a kernel that found a bad label left
 * its output unwritten, which the deferred check then names. */
#include <stdint.h>
#include <string.h>

#include "worker/device/device.h"
#include "worker/strategy/strategy_impl.h"

#define MARK 0x7fa0deadu /* a signalling NaN: no operation yields it */
/* ... nor its payload: an operation on the marker (a layer that added to
 * the value, +=) gives it quieted (bit 22 set), its sign either way */
#define MARK_BITS 0x7fbfffffu

static int checking(const hpu_strat *s)
{
	return !strcmp(hpu__dev_name(), "cpu-strict") && !hpu__dev_capturing() &&
	       !s->vars.recordable;
}

/* Tensor t's values in v (a view the layer is given), or 0 where they
 * are not fp32 floats or not there. */
static size_t numel_of(const hpu_strat *s, int t, const hpu_tensor *v)
{
	const hpu_tinfo *ti = &s->b->tensors[t];
	return v->data && ti->dtype == HPU_F32 ? (size_t)s->ctx.batch * ti->sample_numel : 0;
}

static void mark(void *p, size_t n)
{
	uint32_t *u = p;
	hpu__dev_enter(); /* device memory where the layer is not staged */
	for (size_t i = 0; i < n; i++)
		u[i] = MARK;
	hpu__dev_leave();
}

static size_t marks_left(const void *p, size_t n)
{
	const uint32_t *u = p;
	size_t left = 0;
	hpu__dev_enter();
	for (size_t i = 0; i < n; i++)
		left += (u[i] & MARK_BITS) == MARK;
	hpu__dev_leave();
	return left;
}

void hpu__written_mark(const hpu_strat *s, int i, int backward, const hpu_tensor *v,
		       unsigned skip)
{
	const hpu_layer *l = s->b->layers[i];
	if (!checking(s))
		return;
	int n = backward ? l->nin : l->nout;
	for (int k = 0; k < n; k++)
		if (!(skip >> k & 1u))
			mark(v[k].data, numel_of(s, backward ? l->in[k] : l->out[k], &v[k]));
}

int hpu__written_check(hpu_strat *s, int i, int backward, const hpu_tensor *v, unsigned skip)
{
	const hpu_layer *l = s->b->layers[i];
	if (!checking(s))
		return 0;
	int n = backward ? l->nin : l->nout;
	for (int k = 0; k < n; k++) {
		int t = backward ? l->in[k] : l->out[k];
		size_t all = skip >> k & 1u ? 0 : numel_of(s, t, &v[k]);
		size_t left = all ? marks_left(v[k].data, all) : 0;
		if (left)
			return hpu__strat_fail(
				s, "layer %s: its %s left %zu of the %zu values of %s%s unwritten: it "
				   "writes every one (hpu.h: a forward its outputs, a backward each din "
				   "it is given, overwriting it); --device cpu-strict marks them before "
				   "the call to catch this, on cpu they would hold whatever the memory "
				   "held before",
				l->name, backward ? "backward" : "forward", left, all,
				backward ? "din for " : "its output ", s->b->tensors[t].name);
	}
	return 0;
}
