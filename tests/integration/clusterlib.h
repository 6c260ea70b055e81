/* clusterlib: what the multi-node tests (netns nodes, container nodes)
 * share: shell commands, a clock, the processes of a job, and comparing
 * two runs' saved parameters. */
#ifndef HPU_TEST_CLUSTERLIB_H
#define HPU_TEST_CLUSTERLIB_H

/* system() of the formatted command: its exit code, -1 if it did not
 * exit. */
int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The monotonic clock, in seconds. */
double now_s(void);

/* How many processes of job `job` exist on this machine: those with
 * HPU_JOB_ID=job in their environment. Namespaces and containers share
 * the host's process table, so this sees every node's workers. */
int job_procs(const char *job);

/* ||a - b|| / ||b|| of two --save-params files (cmocka-asserts they
 * hold as many values); *same says whether they are bit-identical. */
double params_rel_diff(const char *a, const char *b, int *same);

/* p, a job that lost a node, ends within `bound` s of t0 with exit 1 and
 * an error naming one of `names` (NULL-ended), and no process of job
 * `job` is left anywhere within `bound` s more. */
struct proc;
void expect_job_end(struct proc *p, const char *job, double t0, double bound,
		    const char *const *names);

#endif
