/* shapetext: a tensor's shape as text. */
#include "common/shapetext.h"

#include <stdio.h>

const char *hpu__shape_text(char *buf, size_t n, int ndim, const int64_t *shape)
{
	if (n == 0)
		return buf;
	size_t at = (size_t)snprintf(buf, n, "[");
	for (int d = 0; d < ndim && at < n; d++)
		at += (size_t)snprintf(buf + at, n - at, "%s%lld", d ? ", " : "",
				       (long long)shape[d]);
	if (at < n)
		snprintf(buf + at, n - at, "]");
	return buf;
}
