#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/integration/clusterlib.h"
#include "tests/integration/runlib.h"

int sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof cmd, fmt, ap);
	va_end(ap);
	int rc = system(cmd);
	return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int job_procs(const char *job)
{
	char want[96];
	snprintf(want, sizeof want, "HPU_JOB_ID=%s", job);
	DIR *d = opendir("/proc");
	int n = 0;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		char path[300], buf[16384];
		snprintf(path, sizeof path, "/proc/%s/environ", e->d_name);
		FILE *f = fopen(path, "r");
		if (!f)
			continue;
		size_t len = fread(buf, 1, sizeof buf - 1, f);
		fclose(f);
		for (size_t i = 0; i < len;) {
			if (strcmp(buf + i, want) == 0) {
				n++;
				break;
			}
			i += strnlen(buf + i, len - i) + 1;
		}
	}
	if (d)
		closedir(d);
	return n;
}

double params_rel_diff(const char *a, const char *b, int *same)
{
	size_t na, nb;
	float *x = load_params(a, &na), *y = load_params(b, &nb);
	assert_int_equal(na, nb);
	double dd = 0, bb = 0;
	*same = memcmp(x, y, na * sizeof *x) == 0;
	for (size_t i = 0; i < na; i++) {
		double d = (double)x[i] - y[i];
		dd += d * d;
		bb += (double)y[i] * y[i];
	}
	free(x);
	free(y);
	return sqrt(dd / bb);
}

void expect_job_end(proc *p, const char *job, double t0, double bound, const char *const *names)
{
	assert_int_equal(h_wait(p, (int)(bound * 1000)), 0);
	double took = now_s() - t0;
	const char *err = strstr(p->out, "hpulaunch: error: ");
	printf("  ended after %.1f s with exit %d: %.300s", took, h_code(p), err ? err : p->out);
	assert_int_equal(h_code(p), 1);
	assert_non_null(err);
	int named = 0;
	for (int k = 0; names[k]; k++)
		named |= strstr(err, names[k]) != NULL;
	if (!named)
		fail_msg("the error does not name the lost node or its ranks: %s", err);
	int left = -1;
	for (int i = 0; i < (int)(bound * 10) && left; i++) {
		left = job_procs(job);
		if (left)
			usleep(100000);
	}
	printf("  workers left: %d\n", left);
	assert_int_equal(left, 0);
}
