/* outpath: how an output file is written, shared by every writer that
 * writes through a temporary file and a rename (checkpoints,
 * --save-params, hpu-trace, hpu-plot). Header-only: the writers live in
 * libraries and tools that share no other library. */
#ifndef HPU_OUTPATH_H
#define HPU_OUTPATH_H

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* How output `path` is written: in place (1) when it is a device or a
 * pipe (/dev/full, /dev/stdout into a pipe), which renaming over would
 * replace; else (0) as a temporary file renamed onto real[len]: path
 * itself, or the regular file a symbolic link at path leads to (the link
 * stays). */
static inline int hpu_out_in_place(const char *path, char *real, size_t len)
{
	struct stat st, lst;
	snprintf(real, len, "%s", path);
	if (stat(path, &st) != 0)
		return 0; /* a new file */
	if (!S_ISREG(st.st_mode))
		return !S_ISDIR(st.st_mode); /* a directory: the rename says so */
	if (lstat(path, &lst) != 0 || !S_ISLNK(lst.st_mode))
		return 0;
	char *r = realpath(path, NULL);
	if (!r || strlen(r) >= len) {
		free(r);
		return 1;
	}
	snprintf(real, len, "%s", r);
	free(r);
	return 0;
}

#endif
