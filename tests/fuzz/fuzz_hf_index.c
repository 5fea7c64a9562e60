/* libFuzzer target: the model.safetensors.index.json parser (src/model/hf.c) on arbitrary
 * bytes. Beyond "no crash, no leak, no undefined behaviour": every accepted entry has a name
 * and a shard inside the list, and every shard name is a plain *.safetensors file name.
 * Seeds: tests/fuzz/make_hf_corpus.py. */
#include "model/hf_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_hf_index: invariant failed: %s (%s)\n", #c, ct_last_error());    \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    hf_index x;
    if (hf_index_parse((const char *)data, size, "fuzz", &x) != CT_OK) return 0;
    FUZZ_REQUIRE(x.n > 0 && x.nshards >= 1 && x.nshards <= HF_MAX_SHARDS);
    for (size_t i = 0; i < x.n; i++)
        FUZZ_REQUIRE(x.names[i] && x.shard[i] >= 0 && x.shard[i] < x.nshards);
    for (int k = 0; k < x.nshards; k++) {
        size_t n = strlen(x.files[k]);
        FUZZ_REQUIRE(n > 12 && !strcmp(x.files[k] + n - 12, ".safetensors"));
        FUZZ_REQUIRE(!strchr(x.files[k], '/') && x.files[k][0] != '.');
    }
    hf_index_free(&x);
    return 0;
}
