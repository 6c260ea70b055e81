/* plan: the placement plan (plan.h). */
#include "worker/strategy/plan.h"

#include <stdio.h>

static hpu_plan_where tier(hpu_offload o)
{
	return o == HPU_OFFLOAD_NVME ? HPU_PLAN_NVME
	       : o == HPU_OFFLOAD_CPU ? HPU_PLAN_HOST
				      : HPU_PLAN_DEVICE;
}

/* The tier of what the optimizer offload moves but NVMe cannot hold (the
 * gradient shard): the host's memory for either offload. */
static hpu_plan_where near_tier(hpu_offload o)
{
	return o == HPU_OFFLOAD_NONE ? HPU_PLAN_DEVICE : HPU_PLAN_HOST;
}

static hpu_plan_coll grads_coll(hpu_strategy k)
{
	switch (k) {
	case HPU_STRATEGY_FAST_DDP:
		return HPU_PLAN_ALL_REDUCE_FLAT;
	case HPU_STRATEGY_DDP:
		return HPU_PLAN_ALL_REDUCE;
	case HPU_STRATEGY_ZERO1:
		return HPU_PLAN_REDUCE_SCATTER;
	default:
		return HPU_PLAN_REDUCE_SCATTER_BUCKETS;
	}
}

void hpu__plan_make(hpu_plan *p, const hpu_train_opts *o, int world, int opt_floats)
{
	hpu_strategy k = o->strategy;
	int sharded = k >= HPU_STRATEGY_ZERO1;
	*p = (hpu_plan){.kind = k, .precision = o->precision, .world = world};
	p->mixed = o->precision != HPU_PREC_FP32;
	p->fp16 = o->precision == HPU_PREC_FP16_MIXED;
	p->grad_comm16 = !p->mixed && !sharded && o->grad_comm_dtype == HPU_COMM_BF16;
	p->update = near_tier(o->offload_optimizer);
	hpu_plan_dtype d16 = !p->mixed ? HPU_PLAN_FP32 : p->fp16 ? HPU_PLAN_FP16 : HPU_PLAN_BF16;

	hpu_plan_entry *e = &p->e[HPU_PLAN_PARAMS];
	*e = (hpu_plan_entry){.where = HPU_PLAN_DEVICE, .dtype = d16, .copies = 1};
	if (k == HPU_STRATEGY_ZERO3) {
		e->where = tier(o->offload_param);
		e->sharded = 1;
		e->coll = HPU_PLAN_ALL_GATHER_LAYER;
	} else if (sharded) {
		e->coll = HPU_PLAN_ALL_GATHER_STEP;
	}

	e = &p->e[HPU_PLAN_GRADS];
	*e = (hpu_plan_entry){.where = HPU_PLAN_DEVICE, .dtype = d16, .copies = 1,
			      .coll = grads_coll(k)};
	if (k >= HPU_STRATEGY_ZERO2) { /* only the owned shard is kept */
		e->sharded = 1;
		e->where = near_tier(o->offload_optimizer);
	}

	e = &p->e[HPU_PLAN_MASTER];
	*e = (hpu_plan_entry){.dtype = HPU_PLAN_FP32};
	if (p->mixed) {
		e->where = tier(o->offload_optimizer);
		e->sharded = sharded;
		e->copies = 1;
	}

	e = &p->e[HPU_PLAN_OPTIM];
	*e = (hpu_plan_entry){.dtype = HPU_PLAN_FP32, .sharded = sharded, .copies = opt_floats};
	if (opt_floats)
		e->where = tier(o->offload_optimizer);

	e = &p->e[HPU_PLAN_ACTS];
	*e = (hpu_plan_entry){.where = HPU_PLAN_DEVICE, .copies = 1,
			      .dtype = o->precision == HPU_PREC_BF16_MIXED ||
						       o->precision == HPU_PREC_FP8
					       ? HPU_PLAN_BF16
					       : HPU_PLAN_FP32};
}

int hpu__plan_on_host(hpu_plan_where w)
{
	return w == HPU_PLAN_HOST || w == HPU_PLAN_NVME; /* NVMe: its buffers */
}

size_t hpu__plan_esize(const hpu_plan_entry *e)
{
	return e->dtype == HPU_PLAN_FP32 ? 4 : 2;
}

uint64_t hpu__plan_device_bytes(const hpu_plan *p, hpu_plan_state s, size_t total, size_t shard)
{
	const hpu_plan_entry *e = &p->e[s];
	if (e->where != HPU_PLAN_DEVICE || s == HPU_PLAN_ACTS)
		return 0;
	return (uint64_t)(e->sharded ? shard : total) * e->copies * hpu__plan_esize(e);
}

uint64_t hpu__plan_states_bytes(const hpu_plan *p, size_t total, size_t shard)
{
	uint64_t n = 0;
	for (int s = HPU_PLAN_PARAMS; s <= HPU_PLAN_OPTIM; s++)
		n += hpu__plan_device_bytes(p, (hpu_plan_state)s, total, shard);
	return n;
}

const char *hpu__plan_state_name(hpu_plan_state s)
{
	static const char *const n[] = {"parameters", "gradients", "master weights",
					"optimizer state", "activations"};
	return (unsigned)s < HPU_PLAN_NSTATES ? n[s] : "?";
}

const char *hpu__plan_where_name(hpu_plan_where w)
{
	static const char *const n[] = {"none", "device", "host", "nvme"};
	return (unsigned)w <= HPU_PLAN_NVME ? n[w] : "?";
}

const char *hpu__plan_dtype_name(hpu_plan_dtype d)
{
	static const char *const n[] = {"fp32", "bf16", "fp16"};
	return (unsigned)d <= HPU_PLAN_FP16 ? n[d] : "?";
}

const char *hpu__plan_coll_name(hpu_plan_coll c)
{
	static const char *const n[] = {
		"none",
		"all-reduce per bucket in backward",
		"one all-reduce after backward",
		"reduce-scatter after backward",
		"reduce-scatter per bucket in backward",
		"all-gather of the updated shard after the step",
		"all-gather of each layer before its forward and backward",
	};
	return (unsigned)c <= HPU_PLAN_ALL_GATHER_LAYER ? n[c] : "?";
}

void hpu__plan_describe(const hpu_plan *p, hpu_plan_state s, char *out, size_t outlen)
{
	const hpu_plan_entry *e = &p->e[s];
	if (e->where == HPU_PLAN_NOWHERE) {
		snprintf(out, outlen, "%s: not kept", hpu__plan_state_name(s));
		return;
	}
	char copies[32] = "";
	if (e->copies > 1)
		snprintf(copies, sizeof copies, " x%d", e->copies);
	snprintf(out, outlen, "%s: %s %s%s %s, %s", hpu__plan_state_name(s),
		 hpu__plan_where_name(e->where), hpu__plan_dtype_name(e->dtype), copies,
		 e->sharded ? "sharded" : "whole", hpu__plan_coll_name(e->coll));
}
