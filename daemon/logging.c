/* hpud's log lines and what it tells systemd: the log level, "hpud:
 * LEVEL: text" lines (journald's priority prefixes when stderr is the
 * journal), sd_notify's state and STATUS= line, refusals at most 20 a
 * second. Calls no other file of hpud (daemon/hpud.h). */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <systemd/sd-daemon.h>

#include "common/log.h"
#include "common/clock.h"
#include "common/num.h"
#include "daemon/hpud.h"

/* ---- logging (stderr: journald takes it from there) ---- */

/* hpud's levels as the log's (common/log.h). */
static hpu_log_level log_level_of(hpud_log_level lvl)
{
	static const hpu_log_level of[] = {[HPUD_LOG_ERROR] = HPU_LOG_ERROR,
					   [HPUD_LOG_WARN] = HPU_LOG_WARNING,
					   [HPUD_LOG_INFO] = HPU_LOG_INFO,
					   [HPUD_LOG_DEBUG] = HPU_LOG_DEBUG};
	return of[lvl];
}

/* The configuration's log_level, unless HPU_LOG_LEVEL or --log-level
 * set the level. */
void hpud__apply_log_level(void)
{
	if (!hpud__D.log_level_fixed && !hpu__log_level_from_env())
		hpu__log_set_level(hpud__D.conf.log_level);
}


/* "hpud: LEVEL: text" through the log (common/log.h), which puts the
 * syslog priority in front for journald when stderr is the journal
 * stream; journald takes it off and keeps it as the line's priority
 * (journalctl -p). The agent's and the coordinator's lines in hpud go
 * the same way, as "hpud: text". */
void hpud__logmsg(hpud_log_level lvl, const char *fmt, ...)
{
	if (!hpu__log_enabled(log_level_of(lvl)))
		return;
	char line[1200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	hpu__log(log_level_of(lvl), "%s: %s", hpud__log_level_name(lvl), line);
}

/* Tells systemd `state` ("READY=1", ...) with a STATUS= line of what
 * hpud does now; nothing without NOTIFY_SOCKET. */
void hpud__notify(const char *state)
{
	int jobs = 0, busy = 0;
	for (int i = 0; i < MAX_JOBS; i++)
		jobs += hpud__D.jobs[i].used && hpud__D.jobs[i].nj && !hpud__D.jobs[i].ended;
	for (int i = 0; i < hpud__D.conf.devices && i < MAX_DEVICES; i++)
		busy += hpud__D.busy[i];
	int r = hpud__D.stopping ? sd_notifyf(0, "%s%sSTATUS=stopping: %d job%s to end", state,
					*state ? "\n" : "", jobs, jobs == 1 ? "" : "s")
			   : sd_notifyf(0, "%s%sSTATUS=listening on tcp://%s:%d: %d job%s, %d of %d device%s free",
					state, *state ? "\n" : "", hpud__D.conf.listen, hpud__D.conf.port, jobs,
					jobs == 1 ? "" : "s", hpud__D.conf.devices - busy, hpud__D.conf.devices,
					hpu__plural(hpud__D.conf.devices));
	static int warned;
	if (r < 0 && !warned++)
		hpud__logmsg(HPUD_LOG_WARN, "cannot notify systemd through NOTIFY_SOCKET: %s", strerror(-r));
}

/* The peers of the refusals not logged this second: the first few. */
enum { DROPPED_PEERS = 4 };
static char dropped_from[DROPPED_PEERS][64];
static int ndropped_from, dropped_more;

static void note_dropped_peer(const char *peer)
{
	for (int i = 0; i < ndropped_from; i++)
		if (!strcmp(dropped_from[i], peer))
			return;
	if (ndropped_from < DROPPED_PEERS)
		snprintf(dropped_from[ndropped_from++], sizeof dropped_from[0], "%s", peer);
	else
		dropped_more = 1;
}

/* The refusals past the 20 logged in a second, said once the second is
 * over (it waited for the next refusal, which may never come), with whom
 * they came from. */
static void say_dropped(void)
{
	if (hpud__D.refused_dropped) {
		char from[DROPPED_PEERS * 66 + 32] = "";
		size_t used = 0;
		for (int i = 0; i < ndropped_from; i++)
			hpu__log_list_add(from, sizeof from, &used, dropped_from[i]);
		if (dropped_more)
			hpu__log_list_add(from, sizeof from, &used, "others");
		hpud__logmsg(HPUD_LOG_WARN, "%d more requests refused in the last second (not logged), from %s",
			     hpud__D.refused_dropped, from);
	}
	hpud__D.refused_dropped = 0;
	ndropped_from = 0;
	dropped_more = 0;
}

static void on_refuse_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop, (void)t, (void)revents;
	say_dropped();
}

void hpud__log_refusal(const char *peer, const char *why)
{
	ev_tstamp now = hpu__mono_s();
	if (now - hpud__D.refuse_window >= 1.0) {
		ev_timer_stop(hpud__D.loop, &hpud__D.refuse_timer);
		say_dropped();
		hpud__D.refuse_window = now;
		hpud__D.refused_logged = 0;
	}
	if (hpud__D.refused_logged++ < 20) {
		hpud__logmsg(HPUD_LOG_WARN, "refused a request from %s: %s", peer, why);
	} else {
		note_dropped_peer(peer);
		if (hpud__D.refused_dropped++ == 0) {
			ev_timer_init(&hpud__D.refuse_timer, on_refuse_timer,
				      hpud__D.refuse_window + 1.0 - now, 0.);
			ev_timer_start(hpud__D.loop, &hpud__D.refuse_timer);
		}
	}
}
