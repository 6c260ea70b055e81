/* hpud: the node daemon. It takes signed requests on a ZeroMQ ROUTER
 * socket (proto/auth.h) and runs each job's part on this node with the
 * same node-job code as hpulaunch (agent/nodejob.h), streaming the
 * workers' output back to the submitter and telling it when the part
 * ends. See --help and deploy/README.md.
 *
 * This file is its start-up: the options, the first configuration, the
 * loop. The rest is in files of their own (daemon/hpud.h says which
 * calls which): logging, the job table and devices (jobs.c), replies,
 * the socket and the requests (hello, launch, status, cancel, ping; each
 * bound to this instance of hpud, see proto/hpu.proto), the timers and
 * signals (control.c).
 *
 * Under systemd (deploy/hpud.service, Type=hpud__notify) hpud says READY=1
 * through sd_notify once its socket listens, RELOADING=1 and READY=1
 * around a SIGHUP, STOPPING=1 when it starts to stop, and its state in
 * STATUS=; outside systemd (no NOTIFY_SOCKET) those calls do nothing. Its
 * log lines carry journald's priority prefixes ("<3>" ...) when stderr is
 * the journal (JOURNAL_STREAM names it), and not on a terminal or a
 * file. */
#include <errno.h>
#include <ev.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "proto/auth.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/num.h"
#include "common/opt.h"
#include "common/optdoc.h"
#include "daemon/trust.h"
#include "daemon/hpud.h"

hpud_state hpud__D;

/* ---- start-up ---- */

enum { OPT_HELP = 1, OPT_GEN_KEY, OPT_CONFIG, OPT_CHECK, OPT_HELP_DOC, OPT_LOG_LEVEL };

/* The parser's table and the help's (--help, man/hpud.8, docs/reference). */
static const hpu_optspec specs[] = {
	{"config", 'c', HPU_OPT_VALUE, OPT_CONFIG, "FILE",
	 .help = "the configuration file, hpud.conf(5) (/etc/hpud/hpud.conf)"},
	{"check", 0, HPU_OPT_FLAG, OPT_CHECK, NULL,
	 .help = "check the configuration, the key and the worker program, then exit"},
	{"gen-key", 0, HPU_OPT_VALUE, OPT_GEN_KEY, "FILE",
	 .help = "make a new cluster secret in FILE (mode 0600) and exit"},
	{"log-level", 0, HPU_OPT_VALUE, OPT_LOG_LEVEL, "LEVEL",
	 .help = "error | warning | notice | info | debug: lines above it are not logged (the "
		 "configuration's log_level)",
	 .env = "HPU_LOG_LEVEL"},
	{"help", 'h', HPU_OPT_FLAG, OPT_HELP, NULL, .help = "this help"},
	/* the options' and the keys' documentation (man/, docs/reference/) */
	{"help-doc", 0, HPU_OPT_VALUE, OPT_HELP_DOC, .help = NULL},
	{0},
};

static void usage(FILE *f)
{
	fprintf(f, "usage: hpud [-c FILE]      run the node daemon (default /etc/hpud/hpud.conf)\n"
		   "       hpud --gen-key FILE  make a new cluster secret (mode 0600)\n"
		   "       hpud -c FILE --check check the configuration and the key, then exit\n"
		   "\n"
		   "options:\n");
	hpu__optdoc(f, specs, HPU_DOC_HELP, 22);
	fprintf(f, "\n"
		   "Logs go to stderr. SIGHUP reloads the configuration and the key;\n"
		   "SIGTERM cancels the running jobs and exits.\n");
}

/* --help-doc FORMAT: the options in FORMAT (help, scdoc, markdown), or
 * with conf-FORMAT the configuration file's keys. */
static int help_doc(const char *format)
{
	int conf = !strncmp(format, "conf-", 5);
	int how = hpu__optdoc_format(conf ? format + 5 : format);
	if (how < 0) {
		hpud__logmsg(HPUD_LOG_ERROR, "--help-doc takes [conf-]help, scdoc or markdown, not '%s'", format);
		return 2;
	}
	if (conf)
		hpud__conf_doc(stdout, how);
	else
		hpu__optdoc(stdout, specs, how, 22);
	return 0;
}

/* What --help, --help-doc or --gen-key printed must have reached standard
 * output (a full disk, a closed pipe would leave it short): rc, or 1 after
 * saying so. */
static int stdout_checked(int rc)
{
	if (fflush(stdout) == 0 && !ferror(stdout))
		return rc;
	hpud__logmsg(HPUD_LOG_ERROR, "cannot write the standard output: %s", strerror(errno));
	return rc ? rc : 1;
}

int main(int argc, char **argv)
{
	char err[1024];
	int check = 0;
	hpud__D.conf_path = "/etc/hpud/hpud.conf";
	setvbuf(stderr, NULL, _IOLBF, 0);
	signal(SIGPIPE, SIG_IGN);
	if (hpu__log_init(err, sizeof err, "hpud") < 0) {
		hpud__logmsg(HPUD_LOG_ERROR, "%s", err);
		return 2;
	}
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, specs);
	for (int r; (r = hpu__optparse_next(&p)) != HPU_OPT_END;) {
		if (r == OPT_HELP) {
			usage(stdout);
			return stdout_checked(0);
		} else if (r == OPT_HELP_DOC) {
			return stdout_checked(help_doc(p.val));
		} else if (r == OPT_GEN_KEY) {
			if (hpu__auth_gen_key(p.val, err, sizeof err) < 0) {
				hpud__logmsg(HPUD_LOG_ERROR, "%s", err);
				return 1;
			}
			/* its absolute path: hpud.conf's key = takes only one */
			char abs[PATH_MAX];
			printf("hpud: wrote a new cluster secret to %s (mode 0600); copy it to every node and to the submitters\n",
			       p.val[0] != '/' && realpath(p.val, abs) ? abs : p.val);
			return stdout_checked(0);
		} else if (r == OPT_CONFIG) {
			hpud__D.conf_path = p.val;
		} else if (r == OPT_CHECK) {
			check = 1;
		} else if (r == OPT_LOG_LEVEL) {
			hpu_log_level lvl;
			if (hpu__log_parse_level(p.val, "--log-level", &lvl, err, sizeof err) < 0) {
				hpud__logmsg(HPUD_LOG_ERROR, "%s", err);
				return 2;
			}
			hpu__log_set_level(lvl);
			hpud__D.log_level_fixed = 1;
		} else if (r == HPU_OPT_MISSING) {
			hpud__logmsg(HPUD_LOG_ERROR, "%s needs a value", p.arg);
			usage(stderr);
			return 2;
		} else { /* an argument, an unknown option, a flag with a value */
			hpud__logmsg(HPUD_LOG_ERROR, "unknown argument %s", p.arg);
			usage(stderr);
			return 2;
		}
	}
	hpud__conf_defaults(&hpud__D.conf);
	hpud__D.quarantine.log = hpud__logmsg;
	/* Nothing that someone else could have written is read or run
	 * (daemon/trust.h): the configuration, the key, the worker program. */
	if (hpud__trust_path(hpud__D.conf_path, "the configuration", err, sizeof err) < 0 ||
	    hpud__conf_load(&hpud__D.conf, hpud__D.conf_path, err, sizeof err) < 0) {
		hpud__logmsg(HPUD_LOG_ERROR, "%s", err);
		return 1;
	}
	/* before the checks that log (devices = auto's count said its info
	 * line under log_level = error) */
	hpud__apply_log_level();
	/* the key's and the worker's errors name the configuration's key
	 * that set them (the other keys' name FILE:LINE) */
	const char *set_by = NULL;
	if (hpud__resolve_user(&hpud__D.conf, err, sizeof err) < 0 ||
	    (set_by = "key", hpud__trust_path(hpud__D.conf.key_path, "the key file", err,
					      sizeof err) < 0) ||
	    hpud__load_key(err, sizeof err) < 0 ||
	    (set_by = hpud__D.conf.worker[0] ? "worker" : "",
	     hpud__find_worker(&hpud__D.conf, hpud__D.worker, err, sizeof err) < 0) ||
	    hpud__trust_path(hpud__D.worker, "the worker program", err, sizeof err) < 0 ||
	    (set_by = NULL, hpud__count_devices(&hpud__D.conf, hpud__D.worker, err, sizeof err) < 0)) {
		if (set_by && *set_by)
			hpud__logmsg(HPUD_LOG_ERROR, "%s (key '%s' of %s)", err, set_by,
				     hpud__D.conf_path);
		else if (set_by)
			hpud__logmsg(HPUD_LOG_ERROR, "%s (hpu-worker next to hpud; set 'worker = PATH' in %s)",
				     err, hpud__D.conf_path);
		else
			hpud__logmsg(HPUD_LOG_ERROR, "%s", err);
		return 1;
	}
	if (check) {
		printf("hpud: %s is fine\n", hpud__D.conf_path);
		return 0;
	}
	hpud__D.loop = EV_DEFAULT;
	if (hpu__auth_random_id(hpud__D.instance) < 0) {
		hpud__logmsg(HPUD_LOG_ERROR, "cannot draw an instance id: the random generator failed");
		return 1;
	}
	if (hpud__open_socket(err, sizeof err) < 0) {
		hpud__logmsg(HPUD_LOG_ERROR, "%s", err);
		return 1;
	}
	ev_timer_init(&hpud__D.tick, hpud__on_tick, 1.0, 1.0);
	ev_timer_start(hpud__D.loop, &hpud__D.tick);
	hpud__D.last_tick = hpu__mono_s();
	ev_prepare_init(&hpud__D.reap, hpud__on_reap);
	hpud__D.out = (hpud_jobout){.loop = hpud__D.loop, .conf = &hpud__D.conf, .jobs = hpud__D.jobs, .njobs = MAX_JOBS,
			      .reap = &hpud__D.reap, .pack = hpud__pack_env, .send = hpud__send_body, .log = hpud__logmsg};
	hpud__jobout_init(&hpud__D.out);
	ev_signal_init(&hpud__D.sigterm, hpud__on_term, SIGTERM);
	ev_signal_init(&hpud__D.sigint, hpud__on_term, SIGINT);
	ev_signal_init(&hpud__D.sighup, hpud__on_hup, SIGHUP);
	ev_signal_start(hpud__D.loop, &hpud__D.sigterm);
	ev_signal_start(hpud__D.loop, &hpud__D.sigint);
	ev_signal_start(hpud__D.loop, &hpud__D.sighup);
	hpud__logmsg(HPUD_LOG_INFO, "listening on tcp://%s:%d, %d device%s, workers run as %s, worker %s, instance %s",
		     hpud__D.conf.listen, hpud__D.conf.port, hpud__D.conf.devices, hpu__plural(hpud__D.conf.devices),
		     hpud__D.set_user ? hpud__D.conf.user : "hpud's own user", hpud__D.worker, hpud__D.instance);
	hpud__notify("READY=1"); /* the socket listens: connections are taken from now on */
	ev_run(hpud__D.loop, 0);
	for (int i = 0; i < MAX_JOBS; i++)
		if (hpud__D.jobs[i].used)
			hpud__release_job(&hpud__D.jobs[i]);
	hpud__close_socket();
	hpu__zmq_ctx_term(hpud__D.ctx);
	hpu__auth_destroy(&hpud__D.auth);
	hpud__logmsg(HPUD_LOG_INFO, "stopped");
	return 0;
}
