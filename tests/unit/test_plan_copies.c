/* Unit tests for the bytes a step copies between host and device as the
 * placement plan predicts them (worker/strategy/copies.c): the gradients'
 * all-reduce staged out and back where the host may not read device
 * memory, nothing of it where it runs on the device between the ranks of
 * one node (grads_direct: CUDA IPC), the rest of the step unchanged. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "options/config.h"
#include "worker/strategy/copies.h"
#include "worker/strategy/plan.h"

static const hpu_plan_unit units[] = {{.len = 1000}, {.len = 24}};

static hpu_plan_step step(int direct)
{
	return (hpu_plan_step){.units = units, .nunits = 2, .micro = 4, .accum = 2,
			       .sample_bytes = 16, .nloss = 1, .grads_direct = direct,
			       .eager = 1};
}

static void plan(hpu_plan *p, hpu_strategy k, hpu_comm_dtype comm)
{
	hpu_train_opts o;
	hpu__opts_defaults(&o);
	o.strategy = k;
	o.grad_comm_dtype = comm;
	hpu__plan_make(p, &o, 2, 2);
}

/* ddp and fast_ddp: 1,024 gradients out and back, 4 bytes each (2 as
 * bf16 copies), staged; none on the device path; batch and loss alike. */
static void test_all_reduce_staged_or_direct(void **state)
{
	(void)state;
	static const hpu_strategy kinds[] = {HPU_STRATEGY_DDP, HPU_STRATEGY_FAST_DDP};
	for (int k = 0; k < 2; k++)
		for (int c = 0; c < 2; c++) {
			hpu_plan p;
			plan(&p, kinds[k], c ? HPU_COMM_BF16 : HPU_COMM_FP32);
			uint64_t esz = c ? 2 : 4;
			hpu_plan_step st = step(0);
			hpu_plan_copies staged, direct;
			hpu__plan_copies(&p, &st, &staged);
			st = step(1);
			hpu__plan_copies(&p, &st, &direct);
			assert_true(staged.exact && direct.exact);
			assert_int_equal(staged.d2h[HPU_COPY_GRADS], 1024 * esz);
			assert_int_equal(staged.h2d[HPU_COPY_GRADS], 1024 * esz);
			assert_int_equal(direct.d2h[HPU_COPY_GRADS], 0);
			assert_int_equal(direct.h2d[HPU_COPY_GRADS], 0);
			assert_int_equal(direct.h2d[HPU_COPY_BATCH], 8 * 16);
			/* after each micro-step (eager) and after the step */
			assert_int_equal(direct.d2h[HPU_COPY_LOSS], 2 * 2 * 8);
			/* and the non-finite flag's all-reduce: 4 bytes staged */
			assert_int_equal(staged.h2d[HPU_COPY_STEP], 24 + 4);
			assert_int_equal(direct.h2d[HPU_COPY_STEP], 24);
			assert_int_equal(direct.h2d_total, staged.h2d_total - 1024 * esz - 4);
			assert_int_equal(direct.d2h_total, staged.d2h_total - 1024 * esz - 4);
		}
}

/* The step's scalars (strategy_vars.c): the learning rate and beta
 * powers in (24 bytes); the block
 * out after the step, and inside it where the host decides; the loss read
 * after each micro-step too when eager; the flag's all-reduce staged (and
 * the norm's, sharded with clipping); nothing of it at world 1. */
static void test_step_scalars(void **state)
{
	(void)state;
	hpu_plan p;
	plan(&p, HPU_STRATEGY_ZERO2, HPU_COMM_FP32);
	hpu_plan_step st = step(0);
	st.vars_bytes = 88;
	st.eager = 0;
	hpu_plan_copies c;
	hpu__plan_copies(&p, &st, &c); /* recordable, not clipping */
	assert_false(c.exact); /* the ops' deferred checks: as many as taken */
	assert_int_equal(c.h2d[HPU_COPY_STEP], 24 + 4);
	assert_int_equal(c.d2h[HPU_COPY_STEP], 88 + 4);
	assert_int_equal(c.d2h[HPU_COPY_LOSS], 2 * 8);
	st.eager = st.host_decides = 1;
	st.clip = st.sharded = 1;
	hpu__plan_copies(&p, &st, &c);
	assert_int_equal(c.h2d[HPU_COPY_STEP], 24 + 4 + 8);
	assert_int_equal(c.d2h[HPU_COPY_STEP], 2 * 88 + 4 + 8);
	assert_int_equal(c.d2h[HPU_COPY_LOSS], 2 * 2 * 8);
	st.grads_host = 1; /* the norm summed by the host, copied over */
	hpu__plan_copies(&p, &st, &c);
	assert_int_equal(c.h2d[HPU_COPY_STEP], 24 + 8 + 4 + 8);
	hpu_train_opts o;
	hpu__opts_defaults(&o);
	o.strategy = HPU_STRATEGY_ZERO2;
	hpu__plan_make(&p, &o, 1, 2); /* one rank: the all-reduces are the identity */
	st.grads_host = 0;
	hpu__plan_copies(&p, &st, &c);
	assert_int_equal(c.h2d[HPU_COPY_STEP], 24);
	assert_int_equal(c.d2h[HPU_COPY_STEP], 2 * 88);
}

/* Where the host reads device memory (cpu) nothing is staged either way. */
static void test_host_can_read(void **state)
{
	(void)state;
	hpu_plan p;
	plan(&p, HPU_STRATEGY_DDP, HPU_COMM_FP32);
	hpu_plan_step st = step(0);
	st.host_can_read = 1;
	hpu_plan_copies c;
	hpu__plan_copies(&p, &st, &c);
	assert_int_equal(c.h2d_total, 0);
	assert_int_equal(c.d2h_total, 0);
}

/* --device cpu --graphs (colls_in_place): the gradients' all-reduce and
 * ZeRO's all-gathers work on the device's memory in place; the batch,
 * the loss and the step's scalars are copied as on cpu-strict, less the
 * flag's staging. */
static void test_colls_in_place(void **state)
{
	(void)state;
	hpu_plan p;
	plan(&p, HPU_STRATEGY_DDP, HPU_COMM_FP32);
	hpu_plan_step st = step(0);
	hpu_plan_copies staged, inplace;
	hpu__plan_copies(&p, &st, &staged);
	st.colls_in_place = 1;
	hpu__plan_copies(&p, &st, &inplace);
	assert_int_equal(inplace.d2h[HPU_COPY_GRADS], 0);
	assert_int_equal(inplace.h2d[HPU_COPY_GRADS], 0);
	assert_int_equal(inplace.h2d[HPU_COPY_BATCH], staged.h2d[HPU_COPY_BATCH]);
	assert_int_equal(inplace.d2h[HPU_COPY_LOSS], staged.d2h[HPU_COPY_LOSS]);
	assert_int_equal(inplace.h2d[HPU_COPY_STEP], 24);
	assert_int_equal(inplace.h2d_total, staged.h2d_total - 1024 * 4 - 4);
	/* zero3: the all-gathers' pieces neither out nor back */
	plan(&p, HPU_STRATEGY_ZERO3, HPU_COMM_FP32);
	static const hpu_plan_unit z3[] = {{.len = 1000, .piece = 500, .gathers = 2},
					   {.len = 24, .piece = 12, .persistent = 1}};
	st = step(0);
	st.units = z3;
	hpu__plan_copies(&p, &st, &staged);
	assert_true(staged.h2d[HPU_COPY_PARAMS] > 0 && staged.d2h[HPU_COPY_PARAMS] > 0);
	st.colls_in_place = 1;
	hpu__plan_copies(&p, &st, &inplace);
	assert_int_equal(inplace.h2d[HPU_COPY_PARAMS], 0);
	assert_int_equal(inplace.d2h[HPU_COPY_PARAMS], 0);
	assert_int_equal(inplace.h2d[HPU_COPY_GRADS], 0);
	/* clipping sharded gradients: the norm's all-reduce in place too */
	st.clip = st.sharded = 1;
	hpu__plan_copies(&p, &st, &inplace);
	assert_int_equal(inplace.h2d[HPU_COPY_STEP], 24);
	st.colls_in_place = 0;
	hpu__plan_copies(&p, &st, &staged);
	assert_int_equal(staged.h2d[HPU_COPY_STEP], 24 + 4 + 8);
	/* the parameters' shard in the host tier (--offload-param cpu): its
	 * own piece moved by libhpucoll's all-gather, not copied in */
	hpu_train_opts o;
	hpu__opts_defaults(&o);
	o.strategy = HPU_STRATEGY_ZERO3;
	o.offload_param = HPU_OFFLOAD_CPU;
	o.offload_optimizer = HPU_OFFLOAD_CPU;
	hpu__plan_make(&p, &o, 2, 2);
	st.clip = st.sharded = 0;
	hpu__plan_copies(&p, &st, &staged);
	assert_true(staged.h2d[HPU_COPY_PARAMS] > 0);
	st.colls_in_place = 1;
	hpu__plan_copies(&p, &st, &inplace);
	assert_int_equal(inplace.h2d[HPU_COPY_PARAMS], 0);
	assert_int_equal(inplace.d2h[HPU_COPY_PARAMS], 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_all_reduce_staged_or_direct),
		cmocka_unit_test(test_step_scalars),
		cmocka_unit_test(test_host_can_read),
		cmocka_unit_test(test_colls_in_place),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
