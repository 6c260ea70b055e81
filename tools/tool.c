/* tool: see tool.h. */
#include "tools/tool.h"
#include "common/log.h"
#include "common/optdoc.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>

const char *hpu__tool_name = "hputrain";

int hpu__tool_start(const char *name)
{
	char err[200];
	hpu__tool_name = name;
	if (hpu__log_init(err, sizeof err, "%s", name) == 0)
		return 0;
	hpu__log(HPU_LOG_ERROR, "error: %s", err);
	return -1;
}

int hpu__tool_log_level(const char *value)
{
	char err[200];
	hpu_log_level lvl;
	if (hpu__log_parse_level(value, "--log-level", &lvl, err, sizeof err) < 0)
		return hpu__tool_usage(NULL, "%s", err);
	hpu__log_set_level(lvl);
	return 0;
}

/* One line of the tool's: "NAME: " + `head` + fmt's text. */
static void say(hpu_log_level lvl, const char *head, const char *fmt, va_list ap)
{
	char text[4096];
	vsnprintf(text, sizeof text, fmt, ap);
	hpu__log(lvl, "%s%s", head, text);
}

int hpu__tool_fail(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	say(HPU_LOG_ERROR, "error: ", fmt, ap);
	va_end(ap);
	return HPU_TOOL_BAD;
}

void hpu__tool_warn(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	say(HPU_LOG_WARNING, "warning: ", fmt, ap);
	va_end(ap);
}

void hpu__tool_note(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	say(HPU_LOG_NOTICE, "note: ", fmt, ap);
	va_end(ap);
}

int hpu__tool_usage(const char *cmd, const char *fmt, ...)
{
	char text[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof text, fmt, ap);
	va_end(ap);
	hpu__log_plain(HPU_LOG_ERROR, "%s%s%s: %s", hpu__tool_name, cmd ? " " : "", cmd ? cmd : "",
		       text);
	hpu__log_plain(HPU_LOG_ERROR, "(%s %s%s--help for the usage)", hpu__tool_name, cmd ? cmd : "",
		       cmd ? " " : "");
	return HPU_TOOL_USAGE;
}

int hpu__tool_out_is_stdout(const char *path)
{
	struct stat o, p;
	return fstat(1, &o) == 0 && stat(path, &p) == 0 && o.st_dev == p.st_dev &&
	       o.st_ino == p.st_ino;
}

int hpu__tool_doc(const struct hpu_optspec *specs, const char *format, int col)
{
	int how = hpu__optdoc_format(format);
	if (how < 0)
		return hpu__tool_usage(NULL, "--help-doc takes help, scdoc or markdown, not '%s'", format);
	hpu__optdoc(stdout, specs, how, col);
	return HPU_TOOL_OK;
}
