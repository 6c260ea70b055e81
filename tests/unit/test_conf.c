/* Unit tests for hpud's configuration file (daemon/conf.c): the defaults,
 * a file setting every key, comments and whitespace, every kind of error
 * (each must say FILE:LINE and name the key, so an operator can find it),
 * and that a failed load leaves the configuration as it was. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "agent/gpus.h"
#include "common/log.h"
#include "daemon/conf.h"

/* Writes `text` to a fresh temporary file; its name goes to path[]. */
static void write_conf(char path[256], const char *text)
{
	const char *dir = getenv("TMPDIR");
	snprintf(path, 256, "%s/hpud-conf-XXXXXX", dir && *dir ? dir : "/tmp");
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	size_t n = strlen(text);
	assert_int_equal(write(fd, text, n), (ssize_t)n);
	close(fd);
}

/* Loads `text` over the defaults; returns hpud__conf_load's result. */
static int load_text(hpud_conf *c, const char *text, char path[256],
		     char *err, size_t errlen)
{
	write_conf(path, text);
	err[0] = 0;
	int rc = hpud__conf_load(c, path, err, errlen);
	unlink(path);
	return rc;
}

static void test_defaults(void **state)
{
	(void)state;
	hpud_conf c;
	hpud__conf_defaults(&c);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	assert_string_equal(c.listen, "0.0.0.0");
	assert_int_equal(c.port, 29400);
	long want = cores < 1 ? 1 : cores > 1024 ? 1024 : cores;
	assert_int_equal(c.devices, want);
	assert_string_equal(c.key_path, "/etc/hpud/secret.key");
	assert_string_equal(c.user, "");
	assert_int_equal(c.log_level, HPU_LOG_INFO);
	assert_true(c.clock_window_s == 30);
	assert_string_equal(c.worker, "");
	assert_true(c.submitter_timeout_s == 10);
	assert_int_equal(c.output_buffer, 4 << 20);
	assert_int_equal(c.job_uid_first, 0);
	assert_string_equal(hpud__log_level_name(HPUD_LOG_ERROR), "error");
	assert_string_equal(hpud__log_level_name(HPUD_LOG_WARN), "warning");
	assert_string_equal(hpud__log_level_name(HPUD_LOG_INFO), "info");
	assert_string_equal(hpud__log_level_name(HPUD_LOG_DEBUG), "debug");
}

static void test_full_file(void **state)
{
	(void)state;
	hpud_conf c;
	char path[256], err[256];
	hpud__conf_defaults(&c);
	int rc = load_text(&c,
			   "listen = 10.1.2.3\n"
			   "port = 29500\n"
			   "devices = 8\n"
			   "key = /srv/hpud/secret.key\n"
			   "user = hpu-train_2\n"
			   "log_level = debug\n"
			   "clock_window = 12.5\n"
			   "worker = /usr/lib/hputrain/hpu-worker\n"
			   "submitter_timeout = 3\n"
			   "output_buffer = 512K\n"
			   "job_uids = 61000-61999\n",
			   path, err, sizeof err);
	assert_int_equal(rc, 0);
	assert_int_equal(c.output_buffer, 512 << 10);
	assert_int_equal(c.job_uid_first, 61000);
	assert_int_equal(c.job_uid_last, 61999);
	assert_string_equal(c.listen, "10.1.2.3");
	assert_int_equal(c.port, 29500);
	assert_int_equal(c.devices, 8);
	assert_string_equal(c.key_path, "/srv/hpud/secret.key");
	assert_string_equal(c.user, "hpu-train_2");
	assert_int_equal(c.log_level, HPU_LOG_DEBUG);
	assert_true(c.clock_window_s == 12.5);
	assert_string_equal(c.worker, "/usr/lib/hputrain/hpu-worker");
	assert_true(c.submitter_timeout_s == 3);
}

/* Keys not in the file keep what c held before (the defaults here). */
static void test_partial_file_keeps_the_rest(void **state)
{
	(void)state;
	hpud_conf c, want;
	char path[256], err[256];
	hpud__conf_defaults(&c);
	want = c;
	want.port = 1;
	assert_int_equal(load_text(&c, "port = 1\n", path, err, sizeof err), 0);
	assert_memory_equal(&c, &want, sizeof c);
	/* An empty file changes nothing. */
	assert_int_equal(load_text(&c, "", path, err, sizeof err), 0);
	assert_memory_equal(&c, &want, sizeof c);
}

static void test_comments_and_whitespace(void **state)
{
	(void)state;
	hpud_conf c;
	char path[256], err[256];
	hpud__conf_defaults(&c);
	int rc = load_text(&c,
			   "# hpud.conf\n"
			   "\n"
			   "   # indented comment\n"
			   "\t\n"
			   "listen=127.0.0.1#no spaces\n"
			   "  port   =   4242   # trailing comment\n"
			   "\tdevices\t=\t2\t\n"
			   "log_level = warn#\n"
			   "worker = /opt/my tools/hpu-worker   \n"
			   "user = hpu\r\n"
			   "#port = 1\n"
			   "submitter_timeout = 3.5", /* no final newline */
			   path, err, sizeof err);
	assert_int_equal(rc, 0);
	assert_string_equal(c.listen, "127.0.0.1");
	assert_int_equal(c.port, 4242);
	assert_int_equal(c.devices, 2);
	assert_int_equal(c.log_level, HPU_LOG_WARNING);
	assert_string_equal(c.worker, "/opt/my tools/hpu-worker");
	assert_string_equal(c.user, "hpu");
	assert_true(c.submitter_timeout_s == 3.5);
}

static void test_bounds_accepted(void **state)
{
	(void)state;
	hpud_conf c;
	char path[256], err[256];
	hpud__conf_defaults(&c);
	char user63[64], key511[512], text[1024];
	memset(user63, 'u', 63);
	user63[63] = 0;
	memset(key511, 'k', 511);
	key511[511] = 0;
	key511[0] = '/';
	snprintf(text, sizeof text,
		 "port = 65535\ndevices = 1024\nclock_window = 3600\n"
		 "user = %s\nkey = %s\n",
		 user63, key511);
	assert_int_equal(load_text(&c, text, path, err, sizeof err), 0);
	assert_int_equal(c.port, 65535);
	assert_int_equal(c.devices, 1024);
	assert_true(c.clock_window_s == 3600);
	assert_string_equal(c.user, user63);
	assert_string_equal(c.key_path, key511);
	assert_int_equal(load_text(&c, "port = 1\ndevices = 1\n", path, err,
				   sizeof err),
			 0);
	assert_int_equal(c.port, 1);
	assert_int_equal(c.devices, 1);
	const struct {
		const char *v;
		size_t bytes;
	} sizes[] = {{"65536", 65536}, {"64K", 65536}, {"1G", 1 << 30}, {"1024M", 1 << 30},
		     {"1073741824", 1 << 30}, {"3M", 3 << 20}};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		snprintf(text, sizeof text, "output_buffer = %s\n", sizes[i].v);
		assert_int_equal(load_text(&c, text, path, err, sizeof err), 0);
		assert_int_equal(c.output_buffer, sizes[i].bytes);
	}
}

/* One bad file: its text, the line the error must name, and strings the
 * message must contain besides "FILE:LINE: ". */
typedef struct bad_case {
	const char *text;
	int line;
	const char *needle1, *needle2;
} bad_case;

static const bad_case bad_cases[] = {
	{"port = 1\nprot = 2\n", 2, "unknown key 'prot'", NULL},
	{"port = 1\nport = 2\n", 2, "duplicate key 'port'", "line 1"},
	{"# c\nlisten = 1.2.3.4\n\nlisten = 1.2.3.4\n", 4,
	 "duplicate key 'listen'", "line 2"},
	{"port =\n", 1, "empty value", "'port'"},
	{"user =   # nobody\n", 1, "empty value", "'user'"},
	{"just words\n", 1, "expected 'key = value'", "just words"},
	{" = 3\n", 1, "missing key", NULL},
	{"port = 0\n", 1, "'port'", "1 to 65535"},
	{"port = 65536\n", 1, "'port'", "'65536'"},
	{"port = 80x\n", 1, "'port'", "'80x'"},
	{"port = 99999999999999999999\n", 1, "'port'", NULL},
	{"port = 0x50\n", 1, "'port'", NULL},
	{"devices = 0\n", 1, "'devices'", "1 to 1024"},
	{"devices = 1025\n", 1, "'devices'", "'1025'"},
	{"devices = -4\n", 1, "'devices'", NULL},
	{"listen = localhost\n", 1, "'listen'", "IPv4"},
	{"listen = 1.2.3\n", 1, "'listen'", "'1.2.3'"},
	{"listen = 256.1.1.1\n", 1, "'listen'", NULL},
	{"listen = ::1\n", 1, "'listen'", NULL},
	{"log_level = verbose\n", 1, "'log_level'", "'verbose'"},
	{"log_level = INFO\n", 1, "'log_level'", NULL},
	{"clock_window = 0\n", 1, "'clock_window'", "3600"},
	{"clock_window = 3600.5\n", 1, "'clock_window'", NULL},
	{"clock_window = -1\n", 1, "'clock_window'", NULL},
	{"clock_window = nan\n", 1, "'clock_window'", NULL},
	{"clock_window = 10s\n", 1, "'clock_window'", "'10s'"},
	{"submitter_timeout = 0\n", 1, "'submitter_timeout'", ">= 3"},
	/* below three of the submitter's 1 s pings: healthy jobs cancelled */
	{"submitter_timeout = 2.9\n", 1, "'submitter_timeout'", "'2.9' is not a number of seconds >= 3"},
	/* below a second: every request refused as stale */
	{"clock_window = 0.5\n", 1, "'clock_window'", "'0.5' is not a number of seconds >= 1 and <= 3600"},
	/* hpud's working directory's, / under systemd */
	{"key = k1.key\n", 1, "'key'", "'k1.key' is not an absolute path"},
	{"worker = bin/hpu-worker\n", 1, "'worker'", "'bin/hpu-worker' is not an absolute path"},
	{"submitter_timeout = -2\n", 1, "'submitter_timeout'", NULL},
	{"submitter_timeout = inf\n", 1, "'submitter_timeout'", NULL},
	{"output_buffer = 65535\n", 1, "'output_buffer'", "64K to 1G"},
	{"output_buffer = 63K\n", 1, "'output_buffer'", "'63K'"},
	{"output_buffer = 2G\n", 1, "'output_buffer'", NULL},
	{"output_buffer = 1025M\n", 1, "'output_buffer'", NULL},
	{"output_buffer = 4MB\n", 1, "'output_buffer'", NULL},
	{"output_buffer = 4m\n", 1, "'output_buffer'", NULL},
	{"output_buffer = M\n", 1, "'output_buffer'", NULL},
	{"output_buffer = -4M\n", 1, "'output_buffer'", NULL},
	{"output_buffer = 99999999999999999999K\n", 1, "'output_buffer'", NULL},
	{"job_uids = 61000\n", 1, "'job_uids'", "FIRST-LAST"},
	{"job_uids = 0-10\n", 1, "'job_uids'", NULL},
	{"job_uids = 10-5\n", 1, "'job_uids'", NULL},
	{"job_uids = 1-70000\n", 1, "'job_uids'", "65536"},
	{"job_uids = 61000-\n", 1, "'job_uids'", NULL},
	{"job_uids = -1-5\n", 1, "'job_uids'", NULL},
	{"job_uids = 5-6x\n", 1, "'job_uids'", NULL},
	{"job_uids = 2147483640-2147483647\n", 1, "'job_uids'", NULL},
	{"user = Hpu\n", 1, "'user'", "'Hpu'"},
	{"user = a b\n", 1, "'user'", NULL},
	{"user = ../root\n", 1, "'user'", NULL},
};

/* log_level takes the levels hpud --log-level and HPU_LOG_LEVEL take
 * (common/log.c): "warning" and "notice" were refused, "warn" stays a
 * synonym of warning. */
static void test_log_level_names(void **state)
{
	(void)state;
	static const struct {
		const char *text;
		hpu_log_level want;
	} ok[] = {
		{"log_level = error\n", HPU_LOG_ERROR},     {"log_level = warning\n", HPU_LOG_WARNING},
		{"log_level = warn\n", HPU_LOG_WARNING},    {"log_level = notice\n", HPU_LOG_NOTICE},
		{"log_level = info\n", HPU_LOG_INFO},       {"log_level = debug\n", HPU_LOG_DEBUG},
	};
	char path[256], err[256];
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		hpud_conf c;
		hpud__conf_defaults(&c);
		assert_int_equal(load_text(&c, ok[i].text, path, err, sizeof err), 0);
		assert_int_equal(c.log_level, ok[i].want);
	}
	hpud_conf c;
	hpud__conf_defaults(&c);
	assert_int_equal(c.log_level, HPU_LOG_INFO);
	assert_int_equal(load_text(&c, "log_level = loud\n", path, err, sizeof err), -1);
	assert_non_null(strstr(err, "'loud' is not a log level (error, warning, notice, info or debug)"));
}

static void test_errors(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
		const bad_case *b = &bad_cases[i];
		hpud_conf c;
		char path[256], err[512], where[300];
		hpud__conf_defaults(&c);
		int rc = load_text(&c, b->text, path, err, sizeof err);
		printf("  %s\n", err);
		if (rc != -1)
			fail_msg("case %zu loaded: %s", i, b->text);
		snprintf(where, sizeof where, "%s:%d: ", path, b->line);
		if (strncmp(err, where, strlen(where)) != 0)
			fail_msg("error \"%s\" does not start with \"%s\"", err,
				 where);
		if (!strstr(err, b->needle1) ||
		    (b->needle2 && !strstr(err, b->needle2)))
			fail_msg("error \"%s\" lacks \"%s\" / \"%s\"", err,
				 b->needle1, b->needle2 ? b->needle2 : "");
	}
}

/* Strings that do not fit their buffers are errors, not truncations. */
static void test_too_long(void **state)
{
	(void)state;
	static const struct {
		const char *key;
		size_t len;
	} cases[] = {{"key", 512}, {"worker", 512}, {"user", 64},
		     {"listen", 64}};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char text[1024], path[256], err[512], where[300];
		int n = snprintf(text, sizeof text, "# long\n%s = ",
				 cases[i].key);
		memset(text + n, '1', cases[i].len);
		if (!strcmp(cases[i].key, "key") || !strcmp(cases[i].key, "worker"))
			text[n] = '/'; /* a path, so that the length is what is refused */
		strcpy(text + n + cases[i].len, "\n");
		hpud_conf c;
		hpud__conf_defaults(&c);
		int rc = load_text(&c, text, path, err, sizeof err);
		printf("  %s\n", err);
		assert_int_equal(rc, -1);
		assert_null(strstr(err, "absolute"));
		snprintf(where, sizeof where, "%s:2: ", path);
		assert_int_equal(strncmp(err, where, strlen(where)), 0);
		char quoted[32];
		snprintf(quoted, sizeof quoted, "'%s'", cases[i].key);
		assert_non_null(strstr(err, quoted));
	}
}

static void test_missing_file(void **state)
{
	(void)state;
	hpud_conf c, before;
	char err[256];
	hpud__conf_defaults(&c);
	before = c;
	const char *path = "/nonexistent/hpud/hpud.conf";
	assert_int_equal(hpud__conf_load(&c, path, err, sizeof err), -1);
	printf("  %s\n", err);
	assert_non_null(strstr(err, path));
	assert_memory_equal(&c, &before, sizeof c);
}

/* A file that is good up to a bad line changes nothing, whatever c held. */
static void test_unchanged_on_failure(void **state)
{
	(void)state;
	hpud_conf c, before;
	char path[256], err[256];
	hpud__conf_defaults(&c);
	strcpy(c.listen, "192.168.0.1");
	c.port = 1234;
	c.devices = 3;
	strcpy(c.user, "alice");
	c.log_level = HPU_LOG_ERROR;
	c.clock_window_s = 5;
	before = c;
	int rc = load_text(&c,
			   "listen = 10.0.0.1\n"
			   "port = 29500\n"
			   "devices = 8\n"
			   "user = bob\n"
			   "log_level = debug\n"
			   "clock_window = 60\n"
			   "worker = /bin/true\n"
			   "submitter_timeout = 99\n"
			   "key = /k\n"
			   "bogus = 1\n",
			   path, err, sizeof err);
	assert_int_equal(rc, -1);
	assert_memory_equal(&c, &before, sizeof c);
	/* and with the error in the middle of a line's value */
	rc = load_text(&c, "port = 29500\ndevices = 2000\n", path, err,
		       sizeof err);
	assert_int_equal(rc, -1);
	assert_memory_equal(&c, &before, sizeof c);
}

/* A fake worker in dir answering --count-gpus with `body` (test_gpus's). */
static void fake_worker(char *path, size_t len, const char *dir, const char *name,
			const char *body)
{
	snprintf(path, len, "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fprintf(f, "#!/bin/sh\n[ \"$1\" = --count-gpus ] || exit 9\n%s\n", body);
	fclose(f);
	assert_int_equal(chmod(path, 0755), 0);
}

/* devices = auto counts as hpulaunch's --devices auto --device DEVICE:
 * the GPUs the worker counts for cuda (none: the launcher's reason), them
 * or the cores for auto, the cores for cpu without asking the worker; a
 * number is kept. */
static void test_devices_auto(void **state)
{
	(void)state;
	char dir[64] = "/tmp/test_conf.XXXXXX", three[128], none[128], asked[128], called[160];
	char path[256], err[512], note[512];
	assert_non_null(mkdtemp(dir));
	fake_worker(three, sizeof three, dir, "three", "echo 3");
	fake_worker(none, sizeof none, dir, "none",
		    "echo '--device cuda: no GPU is visible (no CUDA-capable device is detected)'; exit 1");
	snprintf(called, sizeof called, "%s/was-asked", dir);
	char body[256];
	snprintf(body, sizeof body, "touch %s; echo 3", called);
	fake_worker(asked, sizeof asked, dir, "asked", body);
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	hpud_conf c;
	hpud__conf_defaults(&c);
	assert_int_equal(c.devices_auto, 1);
	assert_string_equal(c.device, "cpu");
	assert_int_equal(load_text(&c, "devices = auto\ndevice = cuda\n", path, err, sizeof err), 0);
	assert_int_equal(c.devices_auto, 1);
	assert_string_equal(c.device, "cuda");
	assert_int_equal(hpud__conf_count_devices(&c, three, note, sizeof note, err, sizeof err), 0);
	printf("  -> %s\n", note);
	assert_int_equal(c.devices, 3);
	assert_non_null(strstr(note, "devices = auto, device = cuda: 3, one per GPU"));
	c.devices = 5;
	assert_int_equal(hpud__conf_count_devices(&c, none, note, sizeof note, err, sizeof err), -1);
	printf("  -> %s\n", err);
	assert_string_equal(err, "devices = auto, device = cuda: no GPU is visible (no CUDA-capable "
				 "device is detected)");
	assert_int_equal(c.devices, 5); /* unchanged */
	assert_int_equal(load_text(&c, "device = auto\n", path, err, sizeof err), 0);
	assert_int_equal(hpud__conf_count_devices(&c, three, note, sizeof note, err, sizeof err), 0);
	assert_int_equal(c.devices, 3);
	assert_int_equal(hpud__conf_count_devices(&c, none, note, sizeof note, err, sizeof err), 0);
	assert_int_equal(c.devices, cores > 1024 ? 1024 : cores);
	assert_int_equal(load_text(&c, "device = cpu\n", path, err, sizeof err), 0);
	assert_int_equal(hpud__conf_count_devices(&c, asked, note, sizeof note, err, sizeof err), 0);
	assert_int_equal(c.devices, cores > 1024 ? 1024 : cores);
	assert_int_equal(access(called, F_OK), -1); /* cpu: the worker is not asked */
	assert_int_equal(load_text(&c, "devices = 7\ndevice = cuda\n", path, err, sizeof err), 0);
	assert_int_equal(hpud__conf_count_devices(&c, none, note, sizeof note, err, sizeof err), 0);
	assert_int_equal(c.devices, 7);
	assert_string_equal(note, "");
	assert_int_equal(load_text(&c, "device = gpu\n", path, err, sizeof err), -1);
	assert_non_null(strstr(err, "bad value for key 'device': 'gpu' is not a device (cpu, "
				    "cpu-strict, cuda or auto)"));
	/* the real worker of this build where no GPU is: the reason hpulaunch gives */
	const char *build = getenv("HPU_BUILD_DIR");
	char real[512];
	snprintf(real, sizeof real, "%s/bin/hpu-worker", build ? build : ".");
	if (access(real, X_OK) == 0 && access("/dev/nvidiactl", F_OK) != 0) {
		int ngpus = 0, d = 0;
		char why[512] = "", launcher[700];
		hpu__gpus_count(real, &ngpus, why, sizeof why);
		assert_int_equal(hpu__gpus_devices(HPU_COUNT_GPUS, ngpus, why, cores, &d, launcher,
						   sizeof launcher), -1);
		assert_int_equal(load_text(&c, "devices = auto\n", path, err, sizeof err), 0);
		assert_int_equal(hpud__conf_count_devices(&c, real, note, sizeof note, err, sizeof err), -1);
		printf("  hpulaunch: %s\n  hpud:      %s\n", launcher, err);
		const char *tail = launcher + strlen("--devices auto --device cuda: ");
		assert_true(!strncmp(launcher, "--devices auto --device cuda: ", tail - launcher));
		assert_string_equal(err + strlen("devices = auto, device = cuda: "), tail);
	} else {
		printf("  %s not built, or NVIDIA's driver is here: the real worker's reason not checked\n",
		       real);
	}
	snprintf(body, sizeof body, "rm -rf '%s'", dir);
	assert_int_equal(system(body), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_defaults),
		cmocka_unit_test(test_full_file),
		cmocka_unit_test(test_partial_file_keeps_the_rest),
		cmocka_unit_test(test_comments_and_whitespace),
		cmocka_unit_test(test_bounds_accepted),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_log_level_names),
		cmocka_unit_test(test_too_long),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test(test_unchanged_on_failure),
		cmocka_unit_test(test_devices_auto),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
