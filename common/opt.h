/* opt: the one command-line parser every command uses (nng's args.h
 * idea). A command lists its options in a table ended by an empty entry
 * and reads argv with an iterator:
 *
 *	static const hpu_optspec specs[] = {
 *		{"output", 'o', HPU_OPT_VALUE, OPT_OUTPUT, "FILE", "where to write"},
 *		{"help", 'h', HPU_OPT_FLAG, OPT_HELP, NULL, "this help"},
 *		{0},
 *	};
 *	hpu_optparse p;
 *	hpu__optparse_init(&p, argc, argv, specs);
 *	for (int id; (id = hpu__optparse_next(&p)) != HPU_OPT_END;)
 *		switch (id) { ... }
 *
 * It reads "--name value", "--name=value", "-x value", flags ("--name",
 * "-x"), positional arguments in their place among the options ("-" alone
 * is one), and "--", after which every argument is positional. Names match
 * exactly, never by prefix; a short option stands alone ("-xVALUE", "-x=V"
 * and "-xy" are unknown options). An option that takes a value takes the
 * next argument whatever it is ("--lr -1"). Nothing is printed: the
 * command words its own messages from the codes. */
#ifndef HPU_COMMON_OPT_H
#define HPU_COMMON_OPT_H

/* What follows an option. */
enum {
	HPU_OPT_FLAG = 0,     /* nothing: "--name=V" is an error */
	HPU_OPT_VALUE = 1,    /* a value: "=V" or the next argument */
	HPU_OPT_OPTIONAL = 2, /* "=V" or nothing; the caller may take the
			       * next argument (p->ind) as the value */
};

/* One option. The last four fields are what --help and the manual say
 * of it (optdoc.h prints them); the parser reads none of them. */
typedef struct hpu_optspec {
	const char *name; /* the long name without dashes ("output"), or NULL */
	char short_name;  /* 'o' for "-o", or 0 */
	int value;        /* HPU_OPT_FLAG, HPU_OPT_VALUE or HPU_OPT_OPTIONAL */
	int id;           /* what hpu__optparse_next returns for it: above 0 */
	const char *arg;  /* its value's name in the help ("FILE"); NULL: VALUE */
	const char *help; /* what it does; NULL: another name of the option
			   * of the same id above it, or not documented */
	const char *env;  /* the environment variable that sets it too; NULL */
	const char *section; /* a heading printed before it; NULL */
} hpu_optspec;

/* What hpu__optparse_next returns besides an option's id. */
enum {
	HPU_OPT_END = 0,         /* no argument left */
	HPU_OPT_POSITIONAL = -1, /* p->val: an argument that is no option */
	HPU_OPT_UNKNOWN = -2,    /* p->arg: an option of neither table */
	HPU_OPT_MISSING = -3,    /* p->spec: its value is missing (argv ended) */
	HPU_OPT_UNWANTED = -4,   /* p->spec: a flag written with "=V" */
};

/* The iterator's state; the caller reads the fields, and may move ind. */
typedef struct hpu_optparse {
	int argc;
	char *const *argv;
	const hpu_optspec *specs; /* the options */
	const hpu_optspec *more;  /* more options, searched after specs; NULL */
	int ind;                  /* the next argument to read (1 at first) */
	int rest;                 /* "--" was read: the rest is positional */
	int at;                   /* where the last one read starts: argv[at] */
	const char *arg;          /* argv[at], as written */
	const char *val;          /* the option's value, or the positional
				   * argument; NULL for a flag */
	const hpu_optspec *spec;  /* the option read, or NULL */
} hpu_optparse;

/* Starts reading argv[1..argc) against specs. */
void hpu__optparse_init(hpu_optparse *p, int argc, char *const *argv, const hpu_optspec *specs);

/* Reads the next argument (with its value): returns the option's id, or
 * one of HPU_OPT_END, _POSITIONAL, _UNKNOWN, _MISSING, _UNWANTED. After
 * an error the iterator may go on with the argument after argv[at]. */
int hpu__optparse_next(hpu_optparse *p);

#endif
