/* backend_host: the ops' C loops as a kernel table (backend.h): what the
 * CPU runs for the entries its backends leave NULL. */
#include "worker/ops/backend_host.h"
#include "worker/ops/ops_ref.h"

/* The reference kernels the ops fall back on where a backend answers
 * HPU_BE_UNSUPPORTED, as table entries (the fallbacks of the CPU table of
 * cpu-strict's kernels-only mode). */
static int ref_eltwise_fwd(hpu__eltwise op, const float *x, float *y, size_t n)
{
	if (op == HPU_ELT_RELU)
		hpu__ref_relu_forward(x, y, n);
	else if (op == HPU_ELT_GELU_TANH)
		hpu__ref_gelu_forward(x, y, n);
	else
		hpu__ref_tanh_forward(x, y, n);
	return HPU_BE_OK;
}

static int ref_eltwise_bwd(hpu__eltwise op, const float *at, const float *dy, float *dx,
			   size_t n)
{
	if (op == HPU_ELT_RELU)
		hpu__ref_relu_backward(at, dy, dx, n);
	else if (op == HPU_ELT_GELU_TANH)
		hpu__ref_gelu_backward(at, dy, dx, n);
	else
		hpu__ref_tanh_backward(at, dy, dx, n);
	return HPU_BE_OK;
}

static int ref_softmax_fwd(const float *x, float *y, int rows, int cols)
{
	hpu__ref_softmax_forward(x, y, rows, cols);
	return HPU_BE_OK;
}

static int ref_softmax_bwd(const float *y, const float *dy, float *dx, int rows, int cols)
{
	hpu__ref_softmax_backward(y, dy, dx, rows, cols);
	return HPU_BE_OK;
}

static int ref_layernorm_fwd(const float *x, const float *gamma, const float *beta, float *y,
			     float *mean, float *rstd, int rows, int cols, float eps)
{
	hpu__ref_layernorm_forward(x, gamma, beta, y, mean, rstd, rows, cols, eps);
	return HPU_BE_OK;
}

static int ref_layernorm_bwd(const float *x, const float *gamma, const float *mean,
			     const float *rstd, const float *dy, float *dx, float *dgamma,
			     float *dbeta, int rows, int cols)
{
	hpu__ref_layernorm_backward(x, gamma, mean, rstd, dy, dx, dgamma, dbeta, rows, cols);
	return HPU_BE_OK;
}

static int ref_maxpool_fwd(const float *x, float *y, int32_t *idx, int batch, int ch, int h,
			   int w, int k, int stride)
{
	hpu__ref_maxpool2d_forward(x, y, idx, batch, ch, h, w, k, stride);
	return HPU_BE_OK;
}

static int ref_maxpool_bwd(const float *dy, const int32_t *idx, float *dx, int batch, int ch,
			   int h, int w, int k, int stride)
{
	hpu__ref_maxpool2d_backward(dy, idx, dx, batch, ch, h, w, k, stride);
	return HPU_BE_OK;
}

static int ref_avgpool_fwd(const float *x, float *y, int batch, int ch, int h, int w, int k,
			   int stride)
{
	hpu__ref_avgpool2d_forward(x, y, batch, ch, h, w, k, stride);
	return HPU_BE_OK;
}

static int ref_avgpool_bwd(const float *dy, float *dx, int batch, int ch, int h, int w, int k,
			   int stride)
{
	hpu__ref_avgpool2d_backward(dy, dx, batch, ch, h, w, k, stride);
	return HPU_BE_OK;
}

static const hpu__backend host_backend = {
	.name = "host loops",
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
	.bias_grad = hpu__host_bias_grad,
	.ids_in_range = hpu__host_ids_in_range,
	.softmax_xent = hpu__host_softmax_xent,
	.count_correct = hpu__host_count_correct,
	.embedding_fwd = hpu__host_embedding_fwd,
	.embedding_bwd = hpu__host_embedding_bwd,
	.dropout_fwd = hpu__host_dropout_fwd,
	.dropout_bwd = hpu__host_dropout_bwd,
	.round = hpu__host_round,
	.to_bf16 = hpu__host_to_bf16,
	.from16 = hpu__host_from16,
	.add = hpu__host_add,
	.amax = hpu__host_amax,
	.fp8_fake_quant = hpu__host_fp8_fake_quant,
	.fp8_amax_scale = hpu__host_fp8_amax_scale,
	.fp8_quant_at = hpu__host_fp8_quant_at,
	.fp8_roll = hpu__host_fp8_roll,
	.fp8_state_copy = hpu__host_fp8_state_copy,
	.fp8_quant8 = hpu__host_fp8_quant8,
	.xent_pos_fwd = hpu__host_xent_pos_fwd,
	.xent_pos_bwd = hpu__host_xent_pos_bwd,
	.accuracy_pos = hpu__host_accuracy_pos,
	.copy = hpu__host_copy,
	.dropout_rows = hpu__host_dropout_rows,
	.dropout_keys = hpu__host_dropout_keys,
	.batchnorm_fwd = hpu__host_batchnorm_fwd,
	.batchnorm_bwd = hpu__host_batchnorm_bwd,
	.heads = hpu__host_heads,
	.mask_scores = hpu__host_mask_scores,
	.reduce_fwd = hpu__host_reduce_fwd,
	.reduce_bwd = hpu__host_reduce_bwd,
	.copy_rows = hpu__host_copy_rows,
	.zero = hpu__host_zero,
	.permute = hpu__host_permute,
	.sigmoid_fwd = hpu__host_sigmoid_fwd,
	.sigmoid_bwd = hpu__host_sigmoid_bwd,
	.pool1d_fwd = hpu__host_pool1d_fwd,
	.pool1d_bwd = hpu__host_pool1d_bwd,
	.conv_rect_fwd = hpu__host_conv_rect_fwd,
	.conv_rect_bwd = hpu__host_conv_rect_bwd,
	.mse_fwd = hpu__host_mse_fwd,
	.mse_bwd = hpu__host_mse_bwd,
	.bce_fwd = hpu__host_bce_fwd,
	.bce_bwd = hpu__host_bce_bwd,
	.ids_first_bad = hpu__host_ids_first_bad,
	.attention_fwd = hpu__host_attention_fwd,
	.attention_bwd = hpu__host_attention_bwd,
	.flash_fwd = hpu__host_flash_fwd,
	.flash_bwd = hpu__host_flash_bwd,
};

const hpu__backend *hpu__be_host(void)
{
	return &host_backend;
}
