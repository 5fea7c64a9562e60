/* The ctorch program: one function per command, and the helpers they share. */
#ifndef CT_CLI_H
#define CT_CLI_H

#include "ctorch/ctorch.h"

#include <stdbool.h>

/* A command: argv[0] is the command name. Returns the process exit status. */
typedef int (*cli_cmd_fn)(int argc, char **argv);

int cmd_bench(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_tokenizer(int argc, char **argv);
int cmd_telemetry(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_launch(int argc, char **argv);

/* Print "ctorch: <what>: <status>: <last error>" to stderr and return exit status 1. */
int cli_fail(const char *what, ct_status s);
/* Parse an integer / float option value; on error print a message and return false. */
bool cli_int(const char *opt, const char *val, long long lo, long long hi, long long *out);
bool cli_float(const char *opt, const char *val, double *out);
/* True when argv[i] is `name`; then *val is the next argument (error if missing). */
bool cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* Folder of the running executable's source tree scripts (bench/), or NULL. */
const char *cli_source_dir(void);

#endif
