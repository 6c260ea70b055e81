/* optim: optimizers over flat fp32 buffers (a rank's shard under ZeRO),
 * each step one fused pass: gradient scaling (clipping), weight decay,
 * moments and the update together, run by the device (each call below
 * is a device call: the buffers may be device memory). The caller owns
 * the state memory (it comes from the device allocator). */
#ifndef HPU_OPTIM_H
#define HPU_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "options/config.h"

typedef struct hpu_optim {
	hpu_optim_kind kind;
	double momentum, weight_decay, beta1, beta2, eps;
	int nesterov;
	size_t n;
	long t;     /* steps taken */
	float *m;   /* SGD momentum buffer / Adam first moment (or NULL) */
	float *v;   /* Adam second moment (or NULL) */
	/* NULL, or the step's scalars in device memory: the device's update
	 * (hpu__optim_range, hpu__optim_range16) then reads lr, t and
	 * gscale there, not from t and its arguments, and does nothing on
	 * a skipped step (device.h, hpu__dev_optim.sv). The host's update
	 * never reads them. */
	const struct hpu__dev_stepvars *sv;
} hpu_optim;

/* Floats of state per parameter the optimizer in `opts` needs: 2 for Adam
 * and AdamW, 1 for SGD with momentum, 0 for plain SGD. */
int hpu__optim_state_floats(const hpu_train_opts *opts);

/* Sets up an optimizer for n parameters; `state` holds
 * n * hpu__optim_state_floats(opts) floats, zeroed, and stays the caller's
 * (NULL when that is 0): m = state[0, n), v = state[n, 2n). */
void hpu__optim_init(hpu_optim *o, const hpu_train_opts *opts, size_t n,
		     float *state);

/* One step with learning rate `lr`: updates p[n] from the gradients
 * gscale * g[n] (as torch.optim.SGD / Adam / AdamW do after
 * clip_grad_norm_ multiplied the gradients by gscale). */
void hpu__optim_step(hpu_optim *o, float *p, const float *g, float gscale,
		     double lr);

/* The same step done in pieces (mixed precision converts the gradients
 * chunk by chunk): hpu__optim_begin() counts the step once, then
 * hpu__optim_range() updates elements [from, from + n) of the parameters
 * p[n], g[n] (pointers to that range) and of the state. */
void hpu__optim_begin(hpu_optim *o);
void hpu__optim_range(hpu_optim *o, size_t from, size_t n, float *p, const float *g,
		      float gscale, double lr);

/* hpu__optim_range with 16-bit gradients g16 (fp16: binary16, else
 * bf16), widened chunk by chunk into scratch[chunk], and the updated
 * parameters rounded into p16 as well (mixed precision's master
 * weights): one device call. */
void hpu__optim_range16(hpu_optim *o, size_t from, size_t n, float *p, const uint16_t *g16,
			uint16_t *p16, int fp16, float *scratch, size_t chunk, float gscale,
			double lr);

/* The same two over host memory, run by the host itself, not the device
 * (the offloaded optimizer's update, as ZeRO-Offload's CPU Adam:
 * hpu__dev_host_rt). */
void hpu__optim_range_host(hpu_optim *o, size_t from, size_t n, float *p, const float *g,
			   float gscale, double lr);
void hpu__optim_range16_host(hpu_optim *o, size_t from, size_t n, float *p,
			     const uint16_t *g16, uint16_t *p16, int fp16, float *scratch,
			     size_t chunk, float gscale, double lr);

/* Sum of squares of g[n]: fp32 within blocks of 256, the blocks summed in
 * double. */
double hpu__sumsq(const float *g, size_t n);

/* torch.nn.utils.clip_grad_norm_'s factor for a global norm, in fp32 as
 * torch computes it: max_norm / (norm + 1e-6) when that is below 1, else 1
 * (NaN for a NaN norm). */
float hpu__clip_factor(double norm, double max_norm);

#endif
