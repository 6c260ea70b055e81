/* step_testlib: see step_testlib.h. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/unit/step_testlib.h"

const hpu__dev_stepcfg step_cfgs[STEP_NCFG] = {
    {.window = 1000, .hysteresis = 2, .min_scale = 1},
    {.clip_norm = 1.0, .window = 1000, .hysteresis = 2, .min_scale = 1},
    {.clip_norm = 1.0,
     .mixed = 1,
     .window = 1000,
     .hysteresis = 2,
     .min_scale = 1},
    {.clip_norm = 1.0,
     .mixed = 1,
     .fp16 = 1,
     .dynamic = 1,
     .hysteresis = 2,
     .window = 3,
     .min_scale = 1},
    {.mixed = 1,
     .fp16 = 1,
     .dynamic = 1,
     .hysteresis = 1,
     .window = 2,
     .min_scale = 16384},
    {.clip_norm = 0.5,
     .mixed = 1,
     .fp16 = 1,
     .hysteresis = 2,
     .window = 1000,
     .min_scale = 1},
};

const char *const step_cfg_names[STEP_NCFG] = {
    "fp32",
    "fp32, clip 1",
    "bf16-mixed, clip 1",
    "16-mixed dynamic (hysteresis 2, window 3), clip 1",
    "16-mixed dynamic (hysteresis 1, window 2), floor 16384",
    "16-mixed static scale 128, clip 0.5",
};

void step_init(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	memset(sv, 0, sizeof *sv);
	sv->lr = 0.01;
	sv->gscale = 1.0f;
	sv->loss_scale = !c->fp16 ? 1.0 : c->dynamic ? 65536.0 : 128.0;
	sv->hyst_left = c->hysteresis;
	sv->last_overflow = -1;
}

static int overflows(int i)
{
	return i <= 2 || i == 9 || i == 10 || i == 17;
}

void step_inputs(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c, int i)
{
	if ((i <= 2 && !c->fp16) || !overflows(i)) {
		/* norms 0.3 .. 2.03 (unscaled), not squares of round numbers */
		double norm = 0.3 + 0.173 * (double)((i * 37) % 11);
		double scaled = norm * (c->fp16 ? sv->loss_scale : 1.0);
		sv->bad = 0;
		sv->sumsq = scaled * scaled * (1.0 + 1e-7 * i);
		return;
	}
	sv->bad = 1;
	sv->sumsq = i % 2 ? (double)INFINITY : (double)NAN;
}

/* optim.c's factor as torch computes it: max_norm * (1 / (norm + 1e-6))
 * in fp32, at most 1. */
static float ref_clip(double norm, double max_norm)
{
	float total = (float)norm;
	float recip = 1.0f / (total + (float)1e-6);
	float coef = recip * (float)max_norm;
	return coef > 1.0f ? 1.0f : coef; /* NaN stays NaN, as torch's clamp */
}

void step_ref_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	int skipped = sv->bad > 0; /* an overflow anywhere skips the step */
	sv->skip = skipped;
	sv->norm = 0;
	if (skipped)
		return;
	sv->t += 1; /* hpu__optim_begin */
	float gscale = 1.0f;
	if (c->mixed)
		gscale = (float)(1.0 / sv->loss_scale); /* 1 but for 16-mixed */
	if (c->clip_norm > 0) {
		double norm = sqrt(sv->sumsq);
		if (c->mixed)
			norm /= sv->loss_scale;
		sv->norm = norm;
		gscale *= ref_clip(norm, c->clip_norm);
	}
	sv->gscale = gscale;
}

void step_ref_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	if (c->mixed) { /* update_scale, then hpu__mp_step's count */
		int overflow = sv->skip;
		if (c->fp16 && c->dynamic) {
			if (overflow) {
				if (c->hysteresis == 1 || sv->hyst_left == 1) {
					double half = sv->loss_scale / 2;
					sv->loss_scale = half > c->min_scale
					                     ? half
					                     : c->min_scale;
				} else {
					sv->hyst_left -= 1;
				}
				sv->last_overflow = sv->step_no;
			} else if ((sv->step_no - sv->last_overflow) %
			               c->window ==
			           0) {
				sv->hyst_left = c->hysteresis;
				sv->loss_scale *= 2;
			}
		}
		sv->step_no += 1;
		if (overflow)
			sv->skipped += 1;
	}
	sv->bad = 0;
	sv->sumsq = 0;
}

#define FIELD(f, fmt)                                                          \
	do {                                                                   \
		if (memcmp(&a->f, &b->f, sizeof a->f)) {                       \
			snprintf(what, len, "%s: " fmt " and " fmt, #f, a->f,  \
			         b->f);                                        \
			return 1;                                              \
		}                                                              \
	} while (0)

int step_diff(const hpu__dev_stepvars *a, const hpu__dev_stepvars *b,
              char *what, size_t len)
{
	FIELD(lr, "%.17g");
	FIELD(sumsq, "%.17g");
	FIELD(norm, "%.17g");
	FIELD(bad, "%.9g");
	FIELD(gscale, "%.9g");
	FIELD(skip, "%d");
	FIELD(t, "%ld");
	FIELD(loss_scale, "%.17g");
	FIELD(step_no, "%ld");
	FIELD(last_overflow, "%ld");
	FIELD(hyst_left, "%d");
	FIELD(skipped, "%ld");
	what[0] = '\0';
	return 0;
}
