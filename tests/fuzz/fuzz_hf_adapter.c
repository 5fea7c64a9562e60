/* libFuzzer target: the PEFT adapter_config.json parser (src/model/lora.c) on arbitrary bytes.
 * Beyond "no crash, no leak, no undefined behaviour": an accepted config has a rank in
 * [1, 4096], a finite alpha > 0 and a non-empty set of known targets. Seeds:
 * tests/fuzz/make_hf_corpus.py. */
#include "model/hf_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_hf_adapter: invariant failed: %s (%s)\n", #c, ct_last_error());  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int64_t r;
    double alpha;
    uint32_t targets;
    bool rslora;
    if (lora_parse_config((const char *)data, size, &r, &alpha, &targets, &rslora) != CT_OK) return 0;
    FUZZ_REQUIRE(r >= 1 && r <= 4096);
    FUZZ_REQUIRE(alpha > 0 && isfinite(alpha));
    FUZZ_REQUIRE(targets && !(targets & ~(uint32_t)127));
    return 0;
}
