/* A job's life in hpud: the node job's callbacks (its workers' lines,
 * rank 0's progress at most 5 a second, a worker's exit, the job's end)
 * turned into messages to the submitter (daemon/joboutput.h), and the
 * ended jobs released once their last message has left. Calls jobs.c and
 * logging.c (daemon/hpud.h). */
#include <sys/wait.h>

#include "daemon/hpud.h"
#include "common/clock.h"

/* ---- a job's life ---- */

void hpud__on_line(hpu_nodejob *nj, int rank, int is_err, const char *line,
		   size_t len, void *arg)
{
	(void)nj;
	hpud__jobout_line(&hpud__D.out, arg, rank, is_err, line, len);
}

/* Sends rank 0's latest record to the submitter. */
static void send_progress(job *j)
{
	hpu_status_rec st;
	double age;
	j->progress_pending = 0;
	if (!j->nj || hpu__nodejob_status(j->nj, 0, &st, &age) < 0)
		return;
	Hpu__RankStatus rs;
	hpu__status_to_proto(&rs, 0, &st, age);
	Hpu__Progress p = HPU__PROGRESS__INIT;
	p.job_id = j->id;
	p.status = &rs;
	p.eta_s = st.eta_s;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_PROGRESS;
	env.progress = &p;
	hpud__jobout_send(&hpud__D.out, j, &env, HPUD_JOB_PROGRESS, 0);
	j->progress_at = hpu__mono_s();
	j->progress_phase = st.phase;
}

void hpud__on_progress_timer(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	job *j = t->data;
	if (j->progress_pending)
		send_progress(j);
}

/* Rank 0's records go on to the submitter at most 5 a second: a record
 * that starts a phase (eval, the end) at once, one that comes too soon
 * when its turn comes (the latest then). */
void hpud__on_status(hpu_nodejob *nj, int rank, const hpu_status_rec *st, void *arg)
{
	(void)nj;
	job *j = arg;
	if (rank != 0)
		return;
	j->progress_pending = 1;
	double since = hpu__mono_s() - j->progress_at;
	if (since >= PROGRESS_EVERY_S || st->phase != j->progress_phase) {
		ev_timer_stop(hpud__D.loop, &j->progress_timer);
		send_progress(j);
	} else if (!ev_is_active(&j->progress_timer)) {
		ev_timer_set(&j->progress_timer, PROGRESS_EVERY_S - since, 0);
		ev_timer_start(hpud__D.loop, &j->progress_timer);
	}
}

void hpud__on_exit_worker(hpu_nodejob *nj, int rank, int pid, int status, void *arg)
{
	job *j = arg;
	Hpu__WorkerExit we;
	hpu__codec_worker_exit(&we, rank, j->node_rank, pid, status);
	hpu_status_rec st;
	double age;
	we.phase = HPU_PHASE_SETUP; /* no record yet */
	if (hpu__nodejob_status(nj, rank, &st, &age) == 0) {
		we.step = st.step;
		we.total = st.total;
		we.phase = (uint32_t)st.phase;
	}
	if (status != 0 && WIFEXITED(status))
		we.why = (char *)hpu__nodejob_why(nj, rank);
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_WORKER_EXIT;
	env.worker_exit = &we;
	hpud__jobout_send(&hpud__D.out, j, &env, HPUD_JOB_CONTROL, 0);
}

void hpud__on_end(hpu_nodejob *nj, int failed, const char *cause, void *arg)
{
	job *j = arg;
	hpud__logmsg(failed ? HPUD_LOG_WARN : HPUD_LOG_INFO, "job %s node %d ended%s%s", j->id,
		     j->node_rank, failed ? ": " : " successfully", failed ? cause : "");
	long bad = hpu__nodejob_status_bad(nj);
	if (bad)
		hpud__logmsg(HPUD_LOG_WARN, "job %s: %ld malformed status lines from the workers were ignored",
			     j->id, bad);
	Hpu__JobEnd e = HPU__JOB_END__INIT;
	e.job_id = j->id;
	e.node_rank = (uint32_t)j->node_rank;
	e.ok = !failed;
	e.reason = (char *)cause;
	ev_timer_stop(hpud__D.loop, &j->progress_timer); /* nothing after the end */
	j->progress_pending = 0;
	Hpu__Envelope env = HPU__ENVELOPE__INIT;
	env.msg_case = HPU__ENVELOPE__MSG_JOB_END;
	env.job_end = &e;
	hpud__jobout_ending(&hpud__D.out, j); /* its drop notices, before the end */
	hpud__jobout_send(&hpud__D.out, j, &env, HPUD_JOB_CONTROL, 0);
	j->ended = 1; /* freed by hpud__on_reap, outside the job's own callbacks */
	ev_prepare_start(hpud__D.loop, &hpud__D.reap);
	if (!hpud__D.stopping)
		hpud__notify("");
}

/* Ended jobs are released once their last message has left (or their
 * submitter is gone, or hpud stops); until then they are retired, holding
 * no devices. */
void hpud__on_reap(struct ev_loop *loop, ev_prepare *w, int revents)
{
	(void)revents;
	ev_prepare_stop(loop, w);
	for (int i = 0; i < MAX_JOBS; i++) {
		job *j = &hpud__D.jobs[i];
		if (!j->used || !j->ended)
			continue;
		if (!hpud__outq_peek(&j->out) || j->peer_gone || hpud__D.stopping)
			hpud__release_job(j);
		else
			hpud__retire_job(j);
	}
	if (hpud__D.stopping) {
		int left = 0;
		for (int i = 0; i < MAX_JOBS; i++)
			left += hpud__D.jobs[i].used;
		if (!left)
			ev_break(loop, EVBREAK_ALL);
	}
}
