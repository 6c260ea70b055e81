/* Every program's log lines (common/log.h) carry journald's priorities
 * ("<3>" error ... "<7>" debug) when JOURNAL_STREAM names their stderr,
 * as systemd sets it for StandardError=journal, and nowhere else: not
 * without JOURNAL_STREAM, not when it names another stream. The programs:
 * hpulaunch (its start-up line, a rank's failure), hpu-worker, hpud,
 * hpu-ckpt, hpu-trace and hpu-plot, each on a line it prints at once.
 * HPU_LOG_LEVEL and --log-level (hpulaunch, hpud, the tools) drop the
 * lines above the level; a bad level is refused, naming it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/harness.h"

/* How JOURNAL_STREAM is set for a run. */
enum { JOURNAL, UNSET, OTHER };

/* One program's run and the lines it must print (without priority). */
typedef struct prog_case {
	const char *name;
	const char *argv[12]; /* argv[0] under the build tree */
	const char *env;      /* one more "K=V", or NULL */
	int code;             /* its exit code */
	struct {
		int prio;
		const char *text; /* the start of a line */
	} lines[3];
} prog_case;

static const prog_case cases[] = {
	{"hpulaunch", {"bin/hpulaunch", "--devices", "1", "--exec", "sh", "-c", "exit 3", NULL}, NULL, 1,
	 {{6, "hpulaunch: job "}, {3, "hpulaunch: error: rank 0 (node 0, pid "}}},
	{"hpulaunch", {"bin/hpulaunch", "--devices", "1", "--bogus", NULL}, NULL, 2,
	 {{3, "hpulaunch: error: unknown option --bogus"}}},
	{"hpu-worker", {"bin/hpu-worker", "--bogus", NULL}, "RANK=3", 2,
	 {{3, "hpu-worker: rank 3: unknown option --bogus"}}},
	{"hpud", {"bin/hpud", "--log-level", "loud", NULL}, NULL, 2,
	 {{3, "hpud: error: --log-level: 'loud' is not a log level (error, warning, notice, info or "
	      "debug)"}}},
	{"hpu-ckpt", {"bin/hpu-ckpt", "info", "/nonexistent-hpu-ckpt", NULL}, NULL, 1,
	 {{3, "hpu-ckpt: error: /nonexistent-hpu-ckpt: "}}},
	{"hpu-ckpt", {"bin/hpu-ckpt", NULL}, NULL, 2,
	 {{3, "hpu-ckpt: which command? (info, verify, export, reshard)"},
	  {3, "(hpu-ckpt --help for the usage)"}}},
	{"hpu-ckpt", {"bin/hpu-ckpt", "info", "--log-level", "loud", "x", NULL}, NULL, 2,
	 {{3, "hpu-ckpt: --log-level: 'loud' is not a log level (error, warning, notice, info or debug)"},
	  {3, "(hpu-ckpt --help for the usage)"}}},
	{"hpu-trace", {"bin/hpu-trace", "--bogus", NULL}, NULL, 2, {{3, "hpu-trace: "}}},
	{"hpu-plot", {"bin/hpu-plot", "--bogus", NULL}, NULL, 2, {{3, "hpu-plot: "}}},
};

/* Runs c with JOURNAL_STREAM as `how` says (the stream is the harness's
 * pipe, stdout and stderr together); returns the output (caller frees). */
static char *run_case(const prog_case *c, int how, const char *env_extra)
{
	static const char *const wrap[] = {
		[JOURNAL] = "export JOURNAL_STREAM=$(stat -L -c %d:%i /proc/self/fd/2) && exec \"$0\" \"$@\"",
		[UNSET] = "unset JOURNAL_STREAM; exec \"$0\" \"$@\"",
		[OTHER] = "export JOURNAL_STREAM=1:1; exec \"$0\" \"$@\"",
	};
	char *argv[16] = {"/bin/sh", "-c", (char *)wrap[how], (char *)h_build(c->argv[0])};
	int n = 4;
	for (int i = 1; c->argv[i]; i++)
		argv[n++] = (char *)c->argv[i];
	argv[n] = NULL;
	char *env[3] = {(char *)c->env, NULL, NULL};
	if (!c->env)
		env[0] = (char *)env_extra;
	else
		env[1] = (char *)env_extra;
	proc p;
	int code = h_run(&p, argv, env, 60000);
	printf("-- %s (%s):\n%s", c->name, how == JOURNAL ? "journal" : how == UNSET ? "unset" : "other",
	       p.out);
	assert_int_equal(code, c->code);
	char *out = strdup(p.out);
	h_free(&p);
	return out;
}

/* Whether a line of out starts with `text`, after "<prio>" (prio >= 0)
 * or at the line's start (prio < 0). */
static int has_line(const char *out, int prio, const char *text)
{
	char want[512];
	if (prio >= 0)
		snprintf(want, sizeof want, "<%d>%s", prio, text);
	else
		snprintf(want, sizeof want, "%s", text);
	for (const char *l = out; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0))
		if (!strncmp(l, want, strlen(want)))
			return 1;
	return 0;
}

/* Whether every line of out but the workers' ("[rank N] ...", which
 * hpulaunch passes on) has a priority (journal) or none has one. */
static int lines_all(const char *out, int journal)
{
	for (const char *l = out; *l; l += strcspn(l, "\n") + (l[strcspn(l, "\n")] != 0)) {
		if (!strncmp(l, "[rank ", 6))
			continue;
		int prefixed = l[0] == '<' && l[1] >= '0' && l[1] <= '7' && l[2] == '>';
		if (prefixed != journal) {
			printf("  not %s: %.*s\n", journal ? "prefixed" : "plain", (int)strcspn(l, "\n"), l);
			return 0;
		}
	}
	return 1;
}

static void test_priorities_only_on_the_journal(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const prog_case *c = &cases[i];
		for (int how = JOURNAL; how <= OTHER; how++) {
			char *out = run_case(c, how, NULL);
			for (int k = 0; k < 3 && c->lines[k].text; k++) {
				int ok = has_line(out, how == JOURNAL ? c->lines[k].prio : -1, c->lines[k].text);
				if (!ok)
					printf("  missing: <%d>%s\n", c->lines[k].prio, c->lines[k].text);
				assert_true(ok);
			}
			assert_true(lines_all(out, how == JOURNAL));
			free(out);
		}
	}
}

/* HPU_LOG_LEVEL=error and --log-level error drop hpulaunch's start-up
 * line (info) and keep the rank's failure (error); a bad level is refused,
 * naming it. */
static void test_log_level(void **state)
{
	(void)state;
	const prog_case *c = &cases[0];
	char *out = run_case(c, JOURNAL, "HPU_LOG_LEVEL=error");
	assert_false(has_line(out, 6, "hpulaunch: job "));
	assert_true(has_line(out, 3, "hpulaunch: error: rank 0 (node 0, pid "));
	free(out);
	prog_case opt = {"hpulaunch",
			 {"bin/hpulaunch", "--log-level", "error", "--devices", "1", "--exec", "sh", "-c",
			  "exit 3", NULL},
			 NULL, 1, {{3, "hpulaunch: error: rank 0 (node 0, pid "}}};
	out = run_case(&opt, UNSET, NULL);
	assert_null(strstr(out, "hpulaunch: job "));
	assert_true(has_line(out, -1, "hpulaunch: error: rank 0 (node 0, pid "));
	free(out);
	prog_case bad = {"hpulaunch", {"bin/hpulaunch", "--devices", "1", "--exec", "true", NULL}, NULL,
			 2, {{0}}};
	out = run_case(&bad, UNSET, "HPU_LOG_LEVEL=loud");
	assert_true(has_line(out, -1,
			     "hpulaunch: error: HPU_LOG_LEVEL: 'loud' is not a log level (error, "
			     "warning, notice, info or debug)"));
	free(out);
	bad.argv[1] = "--log-level";
	bad.argv[2] = "verbose";
	out = run_case(&bad, UNSET, NULL);
	assert_true(has_line(out, -1,
			     "hpulaunch: error: --log-level: 'verbose' is not a log level (error, "
			     "warning, notice, info or debug)"));
	free(out);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_priorities_only_on_the_journal),
		cmocka_unit_test(test_log_level),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
