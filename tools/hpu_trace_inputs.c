/* hpu-trace: finding the inputs (the files named, a directory's
 * *-rank<R>.json), their order by rank, and the default output's name. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/fileio.h"
#include "tools/hpu_trace_impl.h"
#include "tools/tool.h"

/* ---- finding the inputs ---- */

void hpu__trc_add_input(inputs *in, const char *path)
{
	if (in->n == in->cap) {
		in->cap = in->cap ? 2 * in->cap : 8;
		in->t = hpu__trc_xrealloc(in->t, (size_t)in->cap * sizeof *in->t);
	}
	memset(&in->t[in->n], 0, sizeof in->t[0]);
	in->t[in->n].order = in->n;
	in->t[in->n++].path = hpu__trc_xstrdup(path);
}

static int by_path(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Adds every *-rank<R>.json of directory dir; BAD (said) if none. */
int hpu__trc_add_dir(inputs *in, const char *dir)
{
	DIR *d = opendir(dir);
	if (!d)
		return fail("%s: cannot open the directory: %s", dir, strerror(errno));
	char **names = NULL;
	int n = 0;
	for (struct dirent *de; (de = readdir(d));) {
		if (hpu__trc_name_rank(de->d_name, NULL, 0) < 0)
			continue;
		names = hpu__trc_xrealloc(names, (size_t)(n + 1) * sizeof *names);
		names[n++] = hpu__trc_xstrdup(de->d_name);
	}
	closedir(d);
	if (n == 0)
		return fail("%s: no trace files (*-rank<R>.json) in it", dir);
	qsort(names, (size_t)n, sizeof *names, by_path);
	/* one run's files: a directory with several names (another
	 * --profile-filename, a restarted job's NAME-restart<K>) is ambiguous */
	char first[256], other[256];
	hpu__trc_name_rank(names[0], first, sizeof first);
	for (int i = 1; i < n; i++) {
		hpu__trc_name_rank(names[i], other, sizeof other);
		if (strcmp(first, other) != 0) {
			int rc = fail("%s holds the traces of more than one run (%s-rank*.json and "
				      "%s-rank*.json): name the files of one, e.g. %s/%s-rank*.json",
				      dir, first, other, dir, first);
			for (int k = 0; k < n; k++)
				free(names[k]);
			free(names);
			return rc;
		}
	}
	for (int i = 0; i < n; i++) {
		size_t len = strlen(dir) + strlen(names[i]) + 2;
		char *p = hpu__trc_xrealloc(NULL, len);
		snprintf(p, len, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", names[i]);
		hpu__trc_add_input(in, p);
		free(p);
		free(names[i]);
	}
	free(names);
	return OK;
}

int hpu__trc_by_rank(const void *a, const void *b)
{
	const trace *x = a, *y = b;
	if (x->rank != y->rank)
		return x->rank < y->rank ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

/* The default output: DIR/NAME-merged.json. */
char *hpu__trc_default_output(const char *first, int first_is_dir, const inputs *in)
{
	char name[256] = "", other[256];
	for (int i = 0; i < in->n; i++) {
		hpu__trc_name_rank(in->t[i].path, other, sizeof other);
		if (i == 0)
			snprintf(name, sizeof name, "%s", other);
		else if (strcmp(name, other) != 0)
			name[0] = 0;
	}
	if (!name[0])
		snprintf(name, sizeof name, "hpu-trace");
	char dir[4096];
	if (first_is_dir) {
		snprintf(dir, sizeof dir, "%s", first);
	} else {
		hpu__dir_part(first, dir, sizeof dir);
	}
	size_t len = strlen(dir) + strlen(name) + 16;
	char *out = hpu__trc_xrealloc(NULL, len);
	snprintf(out, len, "%s%s%s-merged.json", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", name);
	return out;
}

/* The input that out is (hpu__same_file: the same device and inode,
 * links followed), or NULL. */
const trace *hpu__trc_output_is_input(const inputs *in, const char *out)
{
	for (int i = 0; i < in->n; i++)
		if (hpu__same_file(in->t[i].path, out))
			return &in->t[i];
	return NULL;
}
