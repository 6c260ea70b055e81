#include "tests/integration/runlib.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

void arg(run *r, const char *a)
{
	assert_true(r->n + 2 < MAXARGS);
	r->argv[r->n++] = a;
	r->argv[r->n] = NULL;
}

void args(run *r, ...)
{
	va_list ap;
	va_start(ap, r);
	for (const char *a; (a = va_arg(ap, const char *));)
		arg(r, a);
	va_end(ap);
}

void start(run *r, int devices)
{
	static char dev[8][8];
	r->n = 0;
	snprintf(dev[devices & 7], sizeof dev[0], "%d", devices);
	args(r, LAUNCH, "-q", "--devices", dev[devices & 7], "--no-eval", "--log-every", "0",
	     NULL);
}

char *finish(run *r, int want, const char *model_args)
{
	return finish_with(r, want, MODEL, model_args);
}

char *finish_with(run *r, int want, const char *model, const char *model_args)
{
	arg(r, model);
	char buf[512], *margs[16];
	int nm = 0;
	if (model_args) {
		arg(r, "--");
		snprintf(buf, sizeof buf, "%s", model_args);
		for (char *t = strtok(buf, " "); t && nm < 16; t = strtok(NULL, " "))
			margs[nm++] = t;
		for (int i = 0; i < nm; i++)
			arg(r, margs[i]);
	}
	proc p;
	int code = h_run(&p, (char *const *)r->argv, NULL, 240000);
	if (code != want) {
		for (int i = 0; i < r->n; i++)
			fprintf(stderr, "%s ", r->argv[i]);
		fprintf(stderr, "\nexit %d, wanted %d; output:\n%s\n", code, want, p.out);
	}
	assert_int_equal(code, want);
	char *out = strdup(p.out ? p.out : "");
	h_free(&p);
	return out;
}

float *load_params(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long bytes = ftell(f);
	fseek(f, 0, SEEK_SET);
	/* safetensors (--save-params' default): the floats after the header,
	 * which --save-params lays out in declaration order as raw does */
	unsigned char head[9] = {0};
	uint64_t hlen = 0;
	if (bytes >= 9 && fread(head, 1, 9, f) == 9 && head[8] == '{') {
		for (int i = 7; i >= 0; i--)
			hlen = hlen << 8 | head[i];
		if (hlen > (uint64_t)bytes - 8)
			hlen = 0;
	}
	long skip = hlen && head[8] == '{' ? (long)(8 + hlen) : 0;
	bytes -= skip;
	fseek(f, skip, SEEK_SET);
	assert_true(bytes > 0 && bytes % 4 == 0);
	float *v = malloc((size_t)bytes);
	assert_non_null(v);
	assert_int_equal(fread(v, 1, (size_t)bytes, f), (size_t)bytes);
	fclose(f);
	*n = (size_t)bytes / 4;
	return v;
}

void mount_small_fs(const char *mnt, const char *size)
{
	char opts[64];
	snprintf(opts, sizeof opts, "size=%s", size);
	mkdir(mnt, 0755);
	if (mount("tmpfs", mnt, "tmpfs", 0, opts) == 0)
		return;
	if (geteuid() != 0) {
		printf("  not root: no tmpfs can be mounted; the full-disk case is skipped\n");
		skip();
	}
	fail_msg("mount tmpfs on %s failed", mnt);
}

int files_same(const char *a, const char *b)
{
	char cmd[700];
	snprintf(cmd, sizeof cmd, "cmp -s %s %s", a, b);
	return system(cmd) == 0;
}

void out_has(const char *out, const char *text)
{
	if (!strstr(out, text))
		fail_msg("no '%s' in:\n%s", text, out);
}
