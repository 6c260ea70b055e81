/* step_testlib: what the tests of the step's decisions on the device
 * (hpu__dev_rtops' step_begin and step_end, device.h's hpu__dev_stepvars)
 * share: a few step configurations (fp32, clipping, bf16-mixed, 16-mixed
 * with a dynamic scaler, its floor, a static scale), a script of steps
 * with overflows (runs of them, for the hysteresis) and norms on either
 * side of the clip, and a reference written from the host code the ops
 * replace (strategy_mp.c's hpu__mp_step and update_scale, strategy.c's
 * fp32 step, optim.c's clip factor). Plain C: test_devops, test_cuda_elem
 * and test_cuda_device link it. */
#ifndef HPU_STEP_TESTLIB_H
#define HPU_STEP_TESTLIB_H

#include <stddef.h>

#include "worker/device/device.h"

#define STEP_NCFG 6    /* configurations */
#define STEP_NSTEPS 24 /* steps of the script */

extern const hpu__dev_stepcfg step_cfgs[STEP_NCFG];
extern const char *const step_cfg_names[STEP_NCFG];

/* The block as a strategy sets it up for c (strategy.c: hyst_left =
 * hysteresis, last_overflow = -1; 16-mixed's scale 65536, or 128 where
 * static), every other field 0 but lr. */
void step_init(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);

/* What the checks and the norm leave in bad and sumsq at step i of the
 * script: an overflow at steps 0-2 (16-mixed's first scale is too big),
 * 9, 10 and 17 (Inf or NaN in sumsq then), else a sum of squares of
 * gradients that carry the loss scale, whose norm is on either side of
 * the clip norm. */
void step_inputs(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c, int i);

/* The reference: what the host did before and after the update. */
void step_ref_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);
void step_ref_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c);

/* 0 where every field of a and b holds the same bits; else 1 and the
 * first field that differs, with both values, in what. */
int step_diff(const hpu__dev_stepvars *a, const hpu__dev_stepvars *b,
              char *what, size_t len);

#endif
