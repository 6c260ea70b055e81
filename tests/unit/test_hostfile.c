/* Unit tests for the hostfile reader (launcher/hostfile.c) and for
 * `hpulaunch --hostfile`, `--status`, `--hpud-port` and `--key` through
 * hpu__args_parse: every format DeepSpeed and Open MPI write, and every
 * error, which must name FILE:LINE and what is wrong. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "tests/unit/args_testlib.h"

#include "launcher/args.h"
#include "launcher/hostfile.h"

static char hostfile[64], model[64];

/* Writes text to this test's hostfile and returns its path. */
static const char *write_hosts(const char *text)
{
	FILE *f = fopen(hostfile, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
	return hostfile;
}

/* Writes len bytes (NULs included) to this test's hostfile. */
static const char *write_hosts_n(const char *bytes, size_t len)
{
	FILE *f = fopen(hostfile, "w");
	assert_non_null(f);
	assert_int_equal(fwrite(bytes, 1, len, f), len);
	fclose(f);
	return hostfile;
}

static hpu_host *read_ok(const char *text, int *n)
{
	hpu_host *h = NULL;
	char err[512] = "";
	int rc = hpu__hostfile_read(write_hosts(text), &h, n, err, sizeof err);
	if (rc != 0)
		fail_msg("hostfile rejected: %s", err);
	assert_non_null(h);
	return h;
}

/* Asserts that the len bytes are refused with "FILE:LINE: ..." holding
 * needle. */
static void read_fails_n(const char *bytes, size_t len, int line, const char *needle)
{
	hpu_host *h = (hpu_host *)1;
	int n = -1;
	char err[512] = "", where[96];
	int rc = hpu__hostfile_read(write_hosts_n(bytes, len), &h, &n, err, sizeof err);
	printf("  -> %s\n", err);
	assert_int_equal(rc, -1);
	assert_null(h);
	assert_int_equal(n, 0);
	if (line > 0)
		snprintf(where, sizeof where, "%s:%d: ", hostfile, line);
	else
		snprintf(where, sizeof where, "%s", hostfile);
	if (!strstr(err, where))
		fail_msg("error \"%s\" does not name \"%s\"", err, where);
	if (!strstr(err, needle))
		fail_msg("error \"%s\" does not say \"%s\"", err, needle);
}

/* Asserts that text is refused with "FILE:LINE: ..." holding needle. */
static void read_fails(const char *text, int line, const char *needle)
{
	read_fails_n(text, strlen(text), line, needle);
}

static void test_deepspeed_format(void **state)
{
	(void)state;
	int n;
	hpu_host *h = read_ok("worker-1 slots=4\nworker-2 slots=4\n", &n);
	assert_int_equal(n, 2);
	assert_string_equal(h[0].name, "worker-1");
	assert_int_equal(h[0].slots, 4);
	assert_int_equal(h[0].port, 0);
	assert_string_equal(h[1].name, "worker-2");
	assert_int_equal(h[1].slots, 4);
	free(h);
}

static void test_openmpi_format(void **state)
{
	(void)state;
	int n;
	hpu_host *h = read_ok("# the cluster\n"
			      "\n"
			      "node1 slots=2 max_slots=4\n"
			      "   node2.example.com   slots = 2   # trailing comment\n"
			      "\tnode_3\tmax_slots=8\tslots=8\r\n"
			      "10.0.0.4\n"
			      "node5 max-slots=2\n"
			      "   \t\n"
			      "# end\n"
			      "node6 slots=1", /* no final newline */
			      &n);
	assert_int_equal(n, 6);
	assert_string_equal(h[0].name, "node1");
	assert_int_equal(h[0].slots, 2);
	assert_string_equal(h[1].name, "node2.example.com");
	assert_int_equal(h[1].slots, 2);
	assert_string_equal(h[2].name, "node_3");
	assert_int_equal(h[2].slots, 8);
	assert_string_equal(h[3].name, "10.0.0.4");
	assert_int_equal(h[3].slots, 0); /* not given */
	assert_string_equal(h[4].name, "node5");
	assert_int_equal(h[4].slots, 0);
	assert_string_equal(h[5].name, "node6");
	assert_int_equal(h[5].slots, 1);
	free(h);
}

static void test_ports(void **state)
{
	(void)state;
	int n;
	hpu_host *h = read_ok("node1:29401 slots=8\n"
			      "10.1.2.3:65535\n"
			      "127.0.0.1:29400 slots=1\n"
			      "127.0.0.1:29401 slots=1\n" /* two daemons, one machine */
			      "node1 slots=8\n",            /* no port: another entry */
			      &n);
	assert_int_equal(n, 5);
	assert_string_equal(h[0].name, "node1");
	assert_int_equal(h[0].port, 29401);
	assert_int_equal(h[0].slots, 8);
	assert_string_equal(h[1].name, "10.1.2.3");
	assert_int_equal(h[1].port, 65535);
	assert_int_equal(h[2].port, 29400);
	assert_int_equal(h[3].port, 29401);
	assert_int_equal(h[4].port, 0);
	free(h);
}

static void test_limits_accepted(void **state)
{
	(void)state;
	/* 4096 hosts, a 255-character name, a 1024-character line. */
	size_t cap = 4096 * 24 + 2048;
	char *text = malloc(cap), *p = text;
	assert_non_null(text);
	for (int i = 0; i < 4096; i++)
		p += sprintf(p, "host%05d slots=1024\n", i);
	int n;
	hpu_host *h = read_ok(text, &n);
	assert_int_equal(n, 4096);
	assert_string_equal(h[4095].name, "host04095");
	assert_int_equal(h[4095].slots, 1024);
	free(h);

	char name[256];
	memset(name, 'a', 255);
	name[255] = 0;
	snprintf(text, cap, "%s slots=1 %*s\n", name, 1024 - 255 - 9, "#");
	assert_int_equal((int)strlen(text), 1025);
	h = read_ok(text, &n);
	assert_int_equal(n, 1);
	assert_int_equal((int)strlen(h[0].name), 255);
	free(h);
	free(text);
}

static void test_errors(void **state)
{
	(void)state;
	read_fails("node1 slots=4\nnode2 slots=0\n", 2, "bad slots '0' for host node2");
	read_fails("node1 slots=four\n", 1, "bad slots 'four' for host node1");
	read_fails("node1 slots=-1\n", 1, "bad slots '-1'");
	read_fails("node1 slots=+4\n", 1, "bad slots '+4'");
	read_fails("node1 slots=4x\n", 1, "bad slots '4x'");
	read_fails("node1 slots=1025\n", 1, "bad slots '1025'");
	read_fails("node1 slots=\n", 1, "bad slots ''");
	read_fails("node1 slots=2 slots=2\n", 1, "slots given twice");
	read_fails("node1 max_slots=x\n", 1, "bad max_slots 'x'");
	read_fails("node1 slots=8 max_slots=4\n", 1, "slots=8 above max_slots=4");
	read_fails("\n# c\nnode1 gpus=8\n", 3, "unknown attribute 'gpus' for host node1");
	read_fails("node1 4\n", 1, "expected slots=N after host node1, found '4'");
	read_fails("node1 =4\n", 1, "expected slots=N after host node1, found '=4'");
	read_fails("node1 slots 4\n", 1, "found 'slots'");
	read_fails("node1 slots=1\nnode2\nnode1 slots=2\n", 3, "duplicate host node1");
	read_fails("Node1\nnode1\n", 2, "duplicate host node1");
	read_fails("n:29401\nn:29401\n", 2, "duplicate host n:29401");
	read_fails("node1:0\n", 1, "bad port '0' for host node1");
	read_fails("node1:65536\n", 1, "bad port '65536'");
	read_fails("node1:\n", 1, "bad port ''");
	read_fails("node1:http\n", 1, "bad port 'http'");
	read_fails(":29400\n", 1, "no host name");
	read_fails("fe80::1 slots=1\n", 1, "IPv6 addresses are not supported");
	read_fails("300.1.2.3\n", 1, "bad IPv4 address '300.1.2.3'");
	read_fails("10.0.0\n", 1, "bad IPv4 address '10.0.0'");
	read_fails("user@node1\n", 1, "bad host 'user@node1'");
	read_fails("-node\n", 1, "bad host '-node'");
	read_fails("", 0, "no hosts in the hostfile (the file is empty)");
	read_fails("# only\n\n   \n# comments\n", 0, "no hosts in the hostfile (only blank lines and comments)");

	char name[300], line[1100];
	memset(name, 'a', 256);
	name[256] = 0;
	snprintf(line, sizeof line, "node0\n%s slots=1\n", name);
	read_fails(line, 2, "host name longer than 255 characters");

	memset(line, 'x', 1025);
	memcpy(line, "node1 #", 7);
	strcpy(line + 1025, "\nnode2\n");
	read_fails(line, 1, "line longer than 1024 characters");
	line[1025] = 0; /* also without a newline at the end */
	read_fails(line, 1, "line longer than 1024 characters");
}

/* A binary file is not "a line longer than 1024 characters": the line
 * with a NUL or another control byte is named as such. */
static void test_binary_lines(void **state)
{
	(void)state;
	static const char nul[] = "node1\nno\0de2\nnode3\n";
	read_fails_n(nul, sizeof nul - 1, 2, "a NUL byte: not a text file");
	char zeros[4096] = {0};
	read_fails_n(zeros, sizeof zeros, 1, "a NUL byte: not a text file");
	read_fails("node1\n# fine\nnode2\x01 slots=1\n", 3,
		   "a control character (byte 0x01): not a text file");
	read_fails("node1\x7f\n", 1, "a control character (byte 0x7f)");
	static const char elf[] = "\x7f" "ELF\x02\x01\x01\0\0\0";
	read_fails_n(elf, sizeof elf - 1, 1, "not a text file");
	/* Tabs, CRLF and UTF-8 in comments are text. */
	int n;
	hpu_host *h = read_ok("node1\tslots=2\r\n# n\xc5\x93ud\xc3\xa9\nnode2\tslots=2\n", &n);
	assert_int_equal(n, 2);
	assert_int_equal(h[0].slots, 2);
	free(h);
}

/* A FIFO (or anything but a regular file) is refused at once, not waited
 * on for a writer that never comes. */
static void test_not_regular(void **state)
{
	(void)state;
	char fifo[64] = "/tmp/hpu-test-hosts-fifo-XXXXXX";
	int fd = mkstemp(fifo);
	assert_true(fd >= 0);
	close(fd);
	unlink(fifo);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	hpu_host *h;
	int n;
	char err[256] = "";
	alarm(10); /* a hang fails the test instead of blocking ctest */
	int rc = hpu__hostfile_read(fifo, &h, &n, err, sizeof err);
	alarm(0);
	unlink(fifo);
	printf("  -> %s\n", err);
	assert_int_equal(rc, -1);
	assert_null(h);
	assert_non_null(strstr(err, fifo));
	assert_non_null(strstr(err, "not a regular file (a FIFO)"));
	rc = hpu__hostfile_read("/dev/null", &h, &n, err, sizeof err);
	assert_int_equal(rc, -1);
	assert_non_null(strstr(err, "cannot read the hostfile /dev/null: not a regular file"));
}

static void test_too_many_hosts(void **state)
{
	(void)state;
	char *text = malloc(4097 * 16), *p = text;
	assert_non_null(text);
	for (int i = 0; i < 4097; i++)
		p += sprintf(p, "h%d\n", i);
	read_fails(text, 4097, "more than 4096 hosts");
	free(text);
}

static void test_missing_file(void **state)
{
	(void)state;
	hpu_host *h;
	int n;
	char err[256];
	assert_int_equal(hpu__hostfile_read("/nonexistent/hosts", &h, &n, err, sizeof err), -1);
	assert_null(h);
	assert_non_null(strstr(err, "cannot read the hostfile /nonexistent/hosts: No such file"));
	assert_int_equal(hpu__hostfile_read("/tmp", &h, &n, err, sizeof err), -1);
	assert_non_null(strstr(err, "cannot read the hostfile /tmp"));
}

/* ---- through hpu__args_parse ---- */

static int setup(void **state)
{
	return args_clean_env(state);
}


static void test_args_hostfile(void **state)
{
	(void)state;
	hpu_launch_args a;
	write_hosts("node1 slots=8\nnode2:29411 slots=8\n");
	parse_ok(&a, ARGV("--hostfile", hostfile, model));
	assert_string_equal(a.hostfile, hostfile);
	assert_int_equal(a.nhosts, 2);
	assert_int_equal(a.nodes, 2);
	assert_int_equal(a.devices, 8);
	assert_int_equal(a.node_rank, 0);
	assert_string_equal(a.master_addr, "node1");
	assert_int_equal(a.master_port, 0); /* node 0's hpud picks it */
	assert_int_equal(a.hpud_port, 29400);
	assert_int_equal(a.hosts[0].port, 29400); /* hpud_port filled in */
	assert_int_equal(a.hosts[1].port, 29411);
	assert_int_equal((int)strlen(a.token), 64); /* made: no HPU_JOB_TOKEN */
	assert_memory_equal(a.job_id, "job-", 4);
	assert_null(a.status_host);
	assert_int_equal(a.from_slurm, 0);
	hpu__args_free(&a);
	hpu__args_free(&a); /* safe twice */

	/* Hosts with different slots (DeepSpeed's hostfiles): each runs its
	 * own, the world is their sum; --devices D runs D on each. */
	write_hosts("big slots=8\nsmall slots=4\nmid slots=6\n");
	parse_ok(&a, ARGV("--hostfile", hostfile, "--batch-size", "180", model));
	assert_int_equal(a.nodes, 3);
	assert_int_equal(a.world, 18);
	assert_int_equal(a.devices, 8); /* node 0's */
	assert_int_equal(a.hosts[0].slots, 8);
	assert_int_equal(a.hosts[1].slots, 4);
	assert_int_equal(a.hosts[2].slots, 6);
	hpu__args_free(&a);
	parse_ok(&a, ARGV("--hostfile", hostfile, "--devices", "2", "--batch-size", "96", model));
	assert_int_equal(a.world, 6);
	for (int i = 0; i < 3; i++)
		assert_int_equal(a.hosts[i].slots, 2);
	hpu__args_free(&a);
	write_hosts("node1 slots=8\nnode2:29411 slots=8\n");

	/* --devices below the slots; flags and environment that still apply. */
	setenv("MASTER_ADDR", "10.9.9.9", 1);
	setenv("MASTER_PORT", "31000", 1);
	setenv("NODE_RANK", "1", 1);
	setenv("HPU_JOB_TOKEN", "sekrit", 1);
	parse_ok(&a, ARGV("--hostfile", hostfile, "--devices", "4", "--hpud-port", "7000",
			  "--job-id", "mine", model));
	assert_int_equal(a.devices, 4);
	assert_int_equal(a.nodes, 2);
	assert_int_equal(a.node_rank, 0); /* NODE_RANK is moot with a hostfile */
	assert_string_equal(a.master_addr, "10.9.9.9");
	assert_int_equal(a.master_port, 31000);
	assert_string_equal(a.token, "sekrit");
	assert_string_equal(a.job_id, "mine");
	assert_int_equal(a.hosts[0].port, 7000);
	assert_int_equal(a.hosts[1].port, 29411);
	hpu__args_free(&a);
	setup(NULL);

	/* One host: a single node, free port (--exec is refused with a
	 * hostfile: test_launch_args' test_exec_hostfile). */
	write_hosts("solo\n");
	parse_ok(&a, ARGV("--hostfile", hostfile, "--devices", "2", model));
	assert_int_equal(a.nodes, 1);
	assert_int_equal(a.devices, 2);
	assert_int_equal(a.master_port, 0);
	assert_string_equal(a.master_addr, "solo");
	hpu__args_free(&a);
}

/* Two lines naming one hpud are refused, with both lines as written,
 * once the default port (--hpud-port) is applied and the names resolved:
 * "127.0.0.1" beside "127.0.0.1:41001" with --hpud-port 41001, and
 * "localhost:41003" beside "127.0.0.1:41003" (both passed). Two daemons
 * on one machine, on two ports, are still fine. */
static void test_args_hostfile_duplicate_resolved(void **state)
{
	(void)state;
	char want[256];
	write_hosts("127.0.0.1 slots=1\n127.0.0.1:41001 slots=1\n");
	snprintf(want, sizeof want,
		 "%s:2: duplicate host 127.0.0.1:41001: the same hpud as line 1's 127.0.0.1 "
		 "(127.0.0.1:41001)", hostfile);
	parse_fails(ARGV("--hostfile", hostfile, "--hpud-port", "41001", model), want);
	write_hosts("localhost:41003 slots=1\n127.0.0.1:41003 slots=1\n");
	snprintf(want, sizeof want,
		 "%s:2: duplicate host 127.0.0.1:41003: the same hpud as line 1's localhost:41003 "
		 "(127.0.0.1:41003)", hostfile);
	parse_fails(ARGV("--hostfile", hostfile, model), want);
	write_hosts("127.0.0.1:41002 slots=1\nlocalhost slots=1\n");
	snprintf(want, sizeof want,
		 "%s:2: duplicate host localhost: the same hpud as line 1's 127.0.0.1:41002 "
		 "(127.0.0.1:41002)", hostfile);
	parse_fails(ARGV("--hostfile", hostfile, "--hpud-port", "41002", model), want);
	hpu_launch_args a;
	write_hosts("127.0.0.1 slots=1\n127.0.0.1:41001 slots=1\nlocalhost:41002 slots=1\n"
		    "127.0.0.1:41003 slots=1\n");
	parse_ok(&a, ARGV("--hostfile", hostfile, model));
	assert_int_equal(a.nhosts, 4);
	assert_int_equal(a.hosts[0].port, 29400);
	hpu__args_free(&a);
}

static void test_args_hostfile_errors(void **state)
{
	(void)state;
	write_hosts("a slots=8\nb\nc\nd\ne\nf\ng slots=4\n");
	parse_fails(ARGV("--hostfile", hostfile, model),
		    "gives no slots=N for host b, c, d, e and 1 more: give slots for every host, or --devices");
	parse_fails(ARGV("--hostfile", hostfile, "--devices", "6", model),
		    "--devices 6 is more than the slots of host g (4)");
	write_hosts("a slots=8\nb slots=8\nc slots=4\n");
	setenv("WORLD_SIZE", "24", 1);
	parse_fails(ARGV("--hostfile", hostfile, model),
		    "WORLD_SIZE=24 from the environment does not equal the 20 workers of ");
	write_hosts("a slots=1\n"); /* issue 39: "1 worker", "1 host" */
	setenv("WORLD_SIZE", "2", 1);
	parse_fails(ARGV("--hostfile", hostfile, model),
		    "WORLD_SIZE=2 from the environment does not equal the 1 worker of ");
	unsetenv("WORLD_SIZE");
	parse_fails(ARGV("--hostfile", hostfile, "--devices", "auto", model),
		    "--devices auto counts this machine's cores");
	parse_fails(ARGV("--hostfile", hostfile, "--nodes", "3", "--devices", "4", model),
		    "--nodes does not go with --hostfile");
	parse_fails(ARGV("--node-rank", "0", "--hostfile", hostfile, model),
		    "--node-rank does not go with --hostfile");
	parse_fails(ARGV("--hostfile", hostfile, "--master-addr", "x", model),
		    "--master-addr does not go with --hostfile");
	write_hosts("a slots=1\nb slots=1\nc slots=1\n"); /* world 3 */
	parse_fails(ARGV("--hostfile", hostfile, model), "is not divisible");
	parse_fails(ARGV("--hostfile", hostfile, "--transport", "ipc", model),
		    "--transport ipc works within one node only");
	write_hosts("a slots=1\nb bogus=1\n");
	char where[96];
	snprintf(where, sizeof where, "%s:2: unknown attribute 'bogus'", hostfile);
	parse_fails(ARGV("--hostfile", hostfile, model), where);
	parse_fails(ARGV("--hostfile", "/nonexistent/hosts", model),
		    "cannot read the hostfile /nonexistent/hosts");
	parse_fails(ARGV("--hostfile", "", model), "bad value '' for --hostfile");
	parse_fails(ARGV("--hostfile"), "option --hostfile needs a value");
	parse_fails(ARGV("--hostfile", hostfile), "no model given");
}

/* A relative model path is made absolute on this side: hpu-worker's
 * dlopen would search the library path for a bare name, and hpud would
 * resolve any other relative name against its own directory. */
static void test_args_model_path(void **state)
{
	(void)state;
	hpu_launch_args a;
	char cwd[4096], rel[80];
	assert_non_null(getcwd(cwd, sizeof cwd));
	assert_int_equal(chdir("/tmp"), 0);
	const char *base = strrchr(model, '/') + 1;
	write_hosts("node1 slots=2\nnode2 slots=2\n");
	parse_ok(&a, ARGV("--hostfile", hostfile, (char *)base, "--", "x.so"));
	assert_int_equal(a.worker_argc, 4);
	assert_string_equal(a.worker_argv[1], model);
	assert_string_equal(a.worker_argv[2], "--");
	assert_string_equal(a.worker_argv[3], "x.so"); /* the model's own */
	hpu__args_free(&a);
	snprintf(rel, sizeof rel, "./%s", base);
	parse_ok(&a, ARGV("--devices", "2", "--lr", "0.1", rel));
	assert_int_equal(a.worker_argc, 5); /* the worker's "--" after the model */
	assert_string_equal(a.worker_argv[3], model);
	assert_string_equal(a.worker_argv[4], "--");
	hpu__args_free(&a);
	snprintf(rel, sizeof rel, "../tmp/%s", base);
	parse_ok(&a, ARGV(rel));
	assert_string_equal(a.worker_argv[1], model);
	hpu__args_free(&a);
	parse_ok(&a, ARGV(model)); /* absolute: as given */
	assert_string_equal(a.worker_argv[1], model);
	hpu__args_free(&a);
	assert_int_equal(chdir(cwd), 0);
	/* dlopen would wait on a FIFO for a writer */
	char fifo[64] = "/tmp/hpu-test-model-fifo-XXXXXX";
	int fd = mkstemp(fifo);
	assert_true(fd >= 0);
	close(fd);
	unlink(fifo);
	assert_int_equal(mkfifo(fifo, 0600), 0);
	parse_fails(ARGV("--devices", "2", fifo), "is not a regular file (a FIFO)");
	unlink(fifo);
	parse_fails(ARGV("/tmp"), "the model /tmp is not a regular file (a directory)");
}

/* With --hostfile hpud starts the workers in its own directory: every
 * relative path of a training option reaches them absolute against this
 * one, whichever way it was written, and so do the paths the --config
 * file gives (as flags, which win over the file) and the file variables
 * carried to hpud. Without --hostfile the options go as written. */
static void test_args_option_paths(void **state)
{
	(void)state;
	hpu_launch_args a;
	char cwd[4096], cfg[64] = "/tmp/hpu-test-relcfg-XXXXXX", want[96];
	int fd = mkstemp(cfg);
	assert_true(fd >= 0);
	const char *json = "{\"hputrain\": {\"metrics\": \"m.jsonl\", \"checkpoint_dir\": \"/abs/ck\"}}";
	assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
	close(fd);
	assert_non_null(getcwd(cwd, sizeof cwd));
	assert_int_equal(chdir("/tmp"), 0);
	write_hosts("node1 slots=2\n");
	setenv("QUANT_CONFIG", "q.json", 1);
	setenv("LOWER_LIST", "/etc/lower", 1);
	char *rel = cfg + 5; /* "hpu-test-relcfg-..." in /tmp */
	parse_ok(&a, ARGV("--hostfile", hostfile, "--config", rel, "--profile", "--save-params=p.bin",
			  "--resume", "auto", "--lr", "0.1", model));
	assert_int_equal(a.worker_argc, 11); /* the worker's "--" after the model */
	snprintf(want, sizeof want, "--config=%s", cfg);
	assert_string_equal(a.worker_argv[1], want);
	assert_string_equal(a.worker_argv[2], "--profile=/tmp");
	assert_string_equal(a.worker_argv[3], "--save-params=/tmp/p.bin");
	assert_string_equal(a.worker_argv[4], "--resume");
	assert_string_equal(a.worker_argv[5], "auto"); /* not a path */
	assert_string_equal(a.worker_argv[6], "--lr");
	assert_string_equal(a.worker_argv[7], "0.1");
	assert_string_equal(a.worker_argv[8], "--metrics=/tmp/m.jsonl"); /* the file's */
	assert_string_equal(a.worker_argv[9], model);
	assert_string_equal(a.worker_argv[10], "--");
	assert_string_equal(getenv("QUANT_CONFIG"), "/tmp/q.json");
	assert_string_equal(getenv("LOWER_LIST"), "/etc/lower");
	hpu__args_free(&a);
	setenv("QUANT_CONFIG", "q.json", 1);
	parse_ok(&a, ARGV("--devices", "2", "--metrics", "m.jsonl", model));
	assert_string_equal(a.worker_argv[2], "m.jsonl");
	assert_string_equal(getenv("QUANT_CONFIG"), "q.json");
	hpu__args_free(&a);
	unsetenv("QUANT_CONFIG");
	unsetenv("LOWER_LIST");
	assert_int_equal(chdir(cwd), 0);
	unlink(cfg);
}

static void test_args_status(void **state)
{
	(void)state;
	hpu_launch_args a;
	parse_ok(&a, ARGV("--status", "node7:29444"));
	assert_string_equal(a.status_host, "node7");
	assert_int_equal(a.status_port, 29444);
	assert_string_equal(a.key_path, "/etc/hpud/secret.key");
	hpu__args_free(&a);

	setenv("HPU_KEY_FILE", "/tmp/env.key", 1);
	parse_ok(&a, ARGV("--status", "10.0.0.1", "--hpud-port", "1234"));
	assert_string_equal(a.status_host, "10.0.0.1");
	assert_int_equal(a.status_port, 1234);
	assert_string_equal(a.key_path, "/tmp/env.key");
	hpu__args_free(&a);

	parse_ok(&a, ARGV("-q", "--key", "/tmp/flag.key", "--status", "a", "--status", "b"));
	assert_string_equal(a.status_host, "b");
	assert_int_equal(a.status_port, 29400);
	assert_string_equal(a.key_path, "/tmp/flag.key");
	assert_int_equal(a.quiet, 1);
	hpu__args_free(&a);
	unsetenv("HPU_KEY_FILE");

	parse_fails(ARGV("--status", "a", model), "--status prints a daemon's jobs and takes no model");
	parse_fails(ARGV("--status", "a", "--exec", "/bin/true"), "takes no --exec");
	write_hosts("a\n");
	parse_fails(ARGV("--status", "a", "--hostfile", hostfile), "takes no --hostfile");
	parse_fails(ARGV("--status", "a:0"), "bad value 'a:0' for --status");
	parse_fails(ARGV("--status", ":80"), "bad value ':80' for --status");
	parse_fails(ARGV("--status", "::1"), "bad value '::1' for --status");
	parse_fails(ARGV("--status", ""), "bad value '' for --status");
	parse_fails(ARGV("--hpud-port", "0", "--status", "a"), "bad value '0' for --hpud-port");
	parse_fails(ARGV("--key", "", "--status", "a"), "bad value '' for --key");
}

/* Without the new options nothing changes. */
static void test_args_defaults(void **state)
{
	(void)state;
	hpu_launch_args a;
	parse_ok(&a, ARGV("--devices", "2", model));
	assert_int_equal(a.nodes, 1);
	assert_int_equal(a.devices, 2);
	assert_null(a.hostfile);
	assert_null(a.hosts);
	assert_int_equal(a.nhosts, 0);
	assert_null(a.status_host);
	assert_int_equal(a.hpud_port, 29400);
	assert_string_equal(a.key_path, "/etc/hpud/secret.key");
	assert_string_equal(a.master_addr, "127.0.0.1");
	assert_int_equal(a.master_port, 0);
	hpu__args_free(&a);
}

static int group_setup(void **state)
{
	(void)state;
	int fd;
	strcpy(hostfile, "/tmp/hpu-test-hosts-XXXXXX");
	strcpy(model, "/tmp/hpu-test-model-XXXXXX");
	if ((fd = mkstemp(hostfile)) < 0)
		return -1;
	close(fd);
	if ((fd = mkstemp(model)) < 0)
		return -1;
	close(fd);
	return setup(NULL);
}

static int group_teardown(void **state)
{
	(void)state;
	unlink(hostfile);
	unlink(model);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_deepspeed_format),
		cmocka_unit_test(test_openmpi_format),
		cmocka_unit_test(test_ports),
		cmocka_unit_test(test_limits_accepted),
		cmocka_unit_test(test_errors),
		cmocka_unit_test(test_binary_lines),
		cmocka_unit_test(test_not_regular),
		cmocka_unit_test(test_too_many_hosts),
		cmocka_unit_test(test_missing_file),
		cmocka_unit_test_setup(test_args_hostfile, setup),
		cmocka_unit_test_setup(test_args_hostfile_errors, setup),
		cmocka_unit_test_setup(test_args_hostfile_duplicate_resolved, setup),
		cmocka_unit_test_setup(test_args_model_path, setup),
		cmocka_unit_test_setup(test_args_option_paths, setup),
		cmocka_unit_test_setup(test_args_status, setup),
		cmocka_unit_test_setup(test_args_defaults, setup),
	};
	/* HPU_TEST=test_name (a glob) runs only the tests it names. */
	if (getenv("HPU_TEST") != NULL)
		cmocka_set_test_filter(getenv("HPU_TEST"));
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
