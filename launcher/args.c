/* args: hpulaunch's command line read into one plan (hpu__args_parse),
 * and the workers' argv it builds: the training options as written, the
 * model as an absolute path, with --hostfile every relative path made
 * absolute. The option table is args_table.c's, the launcher's own
 * options args_opts.c's, the plan args_plan.c's (args_impl.h). */
#include "launcher/args_impl.h"
#include "common/env.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Appends argv[from..to) to the worker's argv. */
static int add_args(hpu_launch_args *a, char **argv, int from, int to)
{
	char **grown = realloc(a->worker_argv, (size_t)(a->worker_argc + (to - from) + 1) * sizeof *grown);
	if (!grown)
		return -1;
	a->worker_argv = grown;
	for (int i = from; i < to; i++)
		a->worker_argv[a->worker_argc++] = argv[i];
	a->worker_argv[a->worker_argc] = NULL;
	return 0;
}

/* The model the workers load, as an absolute path in a->model: dlopen
 * would look a bare "model.so" up on the library search path (and might
 * find another one there), and hpud would resolve any relative path
 * against its own directory. An absolute path is kept as given. */
static int model_path(hpu_launch_args *a, const char *path, char *err,
		      size_t errlen)
{
	struct stat st;
	if (access(path, R_OK) != 0 || stat(path, &st) != 0) {
		snprintf(err, errlen, "cannot read the model %s: %s", path, strerror(errno));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) { /* dlopen would wait on a FIFO */
		const char *kind = S_ISDIR(st.st_mode)    ? "a directory"
				   : S_ISFIFO(st.st_mode) ? "a FIFO"
							  : "a device or socket";
		snprintf(err, errlen, "the model %s is not a regular file (%s)", path, kind);
		return -1;
	}
	a->model = path[0] == '/' ? strdup(path) : realpath(path, NULL);
	if (!a->model) {
		snprintf(err, errlen, "cannot make the model path %s absolute: %s", path,
			 strerror(errno));
		return -1;
	}
	return 0;
}

/* Keeps s (malloc'ed, or NULL: out of memory) for hpu__args_free. */
static char *own(hpu_launch_args *a, char *s)
{
	char **grown = s ? realloc(a->owned, (size_t)(a->nowned + 1) * sizeof *grown) : NULL;
	if (!grown) {
		free(s);
		return NULL;
	}
	a->owned = grown;
	return a->owned[a->nowned++] = s;
}

/* "--name=PATH" with `value` of path option `name` made absolute against
 * cwd (kept in a->owned); NULL with *rc 0 when it needs nothing, else
 * with *rc < 0 and a sentence in err. */
static char *abs_flag(hpu_launch_args *a, const char *name, const char *value, const char *cwd,
		      int *rc, char *err, size_t errlen)
{
	char *path, *flag = NULL;
	*rc = hpu__opts_abs_path(name, value, cwd, &path);
	if (*rc == -2) {
		snprintf(err, errlen, "--%s %s made absolute (hpud starts the workers in its own directory) is longer than %zu bytes: give a shorter path",
			 name, value ? value : ".", sizeof a->train.metrics - 1);
		return NULL;
	}
	if (*rc == 1 && asprintf(&flag, "--%s=%s", name, path) < 0)
		flag = NULL;
	free(path);
	if (*rc == -1 || (*rc == 1 && !own(a, flag))) {
		snprintf(err, errlen, "out of memory");
		*rc = -1;
		return NULL;
	}
	return *rc == 1 ? flag : NULL;
}

/* The file variables hostfile jobs carry to the workers (hpu__job_env):
 * made absolute in this process's environment before they are sent. */
static const hpu_env_id file_vars[] = {
	HPU_ENV_LOWER_LIST, HPU_ENV_FP32_LIST, HPU_ENV_PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST,
	HPU_ENV_PT_HPU_AUTOCAST_FP32_OPS_LIST, HPU_ENV_QUANT_CONFIG};

static int absolute_vars(const char *cwd, char *err, size_t errlen)
{
	for (size_t k = 0; k < sizeof file_vars / sizeof file_vars[0]; k++) {
		const char *v = hpu__env_str(file_vars[k]);
		char *abs = NULL;
		if (!v || !*v || v[0] == '/')
			continue;
		if (asprintf(&abs, "%s%s%s", cwd, strcmp(cwd, "/") ? "/" : "", v) < 0 ||
		    setenv(hpu__env_name(file_vars[k]), abs, 1) < 0) {
			free(abs);
			snprintf(err, errlen, "out of memory");
			return -1;
		}
		free(abs);
	}
	return 0;
}

/* --hostfile: hpud starts the workers in its own directory, so each
 * relative path is made absolute against this one, where hpulaunch read
 * and checked them: in the training options as written, which the workers
 * get (--metrics x, --metrics=x, --profile alone), in a flag for each one
 * the --config file gave (a flag wins over the file), and in the file
 * variables (LOWER_LIST, QUANT_CONFIG, ...). Which options are paths is
 * the option table's to say (hpu__opts_is_path). worker_argv holds the
 * program and the training options. */
static int absolute_paths(hpu_launch_args *a, char *err, size_t errlen)
{
	char cwd[PATH_MAX], **in = a->worker_argv;
	int n = a->worker_argc, rc = 0;
	if (!getcwd(cwd, sizeof cwd)) {
		snprintf(err, errlen, "cannot make relative paths absolute for hpud: this directory: %s",
			 strerror(errno));
		return -1;
	}
	if (absolute_vars(cwd, err, errlen) < 0)
		return -1;
	a->worker_argv = NULL;
	a->worker_argc = 0;
	if (add_args(a, in, 0, 1) < 0)
		goto oom;
	hpu_optparse p;
	hpu__optparse_init(&p, n, in, hpu__opts_specs());
	for (int r; (r = hpu__optparse_next(&p)) > 0;) {
		const char *name = p.spec->name, *v = p.val;
		if (!v && p.spec->value == HPU_OPT_OPTIONAL &&
		    hpu__opts_takes_next(name, p.ind < n ? in[p.ind] : NULL))
			v = in[p.ind++];
		char *flag = abs_flag(a, name, v, cwd, &rc, err, errlen);
		if (rc < 0)
			goto out;
		if (flag ? add_args(a, &flag, 0, 1) < 0 : add_args(a, in, p.at, p.ind) < 0)
			goto oom;
	}
	const char *name, *v;
	for (int k = 0; (name = hpu__opts_file_path(&a->train, k, &v)); k++) {
		char *flag = abs_flag(a, name, v, cwd, &rc, err, errlen);
		if (rc < 0)
			goto out;
		if (flag && add_args(a, &flag, 0, 1) < 0)
			goto oom;
	}
	rc = 0;
	goto out;
oom:
	snprintf(err, errlen, "out of memory");
	rc = -1;
out:
	free(in);
	return rc < 0 ? -1 : 0;
}

int hpu__args_parse(hpu_launch_args *a, int argc, char **argv, char *err,
		    size_t errlen)
{
	sources src = {0};
	memset(a, 0, sizeof *a);
	a->nodes = 1;
	a->devices = 1;
	a->join_timeout_s = 300;
	a->agent_timeout_s = 10;
	a->grace_s = 2;
	a->hpud_port = HPU_HPUD_PORT;
	a->key_path = HPU_KEY_FILE_DEFAULT;
	strcpy(a->master_addr, "127.0.0.1");
	hpu__opts_defaults(&a->train);
	if (hpu__args_from_env(a, &src, err, errlen) < 0)
		return -1;
	static char wpath[PATH_MAX];
	if (hpu__args_worker_path(wpath, sizeof wpath) < 0 || add_args(a, (char *[]){wpath}, 0, 1) < 0) {
		snprintf(err, errlen, "cannot find hpu-worker");
		return -1;
	}
	hpu_optparse p;
	hpu__optparse_init(&p, argc, argv, hpu__args_specs);
	p.more = hpu__opts_specs();
	int r;
	while ((r = hpu__optparse_next(&p)) > 0) {
		if (r == O_HELP) {
			hpu__args_usage(stdout);
			return 1;
		}
		if (r == O_HELP_ENV) {
			hpu__env_print(stdout);
			return 1;
		}
		if (r == O_HELP_DOC) {
			if (hpu__args_doc(stdout, p.val) < 0) {
				snprintf(err, errlen, "--help-doc takes help, scdoc or markdown, not '%s'", p.val);
				return -1;
			}
			return 1;
		}
		if (r == O_EXEC) {
			if (p.ind >= argc) {
				snprintf(err, errlen, "--exec needs a program");
				return -1;
			}
			a->exec_mode = 1;
			/* training options given: dropped, said (main.c) */
			a->exec_ignored = a->worker_argc > 1 ? a->worker_argv[1] : NULL;
			a->worker_argc = 0;
			if (add_args(a, argv, p.ind, argc) < 0) {
				snprintf(err, errlen, "out of memory");
				return -1;
			}
			return hpu__args_finish(a, &src, 0, err, errlen);
		}
		if (r < HPU_OPTS_ID) {
			if (hpu__args_opt(a, &src, &p, r, err, errlen) < 0)
				return -1;
		} else if (hpu__opts_apply(&a->train, &p, err, errlen) < 0) {
			hpu__args_plural_hint(&p, err, errlen);
			return -1;
		} else if (add_args(a, argv, p.at, p.ind) < 0) {
			return -1; /* a training option: checked, forwarded as written */
		}
	}
	/* The model, where an argument that is not an option (or a single-dash
	 * one) starts, or the end. */
	if (r == HPU_OPT_MISSING || r == HPU_OPT_UNWANTED ||
	    (r == HPU_OPT_UNKNOWN && p.arg[0] == '-' && p.arg[1]))
		return hpu__args_option_error(&p, r, err, errlen);
	int i = p.at;
	if (a->status_host)
		return hpu__args_finish(a, &src, i < argc, err, errlen);
	if (i >= argc || argv[i][0] == '-') {
		/* --profile's optional DIR took a model whose name has no .so */
		struct stat st;
		const char *pd = a->train.profile;
		if (pd[0] && stat(pd, &st) == 0 && S_ISREG(st.st_mode))
			snprintf(err, errlen, "no model given: --profile took '%s' as its directory: "
					      "write --profile=DIR before the model, or name the model "
					      "with .so at the end",
				 pd);
		else
			snprintf(err, errlen, "no model given: hpulaunch [options] MODEL.so (see --help)");
		return -1;
	}
	if (hpu__args_options_after_model(argv, argc, i, err, errlen) < 0 ||
	    model_path(a, argv[i], err, errlen) < 0)
		return -1;
	if (a->hostfile && absolute_paths(a, err, errlen) < 0)
		return -1;
	/* the model's arguments after a "--" of the worker's, without the
	 * user's "--" wherever it stands: one after some of them reached the
	 * model ("unknown model argument --"), the worker dropping only one
	 * right after the model */
	int sep = i + 1;
	while (sep < argc && strcmp(argv[sep], "--"))
		sep++;
	if (add_args(a, &a->model, 0, 1) < 0 || add_args(a, (char *[]){"--"}, 0, 1) < 0 ||
	    add_args(a, argv, i + 1, sep) < 0 || (sep < argc && add_args(a, argv, sep + 1, argc) < 0)) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	return hpu__args_finish(a, &src, 0, err, errlen);
}

void hpu__args_free(hpu_launch_args *a)
{
	free(a->worker_argv);
	a->worker_argv = NULL;
	for (int i = 0; i < a->nowned; i++)
		free(a->owned[i]);
	free(a->owned);
	a->owned = NULL;
	a->nowned = 0;
	free(a->model);
	a->model = NULL;
	free(a->hosts);
	a->hosts = NULL;
	a->nhosts = 0;
	free(a->status_host);
	a->status_host = NULL;
}
