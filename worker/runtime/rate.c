/* rate: see rate.h. */
#include "worker/runtime/rate.h"

void hpu__rate_start(hpu_rate *R, long warm, long step, double t)
{
	*R = (hpu_rate){.warm = warm, .step0 = step, .steplog = step, .first = step};
	R->t0 = R->tlog = R->start = t;
}

void hpu__rate_tick(hpu_rate *R, long step, double t)
{
	if (R->warm > 0 && step == R->first + R->warm) {
		R->step0 = R->steplog = step;
		R->t0 = R->tlog = t;
	}
}

int hpu__rate_measuring(const hpu_rate *R, long step)
{
	return step > R->first + R->warm;
}

double hpu__rate_log(hpu_rate *R, long step, double t, int batch)
{
	double sps = hpu__rate_measuring(R, step) && t > R->tlog
			     ? (double)(step - R->steplog) * batch / (t - R->tlog)
			     : 0;
	if (hpu__rate_measuring(R, step) || R->warm == 0) {
		R->tlog = t;
		R->steplog = step;
	}
	return sps;
}

void hpu__rate_pause(hpu_rate *R, double dt)
{
	R->t0 += dt;
	R->tlog += dt;
	R->start += dt;
}

double hpu__rate_final(const hpu_rate *R, long step, double t, int batch)
{
	if (hpu__rate_measuring(R, step) && t > R->t0)
		return (double)(step - R->step0) * batch / (t - R->t0);
	return step > R->first && t > R->start ? (double)(step - R->first) * batch / (t - R->start)
						: 0;
}
