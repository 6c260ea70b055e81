/* device_refuse: the ops' hooks (worker/ops/backend.h,
 * hpu__be_dev_hooks): the open device's name, whether the host may touch
 * its memory now, and a refusal of the kernel table while the calling thread
 * records a step, kept as the recording's reason. Calls device.c and
 * device_rec.c only. */
#include "worker/device/device.h"

static const char *dev_name(void)
{
	return hpu__dev_name();
}

/* Whether the ops' C loops may touch device memory now: where the device
 * says so, and on a device whose memory is the host's (cpu under
 * --graphs) outside a recording (while one is made its memory is closed,
 * and the loops would run now, not at each launch: the op refuses the
 * recording instead, naming itself). */
static int host_can_read(void)
{
	const hpu__dev_caps *c = hpu__dev_caps_get();
	return c->host_can_read || (c->host_mem && !hpu__dev_capturing());
}

static int refuse(const char *why)
{
	if (!hpu__dev_capturing())
		return 0;
	/* a device that refused already (CUDA: the call and CUDA's error)
	 * keeps its reason: end answers it */
	const hpu__dev_recorder *r = hpu__dev()->recorder;
	if (!(r && r->refused && r->refused()))
		hpu__dev_capture_refuse("%s", why);
	return 1;
}

void hpu__dev_ops_hooks(void)
{
	static const hpu__be_dev_hooks hooks = {.name = dev_name,
						    .host_can_read = host_can_read,
						    .refuse = refuse};
	hpu__be_set_dev_hooks(&hooks);
}
