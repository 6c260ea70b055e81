/* device_rt: the runtime's ops (device.h's hpu__dev_to16 ...): each one
 * device call of the device's hpu__dev_rtops, or a node in the CPU's list
 * while this thread records. */
#include "worker/device/device.h"
#include "worker/device/device_impl.h"

#include <stddef.h>
#include <stdint.h>

/* ---- the runtime's ops: each one device call ---- */

const hpu__dev_rtops *hpu__dev_host_rt(void)
{
	return &hpu__dev_cpu_rtops;
}

#define ON_DEVICE2(op, a, b)                                                           \
	do {                                                                           \
		hpu__dev_on_device(op, a);                                             \
		hpu__dev_on_device(op, b);                                             \
	} while (0)

/* The ops that leave their results in device memory: recorded as a node
 * where this thread records into the CPU's list (the host structs they
 * point at copied: hpu__dev_optim, hpu__dev_stepcfg), else one device
 * call. */
#define RT_ARG(x) node_->x
#define RT_PIN(x) _Generic((node_->x), RT_PINS)(&node_->x);
#define RT_DEF(name, params, args)                                                     \
	struct rt_##name {                                                             \
		KL_FE(KL_FIELD, KL_UNPAREN params)                                     \
	};                                                                             \
	static int rr_##name(const void *p)                                            \
	{                                                                              \
		const struct rt_##name *node_ = p;                                     \
		hpu__dev_call_open();                                                  \
		hpu__dev_cur->rt->name(KL_FC(RT_ARG, KL_UNPAREN args));                \
		hpu__dev_call_close();                                                 \
		return 0;                                                              \
	}                                                                              \
	static void rec_##name params                                                  \
	{                                                                              \
		struct rt_##name *node_ = hpu__dev_rec_node("hpu__dev_" #name, rr_##name, \
							sizeof *node_);                \
		if (!node_)                                                            \
			return;                                                        \
		*node_ = (struct rt_##name){KL_UNPAREN args};                          \
		KL_FE(RT_PIN, KL_UNPAREN args)                                         \
	}

static void pin_scalar(const void *field)
{
	(void)field;
}

static void pin_optim(const hpu__dev_optim **k)
{
	*k = hpu__dev_rec_keep(*k, sizeof **k);
}

static void pin_stepcfg(const hpu__dev_stepcfg **c)
{
	*c = hpu__dev_rec_keep(*c, sizeof **c);
}

#define RT_PINS                                                                        \
	const hpu__dev_optim *: pin_optim, const hpu__dev_stepcfg *: pin_stepcfg,      \
	default: pin_scalar

RT_DEF(to16, (int fp16, uint16_t *dst, const float *src, size_t n), (fp16, dst, src, n))
RT_DEF(from16, (int fp16, float *dst, const uint16_t *src, size_t n), (fp16, dst, src, n))
RT_DEF(acc16, (int fp16, uint16_t *dst, const float *src, size_t n), (fp16, dst, src, n))
RT_DEF(bf16_expand, (float *dst, const uint16_t *src, size_t n), (dst, src, n))
RT_DEF(add, (float *dst, const float *src, size_t n), (dst, src, n))
RT_DEF(add_scalar, (float *dst, float v, size_t n), (dst, v, n))
RT_DEF(sum, (double *out, const float *v, size_t n), (out, v, n))
RT_DEF(flag_nonfinite, (float *flag, const float *g, size_t n), (flag, g, n))
RT_DEF(flag_nonfinite16, (float *flag, int fp16, const uint16_t *g, size_t n),
       (flag, fp16, g, n))
RT_DEF(sumsq_add, (double *acc, const float *g, size_t n), (acc, g, n))
RT_DEF(sumsq16_add,
       (double *acc, int fp16, const uint16_t *g, size_t n, float *scratch, size_t chunk),
       (acc, fp16, g, n, scratch, chunk))
RT_DEF(loss_seed,
       (float *g, size_t n, const double *sums, int nsums, float weight, float base, int batch,
	hpu__dev_stepvars *sv),
       (g, n, sums, nsums, weight, base, batch, sv))
RT_DEF(step_begin, (hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c), (sv, c))
RT_DEF(step_end, (hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c), (sv, c))
RT_DEF(rows_add, (double *acc, const float *v, size_t n, const int *rows), (acc, v, n, rows))
RT_DEF(loss_add, (double *acc, const double *sums, const double *w, int nloss, const int *rows),
       (acc, sums, w, nloss, rows))
RT_DEF(optim,
       (const hpu__dev_optim *k, float *p, const float *g, float *m, float *v, size_t n),
       (k, p, g, m, v, n))
RT_DEF(optim16,
       (const hpu__dev_optim *k, int fp16, float *p, const uint16_t *g16, uint16_t *p16,
	float *m, float *v, size_t n, float *scratch, size_t chunk),
       (k, fp16, p, g16, p16, m, v, n, scratch, chunk))

#define RT_CALL(name, args)                                                            \
	do {                                                                           \
		hpu__dev_rec_foreign("hpu__dev_" #name);                               \
		if (hpu__dev_rec_listing()) {                                          \
			rec_##name args;                                               \
			break;                                                         \
		}                                                                      \
		hpu__dev_call_open();                                                  \
		hpu__dev_cur->rt->name args;                                           \
		hpu__dev_call_close();                                                 \
	} while (0)
/* A value back to the host: no recording can hold one (refused, 0). */
#define RT_VALUE(type, name, args)                                                     \
	do {                                                                           \
		hpu__dev_rec_foreign("hpu__dev_" #name);                               \
		if (hpu__dev_capturing()) {                                            \
			hpu__dev_capture_refuse("hpu__dev_" #name                      \
						": an op that returns a value to the host"); \
			return 0;                                                      \
		}                                                                      \
		hpu__dev_waited();                                                     \
		hpu__dev_call_open();                                                  \
		type r_ = hpu__dev_cur->rt->name args;                                 \
		hpu__dev_call_close();                                                 \
		return r_;                                                             \
	} while (0)

void hpu__dev_to16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	ON_DEVICE2("to16", dst, src);
	RT_CALL(to16, (fp16, dst, src, n));
}

void hpu__dev_from16(int fp16, float *dst, const uint16_t *src, size_t n)
{
	ON_DEVICE2("from16", dst, src);
	RT_CALL(from16, (fp16, dst, src, n));
}

void hpu__dev_acc16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	ON_DEVICE2("acc16", dst, src);
	RT_CALL(acc16, (fp16, dst, src, n));
}

int hpu__dev_bf16_exact(uint16_t *dst, const float *x, size_t n)
{
	hpu__dev_step_value("hpu__dev_bf16_exact", x);
	ON_DEVICE2("bf16_exact", dst, x);
	RT_VALUE(int, bf16_exact, (dst, x, n));
}

void hpu__dev_bf16_expand(float *dst, const uint16_t *src, size_t n)
{
	ON_DEVICE2("bf16_expand", dst, src);
	RT_CALL(bf16_expand, (dst, src, n));
}

void hpu__dev_add(float *dst, const float *src, size_t n)
{
	ON_DEVICE2("add", dst, src);
	RT_CALL(add, (dst, src, n));
}

void hpu__dev_add_scalar(float *dst, float v, size_t n)
{
	hpu__dev_on_device("add_scalar", dst);
	RT_CALL(add_scalar, (dst, v, n));
}

double hpu__dev_sumsq(const float *g, size_t n)
{
	hpu__dev_step_value("hpu__dev_sumsq", g);
	hpu__dev_on_device("sumsq", g);
	RT_VALUE(double, sumsq, (g, n));
}

double hpu__dev_sumsq16(double acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			size_t chunk)
{
	hpu__dev_step_value("hpu__dev_sumsq16", g);
	ON_DEVICE2("sumsq16", g, scratch);
	RT_VALUE(double, sumsq16, (acc, fp16, g, n, scratch, chunk));
}

void hpu__dev_sum(double *out, const float *v, size_t n)
{
	ON_DEVICE2("sum", out, v);
	RT_CALL(sum, (out, v, n));
}

int hpu__dev_nonfinite(const float *g, size_t n)
{
	hpu__dev_step_value("hpu__dev_nonfinite", g);
	hpu__dev_on_device("nonfinite", g);
	RT_VALUE(int, nonfinite, (g, n));
}

int hpu__dev_nonfinite16(int fp16, const uint16_t *g, size_t n)
{
	hpu__dev_step_value("hpu__dev_nonfinite16", g);
	hpu__dev_on_device("nonfinite16", g);
	RT_VALUE(int, nonfinite16, (fp16, g, n));
}

long hpu__dev_count_nonfinite(const float *v, size_t n)
{
	hpu__dev_step_value("hpu__dev_count_nonfinite", v);
	hpu__dev_on_device("count_nonfinite", v);
	RT_VALUE(long, count_nonfinite, (v, n));
}

long hpu__dev_count_nonfinite16(const uint16_t *v, size_t n)
{
	hpu__dev_step_value("hpu__dev_count_nonfinite16", v);
	hpu__dev_on_device("count_nonfinite16", v);
	RT_VALUE(long, count_nonfinite16, (v, n));
}

void hpu__dev_flag_nonfinite(float *flag, const float *g, size_t n)
{
	ON_DEVICE2("flag_nonfinite", flag, g);
	RT_CALL(flag_nonfinite, (flag, g, n));
}

void hpu__dev_flag_nonfinite16(float *flag, int fp16, const uint16_t *g, size_t n)
{
	ON_DEVICE2("flag_nonfinite16", flag, g);
	RT_CALL(flag_nonfinite16, (flag, fp16, g, n));
}

void hpu__dev_sumsq_add(double *acc, const float *g, size_t n)
{
	ON_DEVICE2("sumsq_add", acc, g);
	RT_CALL(sumsq_add, (acc, g, n));
}

void hpu__dev_sumsq16_add(double *acc, int fp16, const uint16_t *g, size_t n, float *scratch,
			  size_t chunk)
{
	ON_DEVICE2("sumsq16_add", acc, g);
	hpu__dev_on_device("sumsq16_add", scratch);
	RT_CALL(sumsq16_add, (acc, fp16, g, n, scratch, chunk));
}

void hpu__dev_loss_seed(float *g, size_t n, const double *sums, int nsums, float weight,
			float base, int batch, hpu__dev_stepvars *sv)
{
	ON_DEVICE2("loss_seed", g, sums);
	hpu__dev_on_device("loss_seed", sv);
	RT_CALL(loss_seed, (g, n, sums, nsums, weight, base, batch, sv));
}

void hpu__dev_step_begin(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	hpu__dev_on_device("step_begin", sv);
	RT_CALL(step_begin, (sv, c));
}

void hpu__dev_step_end(hpu__dev_stepvars *sv, const hpu__dev_stepcfg *c)
{
	hpu__dev_on_device("step_end", sv);
	RT_CALL(step_end, (sv, c));
}

void hpu__dev_rows_add(double *acc, const float *v, size_t n, const int *rows)
{
	ON_DEVICE2("rows_add", acc, v);
	hpu__dev_on_device("rows_add", rows);
	RT_CALL(rows_add, (acc, v, n, rows));
}

void hpu__dev_loss_add(double *acc, const double *sums, const double *w, int nloss,
		       const int *rows)
{
	ON_DEVICE2("loss_add", acc, sums);
	ON_DEVICE2("loss_add", w, rows);
	RT_CALL(loss_add, (acc, sums, w, nloss, rows));
}

void hpu__dev_optim_update(const hpu__dev_optim *k, float *p, const float *g, float *m,
			   float *v, size_t n)
{
	ON_DEVICE2("optim", p, g);
	ON_DEVICE2("optim", m, v);
	RT_CALL(optim, (k, p, g, m, v, n));
}

void hpu__dev_optim_update16(const hpu__dev_optim *k, int fp16, float *p, const uint16_t *g16,
			     uint16_t *p16, float *m, float *v, size_t n, float *scratch,
			     size_t chunk)
{
	ON_DEVICE2("optim16", p, g16);
	ON_DEVICE2("optim16", p16, scratch);
	ON_DEVICE2("optim16", m, v);
	RT_CALL(optim16, (k, fp16, p, g16, p16, m, v, n, scratch, chunk));
}
