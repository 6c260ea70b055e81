/* strategy_cast: the strategies' conversions between fp32 and 16 bits
 * and their sums, on flat buffers; the base the other strategy files
 * stand on (calls none of them). */
#include <stddef.h>
#include <stdint.h>

#include "worker/ops/autocast.h"
#include "common/lowp.h"
#include "common/simd.h"
#include "worker/runtime/strategy_impl.h"

HPU_CLONES void hpu__sync_add(float *restrict dst, const float *restrict src, size_t n)
{
	for (size_t i = 0; i < n; i++)
		dst[i] += src[i];
}

/* ---- 16-bit <-> fp32 ---- */

HPU_CLONES static void to16_plain(int fp16, uint16_t *restrict dst,
				  const float *restrict src, size_t n)
{
	if (fp16)
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_to_fp16(src[i]);
	else
		for (size_t i = 0; i < n; i++)
			dst[i] = hpu_to_bf16(src[i]);
}

void hpu__mp_to16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	if (fp16 && hpu_have_f16c())
		hpu__f16c_to_fp16(dst, src, n);
	else
		to16_plain(fp16, dst, src, n);
}

void hpu__mp_acc16(int fp16, uint16_t *dst, const float *src, size_t n)
{
	float tmp[1024];
	for (size_t i = 0; i < n; i += 1024) {
		size_t c = n - i < 1024 ? n - i : 1024;
		hpu__ac_from16(fp16, tmp, dst + i, c);
		hpu__sync_add(tmp, src + i, c);
		hpu__mp_to16(fp16, dst + i, tmp, c);
	}
}

