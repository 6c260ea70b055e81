/* error.c: the sentences of libhpu's error codes (include/hpu/hpu.h),
 * worded as hpucoll_strerror's. The codes are negative: index by -code. */
#include <hpu/hpu.h>

#include <stddef.h>

static const char *const errstr[] = {
	[-HPU_OK] = "Success.",
	[-HPU_ERROR] = "Failed; the recorded message says why.",
	[-HPU_EINVAL] = "Invalid argument.",
	[-HPU_ENOMEM] = "Out of memory.",
	[-HPU_ERANGE] = "Index out of range.",
	[-HPU_ENODEV] = "No device memory is set up.",
	[-HPU_ENOENT] = "No such name.",
};

const char *hpu_strerror(int err)
{
	long i = -(long)err; /* long: -INT_MIN fits */
	if (i < 0 || (size_t)i >= sizeof errstr / sizeof errstr[0] || errstr[i] == NULL)
		return "Unknown error code.";
	return errstr[i];
}
