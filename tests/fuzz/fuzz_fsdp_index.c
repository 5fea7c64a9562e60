/* libFuzzer target: the sharded checkpoint index (src/dist/checkpoint.c) on arbitrary bytes,
 * written as index.json of a committed checkpoint directory, through every reader: verify,
 * metadata and consolidate. Beyond "no crash, no leak, no undefined behaviour": with no
 * shard file present nothing is ever accepted as a complete checkpoint unless it names no
 * tensors. Seeds: tests/fuzz/make_fsdp_corpus.py. */
#include "ctorch/fsdp.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char dir[64];

static void put(const char *name, const void *data, size_t n)
{
    char p[128];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f) abort();
    if (n && fwrite(data, 1, n, f) != n) abort();
    fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "%s/ct-fuzz-fsdp-XXXXXX", getenv("TMPDIR") ? "/tmp" : "/tmp");
        if (!mkdtemp(dir)) abort();
        put("COMMITTED", "x", 1);
    }
    put("index.json", data, size);
    char *sum = NULL, *v = NULL;
    if (ct_sharded_checkpoint_verify(dir, &sum) == CT_OK) {
        if (!strstr(sum, "\"tensors\": 0")) {
            fprintf(stderr, "fuzz_fsdp_index: accepted tensors without shard files\n");
            abort();
        }
        ct_free(sum);
    }
    if (ct_sharded_checkpoint_metadata(dir, "config", &v) == CT_OK) ct_free(v);
    char out[96];
    snprintf(out, sizeof out, "%s/out.safetensors", dir);
    ct_sharded_checkpoint_consolidate(dir, out);
    unlink(out);
    return 0;
}
