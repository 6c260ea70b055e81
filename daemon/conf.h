/* conf: hpud's configuration file (/etc/hpud/hpud.conf by default).
 *
 *     # comments and blank lines are fine
 *     listen = 0.0.0.0          # address of the control socket
 *     port = 29400
 *     devices = 8               # devices (workers) this node offers, or
 *                               # auto: counted as device says
 *     device = cuda             # what auto counts: cpu, cpu-strict (the
 *                               # CPU cores), cuda (the GPUs), auto
 *     key = /etc/hpud/secret.key
 *     user = hpu                # run workers as this user ("root" only if
 *                               # written so explicitly)
 *     log_level = info          # error | warning | notice | info | debug
 *     clock_window = 30         # seconds a signed request may be off
 *     worker = /usr/lib/hputrain/hpu-worker   # the worker program
 *     submitter_timeout = 10    # seconds without a ping before a job is
 *                               # cancelled
 *     output_buffer = 4M        # a job's output waiting for its
 *                               # submitter, at most (K, M, G: KiB ...);
 *                               # past it the workers' output is held;
 *                               # dropped, counted, only while the
 *                               # submitter takes none of it for 5 s
 *     job_uids = 61000-61999    # run each job's workers as a uid of its
 *                               # own from this range (group: user's),
 *                               # so jobs cannot see or signal each other
 *
 * Unknown keys and bad values are errors naming the file, line and key. */
#ifndef HPUD_CONF_H
#define HPUD_CONF_H

#include <stddef.h>
#include <stdio.h>

#include "common/log.h"

/* The level of one of hpud's lines (hpud__logmsg); the level logged
 * (log_level) is common/log.h's. */
typedef enum hpud_log_level {
	HPUD_LOG_ERROR = 0,
	HPUD_LOG_WARN,
	HPUD_LOG_INFO,
	HPUD_LOG_DEBUG,
} hpud_log_level;

typedef struct hpud_conf {
	char listen[64];         /* numeric IPv4 address ("0.0.0.0") */
	int port;                /* 29400 */
	int devices;             /* 1 .. 1024; default: online CPU cores */
	int devices_auto;        /* devices = auto (the default): counted by
				  * hpud__conf_count_devices */
	char device[16];         /* what auto counts by: cpu (the default),
				  * cpu-strict, cuda, auto (hpulaunch's --device) */
	char key_path[512];      /* /etc/hpud/secret.key */
	char user[64];           /* "" : the user hpud runs as, unless root */
	hpu_log_level log_level; /* info (common/log.h's levels) */
	double clock_window_s;   /* 30 */
	char worker[512];        /* "" : hpu-worker next to hpud */
	double submitter_timeout_s; /* 10 */
	size_t output_buffer;    /* bytes: 4 MiB, 64 KiB .. 1 GiB */
	unsigned job_uid_first;  /* job_uids FIRST-LAST; 0: off (every job */
	unsigned job_uid_last;   /* runs as `user`) */
} hpud_conf;

/* The defaults above. */
void hpud__conf_defaults(hpud_conf *c);

/* Reads `path` over the defaults. Returns 0, or -1 with one sentence in
 * err ("FILE:LINE: unknown key 'prot'"). c is unchanged on failure. */
int hpud__conf_load(hpud_conf *c, const char *path, char *err, size_t errlen);

const char *hpud__log_level_name(hpud_log_level l);

/* devices = auto: c->devices counted as hpulaunch's --devices auto
 * --device DEVICE counts (agent/gpus.h): the GPUs `worker --count-gpus`
 * sees for cuda (none is an error), them or else the online CPU cores
 * for auto, the cores for cpu and cpu-strict. Nothing for a number.
 * Returns 0 with a line saying what was counted in note ("" for a
 * number), or -1 with one sentence in err ("devices = auto, device =
 * cuda: no GPU is visible (...)", the worker's reason as hpulaunch gives
 * it); c is unchanged on failure. */
int hpud__conf_count_devices(hpud_conf *c, const char *worker, char *note, size_t notelen,
			     char *err, size_t errlen);

/* Prints every key with its value's form and what it does, in the
 * format how (optdoc.h: HPU_DOC_HELP, _SCDOC, _MARKDOWN). */
void hpud__conf_doc(FILE *f, int how);

#endif
