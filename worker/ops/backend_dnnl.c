/* backend_dnnl: the oneDNN backend's table (backend.h), which names the
 * kernels of backend_dnnl_gemm.c, _conv.c and _nn.c (and backend_vec.c's
 * loops), and picks which ops oneDNN takes. It stands above those files and their base
 * (backend_dnnl_core.c); none of them calls back into it.
 */
#include <stddef.h>
#include <stdint.h>

#include "worker/ops/backend_dnnl.h"
#include "worker/ops/backend_vec.h"

/* ---- the table ---- */

/* Eltwise: oneDNN's where it is faster than the reference loops, measured
 * single-threaded here (avx512_core_bf16; backward at ~25 GB/s against
 * the loops' ~80): forward of tanh (0.02x the time of the loop's scalar
 * tanhf) and ReLU (0.94x). Backward of ReLU and tanh takes 2.4-3.6x the
 * loops' time, GELU 1.3-2x in both directions (and its 0.5 x (1 + tanh)
 * form loses relative accuracy for x < -3): those run the reference
 * (ReLU's backward and GELU both ways backend_vec.c's loops, the
 * reference's bits; below).
 * hpu__dnnl_eltwise_fwd/bwd do every op. */
static int pick_eltwise_fwd(hpu__eltwise op, const float *x, float *y, size_t n)
{
	if (op == HPU_ELT_GELU_TANH)
		return hpu__vec_gelu_fwd(x, y, n);
	return hpu__dnnl_eltwise_fwd(op, x, y, n);
}

/* Pooling: oneDNN's pooling on NCHW measured 2-3x slower than the
 * reference loops on the CNN's 2x2 windows (backend_dnnl_conv.c has the
 * figures), so average pooling answers unsupported and the ops run the
 * reference. Max pooling (whose idx is not oneDNN's workspace of u8
 * window offsets either) runs backend_vec.c's AVX-512 loops on 2x2
 * windows of stride 2 (the reference's bits, 1.2x its speed forward,
 * 1.7x backward), the reference on others. */
static int no_avgpool(const float *in, float *out, int batch, int ch, int h, int w, int k,
		      int stride)
{
	(void)in, (void)out, (void)batch, (void)ch, (void)h, (void)w, (void)k, (void)stride;
	return HPU_BE_UNSUPPORTED;
}

/* ReLU backward: backend_vec.c's loop (streaming stores on large arrays:
 * 1.4x the reference loop's speed at the CNN's 25 MB); GELU's too. */
static int pick_eltwise_bwd(hpu__eltwise op, const float *at, const float *dy, float *dx,
			    size_t n)
{
	if (op == HPU_ELT_GELU_TANH)
		return hpu__vec_gelu_bwd(at, dy, dx, n);
	if (op != HPU_ELT_RELU)
		return HPU_BE_UNSUPPORTED;
	return hpu__vec_relu_bwd(at, dy, dx, n);
}

static const hpu__backend dnnl_backend = {
	.name = "oneDNN",
	.describe = hpu__dnnl_describe,
	.bf16_native = hpu__dnnl_bf16_native,
	.set_threads = hpu__dnnl_set_threads,
	.gemm = hpu__dnnl_gemm,
	.gemm_c16 = 1,
	.conv_fwd = hpu__dnnl_conv_fwd,
	.conv_bwd_data = hpu__dnnl_conv_bwd_data,
	.conv_bwd_weights = hpu__dnnl_conv_bwd_weights,
	.conv_bwd = hpu__dnnl_conv_bwd,
	.maxpool_fwd = hpu__vec_maxpool_fwd,
	.maxpool_bwd = hpu__vec_maxpool_bwd,
	.avgpool_fwd = no_avgpool,
	.avgpool_bwd = no_avgpool,
	.eltwise_fwd = pick_eltwise_fwd,
	.eltwise_bwd = pick_eltwise_bwd,
	.softmax_fwd = hpu__dnnl_softmax_fwd,
	.softmax_bwd = hpu__dnnl_softmax_bwd,
	.layernorm_fwd = hpu__dnnl_layernorm_fwd,
	.layernorm_bwd = hpu__dnnl_layernorm_bwd,
};

const hpu__backend *hpu__dnnl_backend(void)
{
	return &dnnl_backend;
}
