/* Integration tests of the workers' live status (HPU_STATUS_FD), the
 * progress bar and `hpulaunch --status`'s per-rank table:
 *
 * - the status line parser and the bar's text (widths, what is dropped);
 * - the MLP under hpulaunch on a pseudo-terminal: bar frames ("\r",
 *   "step N/60", "%", "ETA", "\x1b[K") no wider than the terminal, the
 *   final log line kept, the bar cleared at the end; the same run into a
 *   pipe, and with --progress never on a terminal: no bar at all;
 * - a worker (a shell script, --exec) that writes malformed status lines
 *   between good ones: they are ignored, the good ones drawn, the job ends
 *   well; --progress with a bad value is refused;
 * - a real hpud: ranks that have not reported show "-"; then both ranks'
 *   step, loss and memory in `hpulaunch --status`; the submitter on a
 *   terminal draws rank 0's bar from hpud's Progress messages; Ctrl-C
 *   clears it and ends the job cleanly. Needs root (hpud runs the workers
 *   as 'nobody'). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent/agent.h"
#include "tests/harness.h"
#include "agent/progress.h"

#define LAUNCH h_build("bin/hpulaunch")
#define HPUD h_build("bin/hpud")
#define MODEL h_build("lib/fmnist_mlp.so")
#define PTY_COLS 120

static char dir[64];
/* hpud and the submitter of the last test: stopped by teardown too when
 * an assertion ends the test early */
static proc daemon_proc, sub;


/* ---- a process on a pseudo-terminal, read through harness.h ---- */

/* Starts argv on a new pseudo-terminal PTY_COLS wide with TERM=xterm
 * (plus env); p->out_fd is the terminal's master side, so h_wait and
 * h_wait_for read what the program writes to it. */
static void pty_start(proc *p, char *const argv[], char *const env[])
{
	memset(p, 0, sizeof *p);
	struct winsize ws = {.ws_row = 40, .ws_col = PTY_COLS};
	int master;
	p->pid = forkpty(&master, NULL, NULL, &ws);
	assert_true(p->pid >= 0);
	if (p->pid == 0) { /* a session of its own: kill(-pid) reaches all */
		putenv("TERM=xterm");
		for (int i = 0; env && env[i]; i++)
			putenv(env[i]);
		execv(argv[0], argv);
		fprintf(stderr, "cannot execute %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	p->out_fd = master;
	fcntl(master, F_SETFL, O_NONBLOCK);
	p->cap = 4096;
	p->out = calloc(1, p->cap);
	assert_non_null(p->out);
}

/* Runs argv on a terminal to its end (bounded); returns its exit code. */
static int pty_run(proc *p, char *const argv[], char *const env[], int timeout_ms)
{
	pty_start(p, argv, env);
	if (h_wait(p, timeout_ms) < 0) {
		fprintf(stderr, "%s still running after %d ms; killed. Output:\n%s\n", argv[0],
			timeout_ms, p->out);
		h_kill(p);
		return -1;
	}
	return h_code(p);
}

/* ---- what a terminal got ---- */

/* The bar frames in out: the texts between "\r" and "\x1b[K" (not the
 * bare "\r\x1b[K" that clears). Checks each fits the terminal and holds
 * the parts of a bar; returns how many, with the last in last. */
static int bar_frames(const char *out, char *last, size_t lastlen)
{
	int n = 0;
	for (const char *p = out; (p = strstr(p, "\x1b[K")); p += 3) {
		const char *cr = p;
		while (cr > out && cr[-1] != '\r')
			cr--;
		if (cr == out || cr == p)
			continue; /* a clear */
		size_t len = (size_t)(p - cr);
		char frame[512];
		assert_true(len < sizeof frame);
		memcpy(frame, cr, len);
		frame[len] = 0;
		if (len > PTY_COLS - 1)
			fail_msg("a bar frame of %zu columns on a %d-column terminal: %s", len,
				 PTY_COLS, frame);
		assert_non_null(strstr(frame, "step "));
		assert_non_null(strchr(frame, '%'));
		snprintf(last, lastlen, "%s", frame);
		n++;
	}
	return n;
}

/* hpulaunch -q [--progress extra] --devices 2 --no-eval --log-every 20
 * --epochs 3 --max-steps 60 --batch-size 64 MLP (about a second of
 * training, all of it in epoch 1 of 3) */
static void mlp_argv(char **a, const char *extra)
{
	int n = 0;
	a[n++] = (char *)LAUNCH;
	a[n++] = "-q";
	if (extra) {
		a[n++] = "--progress";
		a[n++] = (char *)extra;
	}
	const char *rest[] = {"--devices", "2", "--no-eval", "--log-every", "20", "--epochs", "3",
			      "--max-steps", "60", "--batch-size", "64", MODEL, NULL};
	for (int i = 0; rest[i]; i++)
		a[n++] = (char *)rest[i];
	a[n] = NULL;
}

/* ---- the parser and the bar's text ---- */

static void test_parse_and_format(void **state)
{
	(void)state;
	hpu_status_rec st;
	const char *good = "S1 220 600 1 2 0.412345 4711.2 83 31138816 31457280 12637536256 0";
	assert_int_equal(hpu__status_parse(good, strlen(good), &st), 0);
	assert_int_equal(st.step, 220);
	assert_int_equal(st.total, 600);
	assert_int_equal(st.epoch, 1);
	assert_int_equal(st.epochs, 2);
	assert_true(fabs(st.loss - 0.412345) < 1e-9);
	assert_true(fabs(st.samples_per_sec - 4711.2) < 1e-9);
	assert_true(fabs(st.eta_s - 83) < 1e-9);
	assert_true(st.mem_in_use == 31138816u && st.mem_max == 31457280u &&
		    st.mem_limit == 12637536256ull);
	assert_int_equal(st.phase, 0);
	const char *nan_loss = "S1 3 10 1 1 -nan 0 -1 1 2 3 2";
	assert_int_equal(hpu__status_parse(nan_loss, strlen(nan_loss), &st), 0);
	assert_true(isnan(st.loss));
	assert_int_equal(st.phase, 2);
	const char *setup = "S1 0 20 1 1 0 0 -1 0 0 0 3";
	assert_int_equal(hpu__status_parse(setup, strlen(setup), &st), 0);
	assert_int_equal(st.phase, HPU_PHASE_SETUP);
	/* a checkpoint being saved after step 3: a rank that stops answering
	 * then is said to be saving it (it was "in step 4") */
	const char *save = "S1 3 30 1 1 0.5 0 -1 0 0 0 4";
	assert_int_equal(hpu__status_parse(save, strlen(save), &st), 0);
	assert_int_equal(st.phase, HPU_PHASE_SAVE);
	char pos[96];
	hpu__describe_position(st.step, st.total, st.phase, pos, sizeof pos);
	assert_string_equal(pos, "while saving the checkpoint of step 3 of 30");
	char line[200];
	hpu__progress_format(&st, 120, line, sizeof line);
	assert_non_null(strstr(line, "saving a checkpoint"));
	const char *past = "S1 3 30 1 1 0.5 0 -1 0 0 0 5";
	assert_int_not_equal(hpu__status_parse(past, strlen(past), &st), 0);
	/* a blame line: which rank this worker's failure is due to */
	int culprit = -1;
	hpu_blame how = HPU_BLAME_FAILED;
	assert_int_equal(hpu__status_parse_blame("B1 3 died", 9, &culprit, &how), 0);
	assert_true(culprit == 3 && how == HPU_BLAME_DIED);
	assert_int_equal(hpu__status_parse_blame("B1 12 silent", 12, &culprit, &how), 0);
	assert_true(culprit == 12 && how == HPU_BLAME_SILENT);
	assert_int_equal(hpu__status_parse_blame("B1 0 failed", 11, &culprit, &how), 0);
	assert_true(culprit == 0 && how == HPU_BLAME_FAILED);
	const char *bad_blame[] = {"B1", "B1 3", "B1 -1 died", "B1 3 dead", "B1 3 died x",
				   "B2 3 died", "S1 3 died"};
	for (size_t i = 0; i < sizeof bad_blame / sizeof *bad_blame; i++)
		if (hpu__status_parse_blame(bad_blame[i], strlen(bad_blame[i]), &culprit, &how) == 0)
			fail_msg("malformed blame line accepted: \"%s\"", bad_blame[i]);
	/* an error line: the sentence the worker's error exit is for */
	char why[16];
	assert_int_equal(hpu__status_parse_error("E1 no such file", 15, why, sizeof why), 0);
	assert_string_equal(why, "no such file");
	assert_int_equal(hpu__status_parse_error("E1 a long sentence cut", 22, why, 8), 0);
	assert_string_equal(why, "a long ");
	const char *bad_error[] = {"E1", "E1 ", "E2 why", "B1 3 died"};
	for (size_t i = 0; i < sizeof bad_error / sizeof *bad_error; i++)
		if (hpu__status_parse_error(bad_error[i], strlen(bad_error[i]), why, sizeof why) == 0)
			fail_msg("malformed error line accepted: \"%s\"", bad_error[i]);
	const char *bad[] = {"",
			     "S1",
			     "S2 1 2 1 1 0.5 1 1 1 1 1 0",
			     "S1 1 2 1 1 0.5 1 1 1 1 1",       /* a field short */
			     "S1 1 2 1 1 0.5 1 1 1 1 1 0 9",   /* one too many */
			     "S1 1 2 1 1 0.5x 1 1 1 1 1 0",    /* not a number */
			     "S1 -1 2 1 1 0.5 1 1 1 1 1 0",    /* negative step */
			     "S1 1 2 1 1 0.5 1 1 -1 1 1 0",    /* negative memory */
			     "S1 1 2 1 1 0.5 1 1 1 1 1 5",     /* no such phase */
			     "S1 99999999999999999999 2 1 1 0.5 1 1 1 1 1 0"};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		st.step = 42;
		if (hpu__status_parse(bad[i], strlen(bad[i]), &st) == 0)
			fail_msg("malformed status line accepted: \"%s\"", bad[i]);
		assert_int_equal(st.step, 42); /* untouched */
	}

	hpu_status_rec r = {.step = 220, .total = 600, .epoch = 1, .epochs = 2, .loss = 0.4123,
			     .samples_per_sec = 4711.2, .eta_s = 83, .phase = 0};
	char out[512];
	size_t n = hpu__progress_format(&r, 100, out, sizeof out);
	printf("  %s\n", out);
	assert_int_equal(n, 100); /* the bar takes what the words leave */
	assert_int_equal(strlen(out), n);
	assert_memory_equal(out, "epoch 1/2 [", 11);
	assert_non_null(strstr(out, "] 36% step 220/600 loss 0.4123 4711.2 samples/s ETA 0:01:23"));
	const char *bar = strchr(out, '[') + 1, *end = strchr(out, ']');
	int hashes = 0;
	for (const char *c = bar; c < end; c++)
		hashes += *c == '#';
	assert_int_equal(hashes, (int)((end - bar) * 220 / 600));
	/* narrower: the throughput goes first, then the loss, then the epoch */
	n = hpu__progress_format(&r, 70, out, sizeof out);
	printf("  %s\n", out);
	assert_true(n <= 70);
	assert_null(strstr(out, "samples/s"));
	assert_non_null(strstr(out, "loss 0.4123"));
	n = hpu__progress_format(&r, 30, out, sizeof out);
	printf("  %s\n", out);
	assert_true(n <= 30);
	assert_non_null(strstr(out, "step 220/600"));
	/* before a step is measured: no loss yet (NaN, no rate) and no ETA;
	 * a NaN loss with a rate is a diverged step, shown */
	const char *first = "S1 0 60 1 1 nan 0 -1 0 0 0 0";
	hpu_status_rec f0;
	assert_int_equal(hpu__status_parse(first, strlen(first), &f0), 0);
	hpu__progress_format(&f0, 120, out, sizeof out);
	printf("  %s\n", out);
	assert_null(strstr(out, "loss"));
	assert_non_null(strstr(out, "ETA ?"));
	f0.samples_per_sec = 100;
	hpu__progress_format(&f0, 120, out, sizeof out);
	assert_non_null(strstr(out, "loss nan"));
	/* unknown ETA, evaluation, the end */
	r.eta_s = -1;
	hpu__progress_format(&r, 120, out, sizeof out);
	assert_non_null(strstr(out, "ETA ?"));
	r.phase = 1;
	hpu__progress_format(&r, 120, out, sizeof out);
	assert_non_null(strstr(out, "evaluating"));
	r.phase = HPU_PHASE_SETUP;
	hpu__progress_format(&r, 120, out, sizeof out);
	assert_non_null(strstr(out, "setting up"));
	r.phase = 2;
	r.step = 600;
	hpu__progress_format(&r, 120, out, sizeof out);
	assert_non_null(strstr(out, "] 100% step 600/600"));
	assert_non_null(strstr(out, "done"));
	for (const char *c = strchr(out, '[') + 1; *c != ']'; c++)
		assert_int_equal(*c, '#'); /* all filled */
}

/* ---- local runs of the MLP ---- */

static void test_bar_on_terminal(void **state)
{
	(void)state;
	char *a[32];
	mlp_argv(a, NULL);
	proc p;
	int code = pty_run(&p, a, NULL, 240000);
	if (code != 0)
		fail_msg("exit %d; output:\n%s", code, p.out);
	char last[512] = "";
	int frames = bar_frames(p.out, last, sizeof last);
	printf("  %d bar frames; the last: %s\n", frames, last);
	assert_true(frames >= 2);
	assert_non_null(strstr(p.out, "ETA "));
	assert_non_null(strstr(p.out, "/60 loss "));
	/* --max-steps 60 wins over --epochs 3 (as in the HF Trainer): 60
	 * steps are one epoch's worth, so the run has one epoch */
	assert_non_null(strstr(p.out, "epoch 1/1 ["));
	assert_non_null(strstr(last, "epoch 1/1"));
	assert_null(strstr(p.out, "epoch 1/3"));
	/* before the first step ends: epoch 1, no loss, no ETA made up (it
	 * drew "epoch 0/1 ... loss 0.0000 ETA 0:00:00") */
	assert_null(strstr(p.out, "epoch 0/"));
	for (const char *f = p.out; (f = strstr(f, "step 0/60")); f++) {
		size_t n = strcspn(f, "\r\n");
		char frame[256];
		snprintf(frame, sizeof frame, "%.*s", (int)(n < 255 ? n : 255), f);
		if (strstr(frame, "loss") || strstr(frame, "ETA 0:"))
			fail_msg("a frame before the first step's end: %s", frame);
	}
	/* the log lines stay, the bar is gone at the end */
	assert_non_null(strstr(p.out, "[rank 0] epoch 1/1 step 60/60 loss"));
	const char *fin = strstr(p.out, "[rank 0] trained 60 steps on 2 workers");
	assert_non_null(fin);
	const char *clear = NULL;
	for (const char *c = p.out; (c = strstr(c, "\r\x1b[K")); c += 4)
		clear = c;
	assert_non_null(clear);
	assert_null(strstr(clear + 4, "\x1b[K")); /* nothing drawn after it */
	assert_true(strlen(clear + 4) == 0 || clear > fin);
	h_free(&p);
}

static void test_no_bar_on_pipe(void **state)
{
	(void)state;
	char *a[32];
	mlp_argv(a, NULL);
	proc p;
	char *env[] = {"TERM=xterm", NULL};
	int code = h_run(&p, a, env, 240000);
	if (code != 0)
		fail_msg("exit %d; output:\n%s", code, p.out);
	assert_null(strchr(p.out, '\r'));
	assert_null(strstr(p.out, "\x1b["));
	assert_null(strstr(p.out, "ETA"));
	assert_non_null(strstr(p.out, "[rank 0] epoch 1/1 step 20/60 loss"));
	assert_non_null(strstr(p.out, "[rank 0] trained 60 steps on 2 workers"));
	h_free(&p);
}

static void test_never_on_terminal(void **state)
{
	(void)state;
	char *a[32];
	mlp_argv(a, "never");
	proc p;
	int code = pty_run(&p, a, NULL, 240000);
	if (code != 0)
		fail_msg("exit %d; output:\n%s", code, p.out);
	assert_null(strstr(p.out, "\x1b["));
	assert_null(strstr(p.out, "ETA"));
	assert_null(strstr(p.out, "\r\r")); /* only the terminal's \r\n */
	assert_non_null(strstr(p.out, "[rank 0] trained 60 steps on 2 workers"));
	h_free(&p);
	/* and a dumb terminal under auto */
	char *env[] = {"TERM=dumb", NULL};
	mlp_argv(a, NULL);
	code = pty_run(&p, a, env, 240000);
	assert_int_equal(code, 0);
	assert_null(strstr(p.out, "\x1b["));
	h_free(&p);
}

/* A worker of our own (--exec) writes good and malformed records. */
static void test_malformed_records(void **state)
{
	(void)state;
	char script[128], text[2048], longline[700];
	memset(longline, '7', sizeof longline - 1);
	longline[sizeof longline - 1] = 0;
	snprintf(script, sizeof script, "%s/status-worker.sh", dir);
	snprintf(text, sizeof text,
		 "#!/bin/sh\n"
		 "[ \"$RANK\" = 0 ] || exit 0\n"
		 "echo \"status on fd $HPU_STATUS_FD\"\n"
		 "s=$HPU_STATUS_FD\n"
		 "echo 'S1 3 9 1 2 0.125 10.5 60 1048576 2097152 4194304 0' >&$s\n"
		 "sleep 1.5\n" /* step 3's frame drawn, even on a loaded machine */
		 "echo 'not a record' >&$s\n"
		 "echo 'S1 5 9 1 2 0.99 10.5 40 1 2 3 0 junk' >&$s\n"
		 "echo 'S1 6 9 1 2' >&$s\n"
		 "echo '%s' >&$s\n"
		 "printf 'S1 7 9 2 2 0.25 20.5 20 1048576 2097152 4194304 0\\n' >&$s\n"
		 "sleep 0.6\n"
		 "echo 'still here'\n"
		 "sleep 0.4\n",
		 longline);
	assert_int_equal(h_write_file(script, text, 0755), 0);
	char *a[] = {(char *)LAUNCH, "-q", "--devices", "2", "--exec", script, NULL};
	proc p;
	int code = pty_run(&p, a, NULL, 60000);
	printf("%s", p.out);
	assert_int_equal(code, 0);
	assert_non_null(strstr(p.out, "[rank 0] status on fd 3"));
	assert_non_null(strstr(p.out, "[rank 0] still here"));
	char last[512] = "";
	int frames = bar_frames(p.out, last, sizeof last);
	assert_true(frames >= 2);
	assert_non_null(strstr(p.out, "epoch 1/2 ["));
	assert_non_null(strstr(p.out, "] 33% step 3/9 loss 0.1250 10.5 samples/s ETA 0:01:00"));
	assert_non_null(strstr(last, "epoch 2/2 ["));
	assert_non_null(strstr(last, "] 77% step 7/9 loss 0.2500 20.5 samples/s ETA 0:00:20"));
	assert_null(strstr(p.out, "step 5/9"));
	assert_null(strstr(p.out, "step 6/9"));
	assert_null(strstr(p.out, "777"));
	assert_non_null(strstr(p.out, "hpulaunch: warning: 4 malformed status lines from the workers were ignored"));
	h_free(&p);
	/* --progress takes three words */
	char *b[] = {(char *)LAUNCH, "--progress", "sometimes", "--exec", script, NULL};
	assert_int_equal(h_run(&p, b, NULL, 10000), 2);
	assert_non_null(strstr(p.out, "--progress takes auto, always or never, not 'sometimes'"));
	h_free(&p);
	/* always: a bar even into a pipe */
	char *c[] = {(char *)LAUNCH, "-q", "--progress", "always", "--devices", "1", "--exec",
		     script, NULL};
	assert_int_equal(h_run(&p, c, NULL, 60000), 0);
	assert_non_null(strstr(p.out, "step 7/9"));
	assert_non_null(strstr(p.out, "\x1b[K"));
	h_free(&p);
	unlink(script);
}

/* ---- through hpud ---- */

typedef struct rank_row {
	int seen, reported, setup;
	long step, total;
	int epoch, epochs;
	double loss, sps, mem, max, limit, age;
} rank_row;

/* Runs `hpulaunch --status` and reads its rows of ranks 0 and 1. */
static void status_rows(const char *target, const char *key, rank_row rows[2], char **text)
{
	char *argv[] = {(char *)LAUNCH, "--status", (char *)target, "--key", (char *)key, NULL};
	proc s;
	if (h_run(&s, argv, NULL, 20000) != 0)
		fail_msg("hpulaunch --status failed:\n%s", s.out);
	char *copy = strdup(s.out), *save = NULL;
	assert_non_null(copy);
	memset(rows, 0, 2 * sizeof *rows);
	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		unsigned rank;
		char steps[64];
		int used;
		if (sscanf(line, " %u %63s%n", &rank, steps, &used) != 2 || rank > 1 ||
		    line[0] != ' ')
			continue;
		rank_row *r = &rows[rank];
		r->seen = 1;
		if (!strcmp(steps, "-")) { /* not reported: "-" in every column */
			if (strspn(line + used, " -") != strlen(line + used))
				fail_msg("a rank that has not reported: %s", line);
			continue;
		}
		r->reported = 1;
		if (strstr(line, "setting up")) { /* '-' for the figures it has not */
			r->setup = 1;
			if (sscanf(steps, "%ld/%ld", &r->step, &r->total) != 2)
				fail_msg("a rank's row does not parse: %s", line);
			continue;
		}
		if (sscanf(steps, "%ld/%ld", &r->step, &r->total) != 2 ||
		    sscanf(line + used, " %d/%d %lf %lf %lf %lf %lf %lf", &r->epoch, &r->epochs,
			   &r->loss, &r->sps, &r->mem, &r->max, &r->limit, &r->age) != 8)
			fail_msg("a rank's row does not parse: %s", line);
	}
	free(copy);
	if (text)
		*text = strdup(s.out);
	h_free(&s);
}

static void test_status_and_bar_through_hpud(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		printf("  needs root (hpud runs the workers as nobody): skipped\n");
		skip();
	}
	char key[128], conf[128], hostfile[128], wrapper[128], text[1024], target[64];
	snprintf(key, sizeof key, "%s/secret.key", dir);
	snprintf(conf, sizeof conf, "%s/hpud.conf", dir);
	snprintf(hostfile, sizeof hostfile, "%s/hostfile", dir);
	snprintf(wrapper, sizeof wrapper, "%s/slow-start.sh", dir);
	proc p;
	char *gen[] = {(char *)HPUD, "--gen-key", key, NULL};
	assert_int_equal(h_run(&p, gen, NULL, 10000), 0);
	h_free(&p);
	int port = h_free_port();
	/* the workers wait a moment first, so that the first --status finds
	 * them not yet reporting */
	snprintf(text, sizeof text, "#!/bin/sh\nsleep 3\nexec %s \"$@\"\n",
		 h_build("bin/hpu-worker"));
	assert_int_equal(h_write_file(wrapper, text, 0755), 0);
	snprintf(text, sizeof text,
		 "listen = 127.0.0.1\nport = %d\ndevices = 2\nkey = %s\nuser = nobody\n"
		 "log_level = info\nworker = %s\n",
		 port, key, wrapper);
	assert_int_equal(h_write_file(conf, text, 0644), 0);
	snprintf(text, sizeof text, "127.0.0.1:%d slots=2\n", port);
	assert_int_equal(h_write_file(hostfile, text, 0644), 0);
	snprintf(target, sizeof target, "127.0.0.1:%d", port);
	char *dargv[] = {(char *)HPUD, "-c", conf, NULL};
	assert_int_equal(h_start(&daemon_proc, dargv, NULL), 0);
	assert_int_equal(h_wait_for(&daemon_proc, "listening on", 10000), 0);

	char *sargv[] = {(char *)LAUNCH, "--hostfile", hostfile, "--key", key, "--log-every", "50",
			 "--epochs", "100", "--max-steps", "50000", "--batch-size", "64", "--no-eval",
			 (char *)MODEL, NULL};
	pty_start(&sub, sargv, NULL);
	assert_int_equal(h_wait_for(&sub, "through hpud", 30000), 0);
	rank_row rows[2];
	char *table;
	status_rows(target, key, rows, &table);
	printf("%s", table);
	assert_true(rows[0].seen && rows[1].seen);
	assert_false(rows[0].reported || rows[1].reported);
	assert_non_null(strstr(table, "memory_allocated MiB"));
	assert_non_null(strstr(table, "total_memory_available MiB"));
	free(table);

	/* both ranks under way: step > 0, a finite loss, memory in use */
	int ok = 0;
	for (int i = 0; i < 600 && !ok; i++) {
		h_wait(&sub, 0);
		if (sub.exited) /* it must not end before we see it */
			fail_msg("the submitter ended (%d) before both ranks reported:\n%s\nhpud:\n%s",
				 h_code(&sub), sub.out, daemon_proc.out);
		h_wait_for(&sub, "\x7f", 200); /* reads the terminal meanwhile */
		h_wait(&daemon_proc, 0);
		status_rows(target, key, rows, NULL);
		ok = rows[0].reported && rows[1].reported && rows[0].step > 0 &&
		     rows[1].step > 0;
	}
	status_rows(target, key, rows, &table);
	printf("%s", table);
	free(table);
	assert_true(ok);
	for (int k = 0; k < 2; k++) {
		rank_row *r = &rows[k];
		/* any epoch: a fast machine is past the first (468 steps) by
		 * the time both ranks have been seen reporting */
		assert_true(r->step > 0 && r->step < 50000);
		assert_int_equal(r->total, 50000);
		assert_true(r->epochs >= 1);
		assert_true(r->epoch >= 1 && r->epoch <= r->epochs);
		assert_true(isfinite(r->loss) && r->loss > 0 && r->loss < 10);
		assert_true(r->sps >= 0);
		assert_true(r->mem > 0);
		assert_true(r->max >= r->mem);
		assert_true(r->limit > r->max);
		assert_true(r->age >= 0 && r->age < 60);
	}

	/* the submitter's terminal has rank 0's bar, from hpud's Progress */
	char last[512] = "";
	int frames = 0;
	for (int i = 0; i < 300 && frames < 3; i++) {
		h_wait_for(&sub, "\x7f", 100);
		frames = bar_frames(sub.out, last, sizeof last);
	}
	printf("  submitter: %d bar frames; the last: %s\n", frames, last);
	assert_true(frames >= 3);
	assert_non_null(strstr(last, "/50000 loss "));
	assert_non_null(strstr(last, "ETA "));

	/* Ctrl-C ends it cleanly: the bar is cleared, the workers gone */
	kill(sub.pid, SIGINT);
	assert_int_equal(h_wait(&sub, 30000), 0);
	assert_int_equal(h_code(&sub), 128 + SIGINT);
	const char *intr = strstr(sub.out, "hpulaunch: interrupted by SIGINT");
	assert_non_null(intr);
	assert_true(intr > sub.out + 4 && !strncmp(intr - 4, "\r\x1b[K", 4));
	assert_null(strstr(intr, "\x1b[K\r"));
	h_free(&sub);
	memset(&sub, 0, sizeof sub);
	pid_t kids[4];
	int gone = 0;
	for (int i = 0; i < 600 && !gone; i++) { /* a minute at most */
		h_wait(&daemon_proc, 100);
		gone = h_children(daemon_proc.pid, kids, 4) == 0;
	}
	assert_true(gone);
	assert_int_equal(h_wait_for(&daemon_proc, "cancelled by the submitter", 5000), 0);
	status_rows(target, key, rows, &table);
	assert_non_null(strstr(table, "2 devices, 2 free, 0 jobs"));
	free(table);
	kill(daemon_proc.pid, SIGTERM);
	assert_int_equal(h_wait(&daemon_proc, 15000), 0);
	assert_int_equal(h_code(&daemon_proc), 0);
	h_free(&daemon_proc);
	memset(&daemon_proc, 0, sizeof daemon_proc);
	unlink(wrapper);
}

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof dir, "/tmp/hpu-progress-XXXXXX");
	assert_non_null(mkdtemp(dir));
	chmod(dir, 0755); /* the workers run as nobody */
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	proc *left[] = {&sub, &daemon_proc};
	for (int i = 0; i < 2; i++)
		if (left[i]->pid > 0) {
			h_kill(left[i]);
			h_free(left[i]);
		}
	char cmd[128];
	snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
	return system(cmd) == 0 ? 0 : -1;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_parse_and_format),
		cmocka_unit_test(test_malformed_records),
		cmocka_unit_test(test_bar_on_terminal),
		cmocka_unit_test(test_no_bar_on_pipe),
		cmocka_unit_test(test_never_on_terminal),
		cmocka_unit_test(test_status_and_bar_through_hpud),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
