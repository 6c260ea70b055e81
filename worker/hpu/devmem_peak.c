/* devmem_peak: HPU_MEMORY_PEAK=DIR, what was in device memory at its
 * peak. While on, devmem keeps the list of its live blocks (pointer,
 * bytes, kind, the allocation's name); when InUse has reached a new
 * maximum and then goes down (a free), the list as it stood is copied:
 * one copy per new maximum left, none while memory only grows. At
 * shutdown, and at the first refused allocation (a worker out of memory
 * may be stopped before its end), DIR/memory-peak-rank<R>.txt lists that
 * copy summed by name with the layers' indices folded ("activations
 * h#.fc1": one line for that tensor of every block), then by kind, then
 * one by one, largest first. DIR is made (with its parents) when the
 * device is set up, where a failure is said at once. Off (the default),
 * devmem does none of it. Every function runs under hpu__devmem.mu. */
#include "worker/hpu/devmem.h"
#include "worker/hpu/devmem_impl.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/fileio.h"

#define WHAT_LEN 136 /* the runtime's names: up to 128 */

typedef struct live {
	void *p;
	uint64_t bytes;
	uint16_t kind;
	char what[WHAT_LEN];
} live;

typedef struct list {
	live *v;
	size_t n, cap;
} list;

static struct {
	bool on;
	char dir[512];
	list cur, peak;
	uint64_t peak_bytes;
	bool at_peak; /* cur is the peak's list, not copied yet */
	char refused[320]; /* the first refusal's sentence, or "" */
	bool broken;       /* a list could not grow: the report says so */
} pk;

static int grow(list *l, size_t want)
{
	if (want <= l->cap)
		return 0;
	size_t cap = l->cap ? l->cap * 2 : 256;
	while (cap < want)
		cap *= 2;
	live *v = realloc(l->v, cap * sizeof *v);
	if (!v) {
		pk.broken = true;
		return -1;
	}
	l->v = v, l->cap = cap;
	return 0;
}

void hpu__devmem_peak_begin(void)
{
	const char *dir = hpu__env_str(HPU_ENV_HPU_MEMORY_PEAK);
	pk.cur.n = pk.peak.n = 0;
	pk.peak_bytes = 0;
	pk.at_peak = false;
	pk.refused[0] = '\0';
	pk.broken = false;
	pk.on = false;
	if (!dir || !*dir)
		return;
	char err[1200];
	if (strlen(dir) >= sizeof pk.dir)
		fprintf(stderr, "hpu-worker: rank %d: HPU_MEMORY_PEAK: a directory name of at most "
			"%zu bytes; no report\n", hpu__devmem.rank, sizeof pk.dir - 1);
	else if (hpu__make_dirs_said("HPU_MEMORY_PEAK", dir, err, sizeof err) < 0)
		fprintf(stderr, "hpu-worker: rank %d: %s; no report\n", hpu__devmem.rank, err);
	else
		pk.on = true, snprintf(pk.dir, sizeof pk.dir, "%s", dir);
}

/* The live list is the peak's: keep it. */
static void keep_peak(void)
{
	if (!pk.at_peak || grow(&pk.peak, pk.cur.n) < 0)
		return;
	memcpy(pk.peak.v, pk.cur.v, pk.cur.n * sizeof *pk.cur.v);
	pk.peak.n = pk.cur.n;
	pk.at_peak = false;
}

void hpu__devmem_peak_alloc(void *p, uint64_t bytes, int kind, const char *what)
{
	if (!pk.on || pk.broken || grow(&pk.cur, pk.cur.n + 1) < 0)
		return;
	live *e = &pk.cur.v[pk.cur.n++];
	e->p = p, e->bytes = bytes, e->kind = (uint16_t)kind;
	snprintf(e->what, sizeof e->what, "%s", what);
	if (hpu__devmem.t.in_use > pk.peak_bytes) {
		pk.peak_bytes = hpu__devmem.t.in_use;
		pk.at_peak = true;
	}
}

void hpu__devmem_peak_free(void *p)
{
	if (!pk.on)
		return;
	keep_peak();
	for (size_t i = pk.cur.n; i-- > 0;)
		if (pk.cur.v[i].p == p) {
			pk.cur.v[i] = pk.cur.v[--pk.cur.n];
			return;
		}
}

static void write_file(void);

void hpu__devmem_peak_refused(const char *sentence)
{
	if (!pk.on || pk.refused[0])
		return;
	snprintf(pk.refused, sizeof pk.refused, "%s", sentence);
	write_file(); /* now: the worker may be stopped before its end */
}

static int by_bytes(const void *a, const void *b)
{
	const live *x = a, *y = b;
	if (x->bytes != y->bytes)
		return x->bytes < y->bytes ? 1 : -1;
	return strcmp(x->what, y->what);
}

/* The name with each layer index as '#': a word of digits, or of one
 * letter and digits, that a '.' follows ("h12.fc2" and "blocks.3.attn"
 * fold, "fc2", "w1", "fp32" and "layer12.fc" do not). */
static void fold(char *out, size_t len, const char *what)
{
	size_t o = 0;
	for (const char *c = what; *c && o + 1 < len;) {
		size_t w = 0, letters = 0;
		while (isalnum((unsigned char)c[w]) || c[w] == '_')
			letters += !isdigit((unsigned char)c[w++]);
		if (!w) {
			out[o++] = *c++;
			continue;
		}
		int index = letters <= 1 && w > letters && c[w] == '.';
		for (size_t i = 0; i < w && o + 1 < len; i++)
			if (!index || !isdigit((unsigned char)c[i]))
				out[o++] = c[i];
			else if (!o || out[o - 1] != '#')
				out[o++] = '#';
		c += w;
	}
	out[o] = '\0';
}

/* pk.peak.v summed by folded name (into v, n of them), largest first. */
static size_t group(live *v)
{
	size_t n = 0;
	for (size_t i = 0; i < pk.peak.n; i++) {
		char f[WHAT_LEN];
		fold(f, sizeof f, pk.peak.v[i].what);
		size_t j = 0;
		while (j < n && (strcmp(v[j].what, f) || v[j].kind != pk.peak.v[i].kind))
			j++;
		if (j == n)
			v[n++] = (live){.p = NULL, .bytes = 0, .kind = pk.peak.v[i].kind};
		snprintf(v[j].what, sizeof v[j].what, "%s", f);
		v[j].bytes += pk.peak.v[i].bytes;
		v[j].p = (void *)((uintptr_t)v[j].p + 1); /* the count */
	}
	qsort(v, n, sizeof *v, by_bytes);
	return n;
}

static void write_report(FILE *f)
{
	char b[32];
	hpu__devmem_fmt_bytes(b, sizeof b, pk.peak_bytes);
	fprintf(f, "# rank %d: device memory at its peak, InUse %s (%llu bytes) in %zu "
		"allocations\n", hpu__devmem.rank, b, (unsigned long long)pk.peak_bytes,
		pk.peak.n);
	if (pk.refused[0])
		fprintf(f, "# then refused: %s\n", pk.refused);
	if (pk.broken)
		fprintf(f, "# incomplete: the list of blocks could not grow (out of host memory)\n");
	qsort(pk.peak.v, pk.peak.n, sizeof *pk.peak.v, by_bytes);
	live *g = calloc(pk.peak.n ? pk.peak.n : 1, sizeof *g);
	size_t ng = g ? group(g) : 0;
	fprintf(f, "\n# by name, indices folded: bytes, MiB, blocks, kind, name\n");
	for (size_t i = 0; i < ng; i++)
		fprintf(f, "%14llu %10.1f %6zu  %-6s %s\n", (unsigned long long)g[i].bytes,
			(double)g[i].bytes / (1 << 20), (size_t)(uintptr_t)g[i].p,
			hpu__mem_kind_name((hpu_mem_kind)g[i].kind), g[i].what);
	free(g);
	fprintf(f, "\n# by kind: bytes, MiB, kind\n");
	for (int k = 0; k < HPU_MEM_NKINDS; k++) {
		uint64_t s = 0;
		for (size_t i = 0; i < pk.peak.n; i++)
			s += pk.peak.v[i].kind == k ? pk.peak.v[i].bytes : 0;
		fprintf(f, "%14llu %10.1f  %s\n", (unsigned long long)s, (double)s / (1 << 20),
			hpu__mem_kind_name((hpu_mem_kind)k));
	}
	fprintf(f, "\n# every allocation: bytes, MiB, kind, name\n");
	for (size_t i = 0; i < pk.peak.n; i++)
		fprintf(f, "%14llu %10.1f  %-6s %s\n", (unsigned long long)pk.peak.v[i].bytes,
			(double)pk.peak.v[i].bytes / (1 << 20),
			hpu__mem_kind_name((hpu_mem_kind)pk.peak.v[i].kind), pk.peak.v[i].what);
}

/* DIR/memory-peak-rank<R>.txt of the peak so far. */
static void write_file(void)
{
	keep_peak();
	char path[640];
	snprintf(path, sizeof path, "%s/memory-peak-rank%d.txt", pk.dir, hpu__devmem.rank);
	FILE *f = fopen(path, "w");
	if (!f) {
		fprintf(stderr, "hpu-worker: rank %d: HPU_MEMORY_PEAK: cannot write %s: %s\n",
			hpu__devmem.rank, path, strerror(errno));
		return;
	}
	write_report(f);
	if (fclose(f) != 0)
		fprintf(stderr, "hpu-worker: rank %d: HPU_MEMORY_PEAK: writing %s: %s\n",
			hpu__devmem.rank, path, strerror(errno));
}

void hpu__devmem_peak_end(void)
{
	if (!pk.on)
		return;
	write_file();
	pk.on = false;
	free(pk.cur.v);
	free(pk.peak.v);
	pk.cur = pk.peak = (list){0};
}
