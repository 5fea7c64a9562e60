/* libFuzzer target: ct_gpt_load_state_dict (behind `ctorch generate --model FILE.pt`, `ctorch
 * convert FILE.pt DIR` and Python models.load of a .pt) on arbitrary tensor-file images
 * (safetensors or torch.save zips, whatever ct_load_memory reads), into two tiny models (tied
 * with q/k/v biases, untied without).
 *
 * Checks, beyond "no crash, no out-of-bounds read, no leak, no undefined behaviour": a refusal
 * names its cause (the error message is set); loading the same image twice gives the same
 * status and the same weights (no state kept between calls). Seeds: state dicts under ctorch
 * and Hugging Face names with prefixes, in f32 / bf16, and hostile variants, written by
 * tests/fuzz/make_state_dict_corpus.py. */
#include "ctorch/ctorch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_state_dict: invariant failed: %s (%s)\n", #c, ct_last_error());  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* The shape make_state_dict_corpus.py writes its seeds for. */
static ct_gpt_config tiny(bool tied)
{
    ct_gpt_config c = ct_gpt_config_default();
    c.vocab_size = 16;
    c.context = 8;
    c.n_layer = 1;
    c.d_model = 8;
    c.n_head = 2;
    c.n_kv_head = 1;
    c.d_ff = 4;
    c.tied = tied;
    c.qkv_bias = tied;
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ct_tensor_file *f = NULL;
    if (ct_load_memory(data, size, NULL, &f) != CT_OK) return 0;
    for (int k = 0; k < 2; k++) {
        ct_gpt_config c = tiny(k == 0);
        ct_gpt_options o = ct_gpt_options_default();
        o.batch = 1;
        o.seq = 1;
        ct_gpt *a = NULL, *b = NULL;
        FUZZ_REQUIRE(ct_gpt_create(&c, &o, &a) == CT_OK && ct_gpt_create(&c, &o, &b) == CT_OK);
        ct_clear_error();
        ct_status s1 = ct_gpt_load_state_dict(a, f);
        FUZZ_REQUIRE(s1 == CT_OK || ct_last_error()[0] != '\0');
        ct_status s2 = ct_gpt_load_state_dict(b, f);
        FUZZ_REQUIRE(s1 == s2);
        if (s1 == CT_OK)
            FUZZ_REQUIRE(memcmp(ct_gpt_params(a), ct_gpt_params(b),
                                (size_t)ct_gpt_num_params(a) * sizeof(float)) == 0);
        ct_gpt_free(a);
        ct_gpt_free(b);
    }
    ct_tensor_file_close(f);
    return 0;
}
