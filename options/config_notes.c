/* config_notes: what a loaded config file left to flags and defaults
 * ("auto" values) and the keys that change nothing here, printed once
 * (hpu__opts_config_notes, config.h).
 */
#include "options/config.h"
#include "options/config_internal.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

/* "key=value (--flag)" for one "auto" value, at buf. */
static size_t auto_text(const hpu_train_opts *o, const struct hpu_cfg_auto *a, char *buf,
			size_t len)
{
	char v[2][64];
	const struct hpu__opt *p[2] = {hpu__opt_at(a->slot[0]), hpu__opt_at(a->slot[1])};
	for (int i = 0; i < 2; i++)
		if (p[i])
			hpu__opt_text(o, p[i], v[i], sizeof v[i]);
	/* the values whose number means something else */
	if (p[0]->off == offsetof(hpu_train_opts, weight_decay))
		snprintf(v[0], sizeof v[0], "%.15g", hpu__opts_weight_decay(o));
	if (p[0]->off == offsetof(hpu_train_opts, total_steps) && !o->total_steps)
		snprintf(v[0], sizeof v[0], "the run's steps");
	int from = o->from[a->slot[0]];
	int n = p[1] ? snprintf(buf, len, "%s=[%s, %s] (--%s, --%s", a->key, v[0], v[1],
				p[0]->name, p[1]->name)
		     : snprintf(buf, len, "%s=%s (--%s", a->key, v[0], p[0]->name);
	if (n < 0 || (size_t)n >= len)
		return n < 0 ? 0 : len - 1;
	int m = snprintf(buf + n, len - (size_t)n, "%s)",
			 from == HPU_FROM_FLAG ? "" : from == HPU_FROM_FILE ? ", another key" : ", default");
	return m < 0 ? (size_t)n : (size_t)n + (size_t)m < len ? (size_t)n + (size_t)m : len - 1;
}

void hpu__opts_config_notes(const hpu_train_opts *o, FILE *f, const char *prog)
{
	char line[4096];
	size_t at = 0;
	for (int i = 0; i < o->ncfg_auto && at + 2 < sizeof line; i++) {
		at += (size_t)snprintf(line + at, sizeof line - at, "%s", i ? ", " : "");
		at += auto_text(o, &o->cfg_auto[i], line + at, sizeof line - at);
	}
	if (o->ncfg_auto)
		fprintf(f, "%s: note: %s: \"auto\" values take hputrain's flags and defaults: %s\n",
			prog, o->config, line);
	if (!o->cfg_ignored[0])
		return;
	/* "k1, k2 (why); k3 (why2)": keys with the same reason together, in
	 * the order the reasons first appear */
	at = 0;
	for (const char *l = o->cfg_ignored; *l; l = strchr(l, '\n') + 1) {
		const char *why = strchr(l, '\t') + 1;
		size_t wl = strcspn(why, "\n");
		int seen = 0; /* this reason was said already */
		for (const char *e = o->cfg_ignored; e != l && !seen; e = strchr(e, '\n') + 1)
			seen = !strncmp(strchr(e, '\t') + 1, why, wl) && strchr(e, '\t')[1 + wl] == '\n';
		if (seen)
			continue;
		int first = 1;
		for (const char *e = l; *e; e = strchr(e, '\n') + 1) {
			const char *t = strchr(e, '\t');
			if (strncmp(t + 1, why, wl) || t[1 + wl] != '\n')
				continue;
			at += (size_t)snprintf(line + at, sizeof line - at, "%s%.*s",
					       first ? (at ? "; " : "") : ", ", (int)(t - e), e);
			first = 0;
			if (at >= sizeof line)
				break;
		}
		if (at < sizeof line)
			at += (size_t)snprintf(line + at, sizeof line - at, " (%.*s)", (int)wl, why);
		if (at >= sizeof line) {
			at = sizeof line - 1;
			break;
		}
	}
	fprintf(f, "%s: warning: %s: keys with no effect in hputrain: %s\n", prog, o->config, line);
}
