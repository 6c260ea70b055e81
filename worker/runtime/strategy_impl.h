/* strategy_impl: the strategy's state, shared by strategy.c and
 * strat_ckpt.c (its checkpoints). Not for other users. */
#ifndef HPU_STRATEGY_IMPL_H
#define HPU_STRATEGY_IMPL_H

#include <hpu/coll.h>
#include <stdint.h>

#include "ckpt.h"
#include "model.h"
#include "optim.h"
#include "strategy.h"

/* A unit is a run of consecutive layers whose parameters are communicated
 * together: a DDP or ZeRO-2 gradient bucket, a ZeRO-1 partition unit, one
 * layer under ZeRO-3, everything under fast_ddp. In the strategy's layout a
 * unit is the floats [off, off + len); under ZeRO, len is padded to a
 * multiple of 16 * world and rank r owns the piece [off + r*piece, off +
 * (r+1)*piece), found at shard_off in the shard buffers. */
typedef struct unit {
	int first, last;     /* layers */
	int nparam_layers;
	int pending;         /* of those, the ones whose backward is still due */
	size_t off, len, piece, shard_off;
	int persistent;      /* zero3: small enough to stay whole */
	float *full;         /* zero3: gathered (or persistent) parameters */
	hpucoll_req *gather; /* zero3: the gather of `full` in flight */
	float *gbuf;         /* zero2/3: the unit's gradients in backward */
	uint16_t *cbuf;      /* bf16 staging of a gradient all-reduce */
	hpu_optim opt;
	float *opt_p, *opt_g; /* what the optimizer updates, opt.n floats */
	/* mixed precision */
	float *cp;           /* the fp32 compute copy of the parameters */
	float *gs;           /* fp32 gradients while the unit's backward runs */
	uint16_t *full16;    /* zero3: gathered (or persistent) 16-bit params */
	uint16_t *gbuf16;    /* zero2/3: the 16-bit bucket being reduced */
	uint16_t *opt_p16, *opt_g16; /* the 16-bit working copy / gradients
				      * of the optimizer's range */
} unit;

/* A gradient collective in flight; they complete in issue order. */
typedef struct flight {
	int unit;
	hpucoll_req *req;
} flight;

struct hpu_strat {
	hpu_builder *b;
	hpucoll_comm *comm;
	const hpu_train_opts *o;
	hpu_strategy kind;
	int rank, world, sharded, nlayers;
	unit *u;
	int nunits;
	size_t total, shard_total;
	float *P, *G;      /* whole parameters / gradients, where kept */
	float *PS, *GS;    /* parameter shard (zero3) / gradient shard (zero2/3) */
	float *state;      /* optimizer state */
	int maxbatch;
	size_t maxw;
	float **acts;      /* acts[i]: layer i's output, or NULL when dropped */
	char *transient;   /* layer i's output is dropped after layer i+1 reads it */
	float *dbuf[2];    /* activation gradients, ping-pong */
	const float *x;    /* the batch of the last forward */
	flight *q;         /* FIFO of gradient collectives */
	int qhead, qn;
	int micro;         /* the micro-step in backward */
	float **lcp, **lgs; /* mixed: per layer, fp32 parameters / gradients */
	const uint16_t **l16; /* mixed: per layer, the 16-bit parameters lcp
			       * was made from (valid while lcp is) */
	int act16;            /* bf16-mixed, fp8: outputs kept in bf16 */
	uint16_t **a16;       /* act16: per layer, the bf16 output (or NULL) */
	uint16_t **own16;     /* zero3 mixed: the gathered 16-bit unit a
			       * layer holds while it runs */
	int injected;      /* --inject-overflow-step done this step */
	size_t live;       /* zero3: gathered floats alive (not persistent) */
	/* Mixed precision: 16-bit working parameters and gradients (whole or
	 * shards, as the fp32 ones otherwise), fp32 master weights in the
	 * optimizer's space, 16-bit traffic. */
	int mp, fp16;
	hpucoll_dtype dt16;
	uint16_t *P16, *G16, *PS16, *GS16;
	float *M;          /* master weights */
	float *chunk;      /* gradients converted for the optimizer */
	double scale;      /* the loss scale (1 unless 16-mixed) */
	int hyst_left;     /* overflows left before the scale halves */
	long step_no, last_overflow, skipped;
	char *err;
	size_t errlen;
	int load_fd;             /* --load-params, or -1 */
	hpu_ckpt *resume;        /* --resume: the checkpoint to start from */
	uint64_t *canon;         /* checkpoints: parameter i's first float in
				  * the canonical space (ckpt.h) */
};

/* A sentence into s->err; returns -1. */
int hpu__strat_fail(hpu_strat *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- strat_act.c: the layers' outputs (acts[], a16[]) ---- */

/* Layer i's fp32 output buffer exists (made if not). 0, or -1 (s->err). */
int hpu__act_ensure(hpu_strat *s, int i);
/* Frees layer i's output, both forms. */
void hpu__act_drop(hpu_strat *s, int i);
/* Layer i's output is kept (fp32 or bf16). */
int hpu__act_kept(const hpu_strat *s, int i);
/* act16: keeps layer i's output (n rows) in bf16 where it is exact,
 * freeing the fp32 one. 0, or -1 (s->err). */
int hpu__act_compress(hpu_strat *s, int i, int n);
/* act16: layer i's output as fp32 again (for backward). 0, or -1. */
int hpu__act_expand(hpu_strat *s, int i, int n);
/* act16, after layer i's backward: frees its fp32 output if a bf16 one
 * is kept. */
void hpu__act_release(hpu_strat *s, int i);

/* ---- strat_ckpt.c, for strategy.c ---- */

/* Floats [from, from + n) of the strategy's layout (within one unit) of
 * checkpoint section `section` into dst[n]; padding gets zeros. */
int hpu__strat_read_layout(hpu_strat *s, int section, size_t from, size_t n, float *dst);

/* After the parameters: the optimizer state and counters from s->resume. */
int hpu__strat_resume_state(hpu_strat *s);

#endif
