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
int cmd_checkpoint(int argc, char **argv);
/* ctorch inspect DIR: a sharded checkpoint directory (cmd_checkpoint.c). */
int cli_inspect_sharded(const char *dir, bool json);
int cmd_convert(int argc, char **argv);
/* A model from a PyTorch state dict / tensor file without ctorch's "format" (model_pt.c): its
 * configuration from the file's "config" entry or a config.json beside it (Hugging Face's or
 * ctorch's; *config_text, may be NULL, receives a HF config.json's text, malloc'd), then its
 * tensors (ctorch or HF names under one prefix; others refused by name) into m. 0 or an exit
 * status, the message printed. */
int cli_pt_model_config(const char *path, const ct_tensor_file *f, ct_gpt_config *cfg,
                        ct_hf_info *info, char **config_text);
int cli_pt_model_load(const char *path, const ct_tensor_file *f, ct_gpt *m);

/* Print "ctorch: <what>: <status>: <last error>" to stderr and return exit status 1. */
int cli_fail(const char *what, ct_status s);
/* Parse an integer / float option value; on error print a message and return false. */
bool cli_int(const char *opt, const char *val, long long lo, long long hi, long long *out);
bool cli_float(const char *opt, const char *val, double *out);
/* True when argv[i] is `name`; then *val is the next argument (error if missing). */
bool cli_opt(int argc, char **argv, int *i, const char *name, const char **val);
/* Running ranks on this host (cmd_launch.c), shared by `ctorch launch` and `train --nproc`:
 * serves the store on addr, makes a random job secret (CT_JOB_SECRET in the ranks'
 * environment, never on a command line; an inherited one is kept), starts nproc ranks of
 * prog each in its own process group with RANK, WORLD_SIZE, MASTER_ADDR, ... set, streams
 * their output, forwards SIGINT/SIGTERM, ends them on failure or max_time and removes the
 * shared-memory segments of ranks that died. Returns the exit status of the job. */
typedef struct cli_launch_opts {
    int nproc;
    int port;          /* store port, 0 = a free one */
    const char *addr;  /* MASTER_ADDR (default 127.0.0.1) */
    double timeout;    /* CT_COMM_TIMEOUT of the ranks, 0 = theirs */
    double grace;      /* seconds between SIGTERM and SIGKILL (default 5) */
    double max_time;   /* end the job after this many seconds, 0 = no limit */
    int elastic;       /* survivors keep running when a rank fails */
    int prefix;        /* [rankK]: on output lines (default 1) */
    const char *frdir; /* CT_COMM_FR_DUMP_DIR of the ranks, NULL = none */
    int json;          /* launcher events as JSON lines (default: CT_COMM_LOG=json) */
} cli_launch_opts;
cli_launch_opts cli_launch_defaults(void);
int cli_launch_run(const cli_launch_opts *o, char *const *prog);
/* Folder of the running executable's source tree scripts (bench/), or NULL. */
const char *cli_source_dir(void);
/* Copy tokenizer.json, tokenizer_config.json, special_tokens_map.json and
 * generation_config.json of a Hugging Face directory into dst_dir where present (cli/
 * side_files.c): 0, or 1 with a message naming the file and the rule it broke. */
int cli_copy_side_files(const char *cmd, const char *src_dir, const char *dst_dir);

#endif
