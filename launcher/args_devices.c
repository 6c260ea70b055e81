/* args_devices: --devices auto and torchrun's gpu/auto, counted by the
 * hpu-worker next to this program. */
#include "launcher/args_impl.h"
#include "common/env.h"
#include "agent/gpus.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The hpu-worker next to this executable, or $HPU_WORKER. */
int hpu__args_worker_path(char *out, size_t outlen)
{
	const char *env = hpu__env_str(HPU_ENV_HPU_WORKER);
	if (env && *env)
		return snprintf(out, outlen, "%s", env) < (int)outlen ? 0 : -1;
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	if (n <= 0)
		return -1;
	self[n] = 0;
	char *slash = strrchr(self, '/');
	if (!slash)
		return -1;
	*slash = 0;
	return snprintf(out, outlen, "%s/hpu-worker", self) < (int)outlen ? 0 : -1;
}

/* Gives the workers "--device cuda" among their training options,
 * before the model (torchrun's gpu, or its auto where it found GPUs,
 * with no device given): 0, or -1 out of memory. */
static int add_device_cuda(hpu_launch_args *a)
{
	int at = 1;
	while (at < a->worker_argc && a->worker_argv[at] != a->model)
		at++;
	char **grown = realloc(a->worker_argv, (size_t)(a->worker_argc + 3) * sizeof *grown);
	if (!grown)
		return -1;
	memmove(grown + at + 2, grown + at, (size_t)(a->worker_argc - at + 1) * sizeof *grown);
	grown[at] = (char *)"--device";
	grown[at + 1] = (char *)"cuda";
	a->worker_argv = grown;
	a->worker_argc += 2;
	a->train.device = HPU_DEVICE_CUDA;
	return 0;
}

/* What --devices auto counts by (gpus.h): the device; torchrun's gpu the
 * GPUs on cuda, its auto the GPUs where there are some, where no device
 * is given (the option, the file or HPU_DEVICE). *given: one was. -1 with
 * a sentence in err for gpu with a CPU device. */
static int count_by(const hpu_launch_args *a, const sources *src, hpu__count_by *by,
		    int *given, char *err, size_t errlen)
{
	const char *env = hpu__env_str(HPU_ENV_HPU_DEVICE);
	hpu_device_kind d = a->train.device;
	*given = hpu__opts_from(&a->train, "device") != HPU_FROM_DEFAULT || (env && *env);
	*by = d == HPU_DEVICE_CUDA ? HPU_COUNT_GPUS : d == HPU_DEVICE_AUTO ? HPU_COUNT_EITHER
									    : HPU_COUNT_CORES;
	if ((src->flag & SET_DEVICES_GPU) && *given && *by == HPU_COUNT_CORES) {
		snprintf(err, errlen, "--nproc-per-node gpu: one worker per GPU computes on --device cuda, not --device %s",
			 hpu__device_name(d));
		return -1;
	}
	if (src->flag & SET_DEVICES_GPU)
		*by = HPU_COUNT_GPUS;
	else if ((src->flag & SET_DEVICES_TORCH) && !*given)
		*by = HPU_COUNT_EITHER;
	return 0;
}

/* --devices auto: one worker per GPU with --device cuda (none is an
 * error), or auto where the CUDA device sees GPUs; else one per CPU core
 * (gpus.h). hpu-worker counts them: this program links nothing of CUDA.
 * torchrun's --nproc-per-node gpu and auto, as count_by says. */
int hpu__args_auto_devices(hpu_launch_args *a, const sources *src, char *err, size_t errlen)
{
	static const char cuda[] = "--devices auto --device cuda: ";
	hpu__count_by by;
	int given;
	if (hpu__opts_resolve_device(&a->train, err, errlen) < 0 ||
	    count_by(a, src, &by, &given, err, errlen) < 0)
		return -1;
	int ngpus = 0;
	char why[1024] = "", worker[PATH_MAX];
	if (by != HPU_COUNT_CORES) {
		if (hpu__args_worker_path(worker, sizeof worker) < 0)
			snprintf(why, sizeof why, "cannot find hpu-worker");
		else
			hpu__gpus_count(worker, &ngpus, why, sizeof why);
	}
	if (hpu__gpus_devices(by, ngpus, why, sysconf(_SC_NPROCESSORS_ONLN), &a->devices, err,
			      errlen) < 0) {
		/* torchrun's spelling is named as given */
		if ((src->flag & SET_DEVICES_GPU) && !strncmp(err, cuda, sizeof cuda - 1)) {
			snprintf(why, sizeof why, "--nproc-per-node gpu: %s", err + sizeof cuda - 1);
			snprintf(err, errlen, "%s", why);
		}
		return -1;
	}
	if ((src->flag & (SET_DEVICES_GPU | SET_DEVICES_TORCH)) && !given && ngpus > 0 &&
	    a->model && add_device_cuda(a) < 0) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}
