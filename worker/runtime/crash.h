/* crash: what a worker says when it crashes (a fault in a model, a layer
 * or ours): the signal, the faulting address and a backtrace on stderr,
 * one write a line, before the default action ends the process with the
 * signal (the launcher names the rank and the signal). Frames read
 * "library(function+offset)" or "library(+offset)" for a stripped one:
 * `addr2line -f -e LIBRARY OFFSET` on an unstripped build places it. */
#ifndef HPU_WORKER_CRASH_H
#define HPU_WORKER_CRASH_H

/* Installs the report for SIGSEGV, SIGBUS, SIGILL, SIGFPE and SIGABRT
 * (abort(): a failed assert, an uncaught C++ exception); rank names
 * the worker. A handler installed later (cpu-strict's) may pass faults
 * of its own on to this one. */
void hpu__crash_report_install(int rank);

struct hpu_builder;
/* The model whose layers the report names: a crash inside a layer's
 * forward or backward says which, and the error the layer recorded
 * (a call that returned NULL, whose result was then used), where the
 * calling thread (the one that runs the layers) faults; NULL: none. */
void hpu__crash_report_model(const struct hpu_builder *b);

/* Around the model's setup() (its builder, then NULL): a crash on the
 * calling thread meanwhile says it was there (it gave only the address
 * and frames), and the first error a declaration recorded before it (a
 * failed one's NULL, used: the crash hid the cause). */
void hpu__crash_in_setup(const struct hpu_builder *b);

#endif
