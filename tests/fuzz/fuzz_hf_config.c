/* libFuzzer target: the Hugging Face config.json parser (ct_hf_config_parse) on arbitrary
 * bytes. Beyond "no crash, no leak, no undefined behaviour": an accepted config passes
 * ct_gpt_config_check, its RoPE frequencies are finite, and its ctorch JSON reads back to the
 * same JSON text. Seeds: tests/fuzz/make_hf_corpus.py. */
#include "ctorch/ctorch.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_hf_config: invariant failed: %s (%s)\n", #c, ct_last_error());   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ct_gpt_config c;
    ct_hf_info info;
    if (ct_hf_config_parse((const char *)data, size, &c, &info) != CT_OK) return 0;
    FUZZ_REQUIRE(ct_gpt_config_check(&c) == CT_OK);
    FUZZ_REQUIRE(info.arch >= CT_HF_LLAMA && info.arch <= CT_HF_MISTRAL);
    static float f[2048];
    int64_t E = ct_gpt_head_dim(&c);
    FUZZ_REQUIRE(E >= 2 && E / 2 <= 2048);
    FUZZ_REQUIRE(ct_gpt_rope_inv_freq(&c, f) == CT_OK);
    for (int64_t i = 0; i < E / 2; i++)
        FUZZ_REQUIRE(isfinite(f[i]));
    char *a, *b;
    FUZZ_REQUIRE(ct_gpt_config_to_json(&c, &a) == CT_OK);
    ct_gpt_config back = ct_gpt_config_default();
    FUZZ_REQUIRE(ct_gpt_config_from_json(a, &back) == CT_OK);
    FUZZ_REQUIRE(ct_gpt_config_to_json(&back, &b) == CT_OK);
    FUZZ_REQUIRE(!strcmp(a, b));
    ct_free(a);
    ct_free(b);
    return 0;
}
