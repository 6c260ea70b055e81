/* submit: hpulaunch's client side of hpud (daemon/hpud.c).
 *
 * Every request names the instance of hpud it is for, which the
 * submitter asks each hpud for first (a Hello, under a fresh session id;
 * see proto/hpu.proto); hpud's frames are taken only for that session and
 * in the order hpud numbered them, so that a replay is dropped.
 *
 * With --hostfile, the job is submitted to every host's hpud (node 0
 * first: its coordinator's port goes to the others), the workers' output
 * is printed as it streams back, each daemon is pinged every second (a
 * silent one fails the job, naming its node), Ctrl-C cancels the job on
 * every node, and the exit status is the job's: 0, 1 with the root cause,
 * or 128+signal. With --status HOST, one daemon's jobs are printed. */
#ifndef HPU_SUBMIT_H
#define HPU_SUBMIT_H

#include "launcher/args.h"

/* Runs the job through the hosts' daemons; returns the exit status. */
int hpu__submit_run(const hpu_launch_args *a);

/* Prints a->status_host's jobs; returns 0, or 1 after an error. */
int hpu__status_run(const hpu_launch_args *a);

#endif
