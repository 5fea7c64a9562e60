/* `ctorch generate --prompt-ids ""` (issue 20, item 10): no ids at all passed a NULL pointer to
 * memcpy, undefined behaviour that the sanitised build (scripts/test.sh runs every C test under
 * ASan + UBSan, with the sanitised CLI) stops on. An empty id list is the empty prompt: the
 * same prompt and new tokens as --prompt ''. Runs the CLI of this build ($CTORCH_CLI). */
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Run a shell command; its stdout into out (NUL-terminated). Returns the exit status. */
static int run(const char *cmd, char *out, size_t cap)
{
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The JSON array after "key": in a line, copied out. */
static void field(const char *json, const char *key, char *out, size_t cap)
{
    out[0] = '\0';
    const char *p = strstr(json, key);
    if (!p) return;
    p = strchr(p, '[');
    const char *e = p ? strchr(p, ']') : NULL;
    if (!p || !e || (size_t)(e - p + 1) >= cap) return;
    memcpy(out, p, (size_t)(e - p + 1));
    out[e - p + 1] = '\0';
}

int main(void)
{
    const char *cli = getenv("CTORCH_CLI");
    CHECK(cli != NULL); /* ctest sets it; without it this test cannot run: a failure */
    if (!cli) return t_report("test_cli_generate_ids");
    char dir[] = "/tmp/ctorch-gen-ids-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char cmd[1024], out[8192], want_p[256], want_n[256], got_p[256], got_n[256];
    snprintf(cmd, sizeof cmd,
             "'%s' train --vocab 512 --classes 8 --sentence 5 --repeats 3 --layers 1 --d-model 16 "
             "--heads 2 --kv-heads 1 --ffn 24 --context 16 --batch 2 --steps 1 --quiet --out '%s'",
             cli, dir);
    CHECK(run(cmd, out, sizeof out) == 0);
    const char *base = "generate --max-new-tokens 6 --greedy --ignore-eos --json --model";
    snprintf(cmd, sizeof cmd, "'%s' %s '%s/checkpoint.safetensors' --prompt ''", cli, base, dir);
    CHECK(run(cmd, out, sizeof out) == 0);
    field(out, "\"prompt_ids\"", want_p, sizeof want_p);
    field(out, "\"new_ids\"", want_n, sizeof want_n);
    CHECK(want_p[0] && want_n[0]);
    const char *lists[] = {"''", "' '", "' , '"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s '%s/checkpoint.safetensors' --prompt-ids %s", cli, base,
                 dir, lists[i]);
        int rc = run(cmd, out, sizeof out);
        CHECK(rc == 0);
        field(out, "\"prompt_ids\"", got_p, sizeof got_p);
        field(out, "\"new_ids\"", got_n, sizeof got_n);
        CHECK(!strcmp(got_p, want_p) && !strcmp(got_n, want_n));
        if (rc || strcmp(got_n, want_n))
            fprintf(stderr, "  --prompt-ids %s: rc %d, %s %s (want %s %s)\n", lists[i], rc, got_p,
                    got_n, want_p, want_n);
    }
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
    return t_report("test_cli_generate_ids");
}
