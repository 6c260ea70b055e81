/* backend: which backend the ops use, and the reference table (every case
 * unsupported, so that the ops run the kernels of ops_ref.h). */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/ops/backend.h"
#include "common/env.h"
#include "common/log.h"

const hpu__backend *hpu__dnnl_backend(void);

/* ---- the reference table: every case unsupported ---- */

static const char *ref_describe(void)
{
	return "reference kernels (plain C and OpenBLAS sgemm, fp32)";
}
static int ref_zero(void)
{
	return 0;
}
static void ref_threads(int n)
{
	(void)n;
}
static int ref_gemm(const hpu__gemm *g)
{
	(void)g;
	return HPU_BE_UNSUPPORTED;
}
#define REF_NONE(name, ...)                                                            \
	static int name(__VA_ARGS__)                                                   \
	{                                                                              \
		return HPU_BE_UNSUPPORTED;                                             \
	}
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-parameter"
REF_NONE(ref_conv_fwd, const hpu_conv2d_shape *s, hpu__dtype dt, const void *x, const void *w,
	 const float *b, float *y)
REF_NONE(ref_conv_bwd_data, const hpu_conv2d_shape *s, hpu__dtype dt, const void *w,
	 const void *dy, float *dx)
REF_NONE(ref_conv_bwd_weights, const hpu_conv2d_shape *s, hpu__dtype dt, const void *x,
	 const void *dy, float *dw, float *db)
REF_NONE(ref_maxpool_fwd, const float *x, float *y, int32_t *idx, int batch, int ch, int h,
	 int w, int k, int stride)
REF_NONE(ref_maxpool_bwd, const float *dy, const int32_t *idx, float *dx, int batch, int ch,
	 int h, int w, int k, int stride)
REF_NONE(ref_avgpool_fwd, const float *x, float *y, int batch, int ch, int h, int w, int k,
	 int stride)
REF_NONE(ref_avgpool_bwd, const float *dy, float *dx, int batch, int ch, int h, int w, int k,
	 int stride)
REF_NONE(ref_eltwise_fwd, hpu__eltwise op, const float *x, float *y, size_t n)
REF_NONE(ref_eltwise_bwd, hpu__eltwise op, const float *at, const float *dy, float *dx,
	 size_t n)
REF_NONE(ref_softmax_fwd, const float *x, float *y, int rows, int cols)
REF_NONE(ref_softmax_bwd, const float *y, const float *dy, float *dx, int rows, int cols)
REF_NONE(ref_layernorm_fwd, const float *x, const float *gamma, const float *beta, float *y,
	 float *mean, float *rstd, int rows, int cols, float eps)
REF_NONE(ref_layernorm_bwd, const float *x, const float *gamma, const float *mean,
	 const float *rstd, const float *dy, float *dx, float *dgamma, float *dbeta, int rows,
	 int cols)
#pragma GCC diagnostic pop

static const hpu__backend ref_backend = {
	.name = "reference",
	.describe = ref_describe,
	.bf16_native = ref_zero,
	.set_threads = ref_threads,
	.gemm = ref_gemm,
	.conv_fwd = ref_conv_fwd,
	.conv_bwd_data = ref_conv_bwd_data,
	.conv_bwd_weights = ref_conv_bwd_weights,
	.maxpool_fwd = ref_maxpool_fwd,
	.maxpool_bwd = ref_maxpool_bwd,
	.avgpool_fwd = ref_avgpool_fwd,
	.avgpool_bwd = ref_avgpool_bwd,
	.eltwise_fwd = ref_eltwise_fwd,
	.eltwise_bwd = ref_eltwise_bwd,
	.softmax_fwd = ref_softmax_fwd,
	.softmax_bwd = ref_softmax_bwd,
	.layernorm_fwd = ref_layernorm_fwd,
	.layernorm_bwd = ref_layernorm_bwd,
};

static const hpu__backend *current;

/* HPU_BACKEND=reference runs the reference kernels (for comparisons);
 * unset or "onednn": oneDNN. */
const hpu__backend *hpu__be(void)
{
	if (!current) {
		const char *e = hpu__env_str(HPU_ENV_HPU_BACKEND);
		current = e && strcmp(e, "reference") == 0 ? &ref_backend : hpu__dnnl_backend();
	}
	return current;
}

void hpu__be_set(const hpu__backend *be)
{
	current = be;
}

const hpu__backend *hpu__be_reference(void)
{
	return &ref_backend;
}

int hpu__be_on_host(void)
{
	const hpu__backend *be = hpu__be();
	return be == &ref_backend || be == hpu__dnnl_backend();
}

/* ---- an entry's refusal on a table that is not the host's ---- */

static const hpu__be_dev_hooks *dev_hooks;

void hpu__be_set_dev_hooks(const hpu__be_dev_hooks *h)
{
	dev_hooks = h;
}

static const char *dev_name(void)
{
	const char *n = dev_hooks && dev_hooks->name ? dev_hooks->name() : NULL;
	return n ? n : hpu__be()->name;
}

/* 1 where the calling thread records: the recording refused with
 * "OP: ... (DETAIL)" (unless it was already). */
static int recording_refuses(const char *op, const char *detail)
{
	if (!dev_hooks || !dev_hooks->refuse)
		return 0;
	char why[384];
	snprintf(why, sizeof why, "%s: the kernel table of device %s refused it while recording (%s)",
		 op, dev_name(), detail);
	return dev_hooks->refuse(why);
}

int hpu__be_refused(const char *op, const char *fmt, ...)
{
	if (hpu__be_on_host() || !dev_hooks || !dev_hooks->host_can_read ||
	    dev_hooks->host_can_read())
		return 0;
	char detail[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(detail, sizeof detail, fmt, ap);
	va_end(ap);
	if (recording_refuses(op, detail))
		return 1;
	/* the op cannot go on: its C loops would touch device memory, and
	 * most ops have no error to return */
	/* the reference backend's products are C loops: no kernel on a
	 * device whose memory only kernels may touch (cpu-strict under
	 * --graphs or HPU_STRICT_KERNELS=1, where it trains without them) */
	const char *be = hpu__env_str(HPU_ENV_HPU_BACKEND);
	hpu__log(HPU_LOG_ERROR, "the device %s has no kernel for %s (%s)%s", dev_name(), op, detail,
		 be && !strcmp(be, "reference") && !strcmp(dev_name(), "cpu-strict")
			 ? ": HPU_BACKEND=reference has C loops, not kernels, for it, and only "
			   "kernels may touch this device's memory here (--graphs or "
			   "HPU_STRICT_KERNELS=1); leave HPU_BACKEND unset for onednn's"
			 : "");
	fflush(NULL); /* what the run printed before it (verbose lines, figures) */
	_exit(1);
}

int hpu__be_recording_refuse(const char *why)
{
	return dev_hooks && dev_hooks->refuse ? dev_hooks->refuse(why) : 0;
}

int hpu__be_answer(const char *entry, int rc)
{
	if (rc == HPU_BE_UNSUPPORTED && !hpu__be_on_host() &&
	    recording_refuses(entry, "its entry answered HPU_BE_UNSUPPORTED"))
		return HPU_BE_OK;
	return rc;
}
