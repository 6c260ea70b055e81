/* crash: the worker's report of a fatal signal (crash.h). Only
 * async-signal-safe calls in the handler, except backtrace(), whose
 * library is loaded at install so that it does not allocate then. */
#include "worker/runtime/crash.h"

#include <execinfo.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "proto/status.h"
#include "worker/hpu/model.h"
#include "worker/runtime/loop.h" /* hpu__where */
#include "worker/ops/fp8.h"

static int crash_rank;
static const hpu_builder *crash_model;
static volatile pid_t model_tid; /* the thread that runs the layers */
static const hpu_builder *volatile in_setup; /* hpu__crash_in_setup */
static volatile pid_t setup_tid;
static char altstack[64 * 1024]; /* the main thread's stack overflow still reports (other
				  * threads' run the handler on their own stack) */

static const char *sig_name(int sig)
{
	switch (sig) {
	case SIGSEGV:
		return "Segmentation fault";
	case SIGBUS:
		return "Bus error";
	case SIGILL:
		return "Illegal instruction";
	case SIGFPE:
		return "Floating point exception";
	case SIGABRT:
		return "Aborted";
	default:
		return "fatal signal";
	}
}

/* "0x" and the hex digits of v into out (at least 19 bytes). */
static void hex(char *out, uintptr_t v)
{
	char tmp[16];
	int n = 0;
	do {
		tmp[n++] = "0123456789abcdef"[v & 15];
		v >>= 4;
	} while (v && n < 16);
	*out++ = '0', *out++ = 'x';
	while (n)
		*out++ = tmp[--n];
	*out = 0;
}

static void say(const char *a, const char *b, const char *c, const char *d, const char *e,
		const char *f)
{
	char line[512];
	size_t n = 0;
	const char *parts[] = {a, b, c, d, e, f};
	for (size_t i = 0; i < 6; i++)
		for (const char *p = parts[i]; p && *p && n < sizeof line - 1; p++)
			line[n++] = *p;
	line[n++] = '\n';
	if (write(2, line, n) < 0)
		return;
}

/* RLIMIT_AS in KiB where it is set (read at install: not in the handler) */
static char as_limit[32];

static void on_fatal(int sig, siginfo_t *si, void *uc)
{
	(void)uc;
	char who[48], addr[24];
	/* "hpu-worker: rank N" without printf's locks */
	char num[16];
	int n = 0, r = crash_rank < 0 ? 0 : crash_rank;
	do {
		num[n++] = (char)('0' + r % 10);
		r /= 10;
	} while (r && n < 15);
	size_t w = 0;
	for (const char *p = "hpu-worker: rank "; *p; p++)
		who[w++] = *p;
	while (n)
		who[w++] = num[--n];
	who[w] = 0;
	hex(addr, (uintptr_t)si->si_addr);
	const char *num_s = sig == SIGSEGV ? "11" : sig == SIGBUS ? "7" : sig == SIGILL ? "4"
			    : sig == SIGABRT ? "6" : "8";
	char tail[64];
	size_t t = 0;
	for (const char *p = sig_name(sig); *p && t < 40; p++)
		tail[t++] = *p;
	tail[t++] = ')';
	/* an address only where a fault has one: a signal sent (kill, raise;
	 * si_code <= 0) holds its sender's pid there */
	int has_addr = sig != SIGABRT && si->si_code > 0;
	if (has_addr)
		tail[t++] = ' ', tail[t++] = 'a', tail[t++] = 't', tail[t++] = ' ';
	tail[t] = 0;
	say(who, ": crashed: signal ", num_s, " (", tail, has_addr ? addr : NULL);
	if (sig == SIGABRT)
		say(who, ": abort() was called: a failed assert(), an uncaught C++ exception or a "
			 "library that gave up (its message, if it wrote one, is above)",
		    NULL, NULL, NULL, NULL);
	/* in a layer (hpu__op_layer_now: an atomic the ops set around each
	 * layer's call): which, and what it recorded */
	int backward = 0, l = hpu__op_layer_now(&backward);
	const hpu_builder *b = crash_model;
	/* that thread's fault only (the loader's thread runs the model's
	 * fetch while the layers run) */
	int here = (pid_t)syscall(SYS_gettid) == model_tid;
	const hpu_builder *sb = in_setup;
	if (sb && (pid_t)syscall(SYS_gettid) == setup_tid) {
		say(who, ": in the model's setup()", NULL, NULL, NULL, NULL);
		/* a declaration that failed before it (whose NULL the model
		 * then used, as often as not): the error setup would have
		 * returned */
		if (sb->status != 0 && sb->err[0])
			say(who, ": the setup's first recorded error: ", sb->err, NULL, NULL, NULL);
	}
	if (b && here && l >= 0 && l < b->nlayers && b->layers[l]) {
		const struct hpu_layer *ly = b->layers[l];
		say(who, ": in layer ", ly->name, backward ? "'s backward" : "'s forward", NULL, NULL);
		if (ly->err[0])
			say(who, ": layer ", ly->name, "'s last recorded error: ", ly->err, NULL);
	}
	/* an address-space limit: an allocation a library did not check
	 * (oneDNN's, under ulimit -v) faults at 0x0 with nothing else said */
	if (as_limit[0] && (sig == SIGSEGV || sig == SIGBUS))
		say(who, ": this process runs under ulimit -v ", as_limit,
		    " KiB: an allocation that failed where it was not checked may be the cause", NULL,
		    NULL);
	/* where it was, for its agent: the last rate-limited record may be
	 * steps behind */
	hpu__status_report_fatal(&hpu__where);
	say(who, ": backtrace:", NULL, NULL, NULL, NULL);
	void *bt[48];
	backtrace_symbols_fd(bt, backtrace(bt, 48), 2);
	/* SA_RESETHAND put the default action back: the fault repeats and
	 * ends the process with the signal (raise for one sent by kill) */
	if (si->si_code <= 0)
		raise(sig);
}

void hpu__crash_in_setup(const hpu_builder *b)
{
	setup_tid = (pid_t)syscall(SYS_gettid);
	in_setup = b;
}

void hpu__crash_report_model(const hpu_builder *b)
{
	model_tid = (pid_t)syscall(SYS_gettid);
	crash_model = b;
}

void hpu__crash_report_install(int rank)
{
	crash_rank = rank;
	struct rlimit rl;
	if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
		snprintf(as_limit, sizeof as_limit, "%llu", (unsigned long long)(rl.rlim_cur / 1024));
	void *warm[2];
	backtrace(warm, 2); /* loads libgcc_s now, not in the handler */
	stack_t ss;
	memset(&ss, 0, sizeof ss);
	ss.ss_sp = altstack;
	ss.ss_size = sizeof altstack;
	sigaltstack(&ss, NULL);
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_fatal;
	sa.sa_flags = SA_SIGINFO | SA_RESETHAND | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	static const int sigs[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
	for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++)
		sigaction(sigs[i], &sa, NULL);
}
