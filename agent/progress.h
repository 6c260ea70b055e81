/* progress: the one-line progress bar hpulaunch keeps at the bottom of a
 * terminal, drawn from rank 0's status records (agent.h), with the
 * workers' lines scrolling above it:
 *
 *   epoch 1/2 [#########.........] 37% step 220/600 loss 0.4123 4711.2 samples/s ETA 0:01:23
 *
 * New records redraw it with "\r" ... "\x1b[K" at most 5 times a second,
 * fitted to the terminal's width; before any other output the caller hides
 * it (hpu__progress_hide) and shows it again at once afterwards
 * (hpu__progress_show).
 * Off, every call does nothing, so the output is the plain lines. */
#ifndef HPU_PROGRESS_H
#define HPU_PROGRESS_H

#include <stddef.h>
#include <stdio.h>

#include "agent/agent.h"

/* --progress: auto (on when stdout is a terminal and TERM is not "dumb"),
 * always, never. */
enum { HPU_PROGRESS_AUTO = 0, HPU_PROGRESS_ALWAYS = 1, HPU_PROGRESS_NEVER = 2 };

typedef struct hpu_progress {
	FILE *out;
	int on;             /* drawing at all */
	int shown;          /* the bar is on the screen now */
	int have;           /* st holds a record */
	int dirty;          /* st (or a hidden bar) is not on the screen yet */
	double drawn_at;    /* monotonic seconds of the last draw */
	hpu_status_rec st;
} hpu_progress;

/* Parses "auto", "always" or "never" into *mode; -1 if it is none. */
int hpu__progress_mode_parse(const char *s, int *mode);

/* Sets p up to draw on `out` (stdout) in `mode`: auto draws only when
 * out is a terminal and $TERM is set and not "dumb". */
void hpu__progress_init(hpu_progress *p, int mode, FILE *out);

/* Takes rank 0's latest record; draws it now unless the last draw was
 * less than 0.2 s ago (hpu__progress_tick draws it then). */
void hpu__progress_update(hpu_progress *p, const hpu_status_rec *st);

/* Draws a record not yet drawn (or a bar hidden by hpu__progress_hide)
 * once 0.2 s have passed since the last draw; call it every 0.2 s or so. */
void hpu__progress_tick(hpu_progress *p);

/* Clears the bar off the screen before other output ("\r\x1b[K"); the
 * next hpu__progress_show or tick draws it again. */
void hpu__progress_hide(hpu_progress *p);

/* Draws the bar again at once (after a line printed below a hidden one). */
void hpu__progress_show(hpu_progress *p);

/* Clears the bar and forgets its record (the end of an attempt). */
void hpu__progress_reset(hpu_progress *p);

/* Writes the bar's text for st, at most `width` columns, into out
 * (NUL-terminated, outlen > width); returns its length. */
size_t hpu__progress_format(const hpu_status_rec *st, int width, char *out, size_t outlen);

#endif
