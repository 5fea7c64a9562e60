/* libFuzzer target: the checkpoint validation path (ct_gpt_checkpoint_check, behind
 * `ctorch generate` and `ctorch train --resume`) on arbitrary safetensors images.
 *
 * Checks, beyond "no crash, no out-of-bounds read, no leak, no undefined behaviour":
 * validation allocates a bounded amount whatever the "config" says (the name table of at
 * most 1024 layers, never the model); the trainer check implies the model check; and what
 * validates loads: the model built from the configuration takes every tensor. Seeds: tiny
 * checkpoints and hostile variants written by tests/fuzz/make_checkpoint_corpus.py. */
#include "ctorch/ctorch.h"

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_REQUIRE(c)                                                                            \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            fprintf(stderr, "fuzz_checkpoint: invariant failed: %s (%s)\n", #c, ct_last_error());  \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ct_tensor_file *f = NULL;
    if (ct_load_memory(data, size, NULL, &f) != CT_OK) return 0;
    ct_memory_stats_t before, after;
    ct_memory_reset_peak();
    ct_memory_stats(&before);
    ct_gpt_config model, trainer;
    ct_clear_error();
    ct_status s_model = ct_gpt_checkpoint_check(f, false, &model);
    FUZZ_REQUIRE(s_model == CT_OK || ct_last_error()[0] != '\0');
    ct_clear_error();
    ct_status s_trainer = ct_gpt_checkpoint_check(f, true, &trainer);
    FUZZ_REQUIRE(s_trainer == CT_OK || ct_last_error()[0] != '\0');
    ct_memory_stats(&after);
    FUZZ_REQUIRE(after.peak_bytes - before.current_bytes <= (size_t)4 << 20);
    FUZZ_REQUIRE(s_trainer != CT_OK || s_model == CT_OK);
    if (s_model == CT_OK) {
        FUZZ_REQUIRE(ct_gpt_config_check(&model) == CT_OK);
        ct_gpt_config again;
        FUZZ_REQUIRE(ct_gpt_checkpoint_config(f, &again) == CT_OK);
        /* every parameter is in the image (>= 1 byte each), so the model is small here */
        ct_gpt_options o = ct_gpt_options_default();
        o.batch = 1;
        o.seq = 1;
        ct_gpt *m = NULL;
        FUZZ_REQUIRE(ct_gpt_create(&model, &o, &m) == CT_OK);
        FUZZ_REQUIRE(ct_gpt_load_params(m, f) == CT_OK);
        ct_gpt_free(m);
    }
    ct_tensor_file_close(f);
    return 0;
}
