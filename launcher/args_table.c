/* args_table: hpulaunch's option table, its help and documentation, and
 * the messages that name its options (unknown, misplaced, misspelt). */
#include "launcher/args_impl.h"
#include "common/num.h"
#include "common/optdoc.h"

#include <string.h>

/* The parser's table and the help's (--help, man/hpulaunch.1,
 * docs/reference/hpulaunch.md): an entry without help is another name of
 * the option of its id above it. */
const hpu_optspec hpu__args_specs[] = {
	{"nodes", 0, HPU_OPT_VALUE, O_NODES, "N", .help = "nodes in the job (1)",
	 .section = "Options (environment variables in brackets; flags win)"},
	{"devices", 0, HPU_OPT_VALUE, O_DEVICES, "D|auto",
	 .help = "workers on this node (1; auto: one per GPU with --device cuda, or auto where a GPU is "
		 "visible; else one per CPU core)"},
	{"node-rank", 0, HPU_OPT_VALUE, O_NODE_RANK, "R", .help = "this node's rank, 0..N-1 (0)", .env = "NODE_RANK"},
	{"master-addr", 0, HPU_OPT_VALUE, O_MASTER_ADDR, "A", .help = "node 0's address (127.0.0.1)", .env = "MASTER_ADDR"},
	{"master-port", 0, HPU_OPT_VALUE, O_MASTER_PORT, "P", .help = "coordinator port on node 0 (single node: a free port)",
	 .env = "MASTER_PORT"},
	{"job-id", 0, HPU_OPT_VALUE, O_JOB_ID, "ID", .help = "job id; the job token comes from HPU_JOB_TOKEN (required with --nodes > 1)",
	 .env = "HPU_JOB_ID"},
	{"log-dir", 0, HPU_OPT_VALUE, O_LOG_DIR, "DIR", .help = "also write each rank's output to DIR/rank_N.log (with --hostfile: on this machine)"},
	{"transport", 0, HPU_OPT_VALUE, O_TRANSPORT, "T",
	 .help = "auto | tcp | ipc | shm: how ranks reach each other (auto: shared memory within a node, TCP between)",
	 .env = "HPUCOLL_TRANSPORT"},
	{"data-plane", 0, HPU_OPT_VALUE, O_DATA_PLANE, "M",
	 .help = "auth | encrypt | none: who may connect to a worker's data socket (auth: only the job's ranks, "
		 "proven at connect; encrypt: also encrypted, CURVE; none: anyone) (auth)",
	 .env = "HPUCOLL_SECURITY"},
	{"join-timeout", 0, HPU_OPT_VALUE, O_JOIN_TIMEOUT, "S", .help = "seconds for every rank to join; on a node other than 0, also how long it waits for node 0's coordinator to answer (300)"},
	{"max-restarts", 0, HPU_OPT_VALUE, O_MAX_RESTARTS, "K",
	 .help = "when a worker or a node fails, stop the job and start it again, up to K times (0..1000; 0); "
		 "the workers get HPU_RESTART_COUNT (0 first, then 1, 2, ...) and HPU_MAX_RESTARTS. "
		 "Not after Ctrl-C or SIGTERM to hpulaunch"},
	{"exec", 0, HPU_OPT_FLAG, O_EXEC, "PROGRAM ...",
	 .help = "run PROGRAM (from PATH) instead of hpu-worker, the rest of the command line its "
		 "arguments; it initializes from the environment (not with --hostfile: each node's hpud runs "
		 "the worker its hpud.conf names)"},
	{"progress", 0, HPU_OPT_VALUE, O_PROGRESS, "MODE",
	 .help = "auto | always | never: a progress bar of rank 0 (epoch, step, loss, samples/s, ETA) on the "
		 "last line of the terminal, below the workers' lines (auto: when stdout is a terminal and "
		 "TERM is not dumb; also with --hostfile)"},
	{"quiet", 'q', HPU_OPT_FLAG, O_QUIET, NULL, .help = "no start-up summary line"},
	{"log-level", 0, HPU_OPT_VALUE, O_LOG_LEVEL, "LEVEL",
	 .help = "error | warning | notice | info | debug: hpulaunch's lines above it are not printed; "
		 "the workers' log lines too (not their training output: its step lines go with "
		 "--log-every 0) (info)",
	 .env = "HPU_LOG_LEVEL"},
	{"help", 'h', HPU_OPT_FLAG, O_HELP, NULL, .help = "this help"},
	{"help-env", 0, HPU_OPT_FLAG, O_HELP_ENV, NULL,
	 .help = "every environment variable hpulaunch, hpud and the workers read, with its default"},
	/* the options' documentation (man/, docs/reference/): not listed */
	{"help-doc", 0, HPU_OPT_VALUE, O_HELP_DOC, .help = NULL},
	/* torchrun's names (it takes '-' and '_' alike) */
	{"nnodes", 0, HPU_OPT_VALUE, O_NNODES, "N", .help = "--nodes N (N:N too; no elastic MIN:MAX range)",
	 .section = "torchrun's names, as aliases (with '-' or '_' where torchrun takes both)"},
	{"nproc-per-node", 0, HPU_OPT_VALUE, O_NPROC_PER_NODE, "D",
	 .help = "--devices D; gpu: one worker per GPU on --device cuda (--devices auto --device cuda); "
		 "auto: as torchrun, one per GPU on cuda where a GPU is visible, else one per CPU core "
		 "(a --device given counts as with --devices auto); cpu: one per CPU core"},
	{"nproc_per_node", 0, HPU_OPT_VALUE, O_NPROC_PER_NODE, .help = NULL},
	{"node_rank", 0, HPU_OPT_VALUE, O_NODE_RANK, "R", .help = "--node-rank R"},
	{"master_addr", 0, HPU_OPT_VALUE, O_MASTER_ADDR, "A", .help = "--master-addr A"},
	{"master_port", 0, HPU_OPT_VALUE, O_MASTER_PORT, "P", .help = "--master-port P"},
	{"max_restarts", 0, HPU_OPT_VALUE, O_MAX_RESTARTS, "K", .help = "--max-restarts K"},
	{"rdzv-endpoint", 0, HPU_OPT_VALUE, O_RDZV_ENDPOINT, "HOST:PORT",
	 .help = "--master-addr HOST --master-port PORT (IPv4 or a name; an IPv6 [ADDR]:PORT is refused)"},
	{"rdzv_endpoint", 0, HPU_OPT_VALUE, O_RDZV_ENDPOINT, .help = NULL},
	{"rdzv-id", 0, HPU_OPT_VALUE, O_JOB_ID, "ID", .help = "--job-id ID (the workers' TORCHELASTIC_RUN_ID)"},
	{"rdzv_id", 0, HPU_OPT_VALUE, O_JOB_ID, .help = NULL},
	{"standalone", 0, HPU_OPT_FLAG, O_STANDALONE, NULL,
	 .help = "one node, the coordinator on 127.0.0.1 at a free port; MASTER_ADDR, MASTER_PORT, NODE_RANK ignored"},
	/* DeepSpeed's launcher's names */
	{"num_gpus", 0, HPU_OPT_VALUE, O_DEVICES, "D", .help = "--devices D",
	 .section = "DeepSpeed's launcher's names, as aliases (--master_addr and --master_port as above)"},
	{"num_nodes", 0, HPU_OPT_VALUE, O_NODES, "N", .help = "--nodes N"},
	{"include", 0, HPU_OPT_VALUE, O_INCLUDE, "HOST@HOST...",
	 .help = "run on these hosts of the hostfile only, in the file's order (whole hosts: DeepSpeed's "
		 "HOST:SLOT,SLOT device lists are refused; set slots= instead)"},
	{"exclude", 0, HPU_OPT_VALUE, O_EXCLUDE, "HOST@HOST...",
	 .help = "run on every host of the hostfile but these (whole hosts, as --include)"},
	{"hostfile", 0, HPU_OPT_VALUE, O_HOSTFILE, "FILE",
	 .help = "one host a line, \"HOST[:PORT] [slots=N]\" (DeepSpeed and Open MPI style; PORT: that node's "
		 "hpud port); nodes = hosts, node 0 = the first host [MASTER_ADDR], each host runs its slots "
		 "(they may differ; ranks go host by host), or --devices on each; not with --nodes, "
		 "--node-rank or --master-addr",
	 .section = "Several nodes from one command, through each node's hpud"},
	{"status", 0, HPU_OPT_VALUE, O_STATUS, "HOST[:PORT]", .help = "print the jobs of the hpud on HOST and exit"},
	{"hpud-port", 0, HPU_OPT_VALUE, O_HPUD_PORT, "P", .help = "the daemons' control port (29400)"},
	{"key", 0, HPU_OPT_VALUE, O_KEY, "FILE", .help = "the cluster secret for hpud (/etc/hpud/secret.key)",
	 .env = "HPU_KEY_FILE"},
	{0},
};

void hpu__args_usage(FILE *f)
{
	fprintf(f,
		"usage: hpulaunch [options] [training options] MODEL.so [-- model args]\n"
		"       hpulaunch [options] --exec PROGRAM [args...]\n"
		"\n"
		"MODEL.so is a file: a relative path (a bare name too) is made absolute\n"
		"against this directory before the workers get it, also with --hostfile,\n"
		"where that path must then hold the model on every node. Arguments after\n"
		"it go to the model; hpulaunch's own options there are refused (put them\n"
		"before the model, or after -- to hand them to the model).\n"
		"\n"
		"Starts one worker per device on this node; with --nodes N, run it on\n"
		"every node with its --node-rank (torchrun style).\n");
	hpu__optdoc(f, hpu__args_specs, HPU_DOC_HELP, 25);
	fprintf(f,
		"\n"
		"[WORLD_SIZE], if set, must equal nodes x devices (--hostfile: the slots\n"
		"added up).\n"
		"\n"
		"Under Slurm, run one hpulaunch per node inside srun:\n"
		"  srun -N2 --ntasks-per-node=1 hpulaunch --devices 8 MODEL.so\n"
		"The node rank, nodes, master address (the first node) and port and the\n"
		"job id then come from SLURM_*; flags and the variables above win. Export\n"
		"HPU_JOB_TOKEN first: without it the token derives from the job id, which\n"
		"keeps jobs apart but not users.\n"
		"\n"
		"Training options (passed to every worker; config-file keys in brackets):\n");
	hpu__opts_help(f);
}

int hpu__args_doc(FILE *f, const char *format)
{
	int how = hpu__optdoc_format(format);
	if (how < 0)
		return -1;
	hpu__optdoc(f, hpu__args_specs, how, 25);
	hpu__optdoc_heading(f, "Training options (passed to every worker; config-file keys in brackets)", how);
	hpu__optdoc(f, hpu__opts_specs(), how, 27);
	return 0;
}

/* The option of either table nearest to `name` (without dashes and
 * "=VALUE"): within an edit distance of 2, or NULL. */
static const char *nearest_option(const char *name, size_t len)
{
	char want[64];
	if (len >= sizeof want)
		return NULL;
	memcpy(want, name, len);
	want[len] = 0;
	const char *best = NULL;
	size_t bestd = 3;
	const hpu_optspec *tables[2] = {hpu__args_specs, hpu__opts_specs()};
	for (int t = 0; t < 2; t++)
		for (const hpu_optspec *o = tables[t]; o->name || o->short_name; o++) {
			size_t d = o->name && strcmp(o->name, "help-doc") ? hpu__edit_distance(want, o->name) : 99;
			if (d < bestd) {
				bestd = d;
				best = o->name;
			}
		}
	return best;
}

/* A bad value that is a number, given to an option whose plural is one of
 * the launcher's (--device 2 for --devices 2): says so after err. */
void hpu__args_plural_hint(const hpu_optparse *p, char *err, size_t errlen)
{
	const char *v = p->val;
	if (!p->spec || !p->spec->name || !v || !v[0] || strspn(v, "0123456789") != strlen(v))
		return;
	for (const hpu_optspec *o = hpu__args_specs; o->name || o->short_name; o++) {
		size_t n = strlen(p->spec->name);
		if (o->name && !strncmp(o->name, p->spec->name, n) && !strcmp(o->name + n, "s")) {
			size_t len = strlen(err);
			snprintf(err + len, errlen - len, " (did you mean --%s %s?)", o->name, v);
			return;
		}
	}
}

/* The message of an option hpu__optparse_next refused (code r). */
int hpu__args_option_error(const hpu_optparse *p, int r, char *err, size_t errlen)
{
	if (r == HPU_OPT_MISSING) {
		snprintf(err, errlen, "option --%s needs a value", p->spec->name);
	} else if (r == HPU_OPT_UNWANTED && p->spec && p->spec->name) {
		/* the launcher's flags too: "--quiet=1" was "unknown option
		 * --quiet (did you mean --quiet?)" */
		snprintf(err, errlen, "option --%s takes no value", p->spec->name);
	} else if (p->arg[0] == '-' && p->arg[1] != '-') {
		/* -v: "no model given" was said, beside the model */
		snprintf(err, errlen, "unknown option %s (hpulaunch's short options are -q and -h; "
				      "see hpulaunch --help)",
			 p->arg);
	} else {
		const char *name = p->arg + 2, *near = nearest_option(name, strcspn(name, "="));
		int n = (int)strcspn(p->arg, "=");
		if (near)
			snprintf(err, errlen, "unknown option %.*s (did you mean --%s?) (see hpulaunch --help)",
				 n, p->arg, near);
		else
			snprintf(err, errlen, "unknown option %.*s (see hpulaunch --help)", n, p->arg);
	}
	return -1;
}

/* The option of either table that argument arg ("--name",
 * "--name=VALUE" or a short one, "-q") is, or NULL. */
static const hpu_optspec *known_option(const char *arg)
{
	int shrt = arg[0] == '-' && arg[1] && arg[1] != '-' && !arg[2];
	if (!shrt && (strncmp(arg, "--", 2) || !arg[2]))
		return NULL;
	size_t len = shrt ? 0 : strcspn(arg + 2, "=");
	const hpu_optspec *tables[2] = {hpu__args_specs, hpu__opts_specs()};
	for (int t = 0; t < 2; t++)
		for (const hpu_optspec *o = tables[t]; o->name || o->short_name; o++) {
			if (shrt ? o->short_name == arg[1]
				 : o->name && strlen(o->name) == len && !strncmp(o->name, arg + 2, len))
				return o;
		}
	return NULL;
}

/* Refuses hpulaunch's own options among the arguments after the model
 * argv[model] up to "--": they would reach the model, not hpulaunch (the
 * model's arguments go after "--"; others, not hpulaunch's, pass). */
int hpu__args_options_after_model(char **argv, int argc, int model, char *err, size_t errlen)
{
	for (int i = model + 1; i < argc && strcmp(argv[i], "--"); i++) {
		const hpu_optspec *o = known_option(argv[i]);
		if (o) {
			char as[80] = "";
			if (argv[i][1] != '-') /* a short one: its long name too */
				snprintf(as, sizeof as, "%s (--%s)", argv[i], o->name ? o->name : "");
			else
				snprintf(as, sizeof as, "--%s", o->name);
			snprintf(err, errlen, "hpulaunch's option %s comes after the model %s, where the model would get it: put it before the model, or after -- to hand it to the model (hpulaunch ... %s -- %s)",
				 as, argv[model], argv[model], argv[i]);
			return -1;
		}
	}
	return 0;
}
