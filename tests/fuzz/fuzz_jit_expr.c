/* libFuzzer target: the mod expression language (src/jit/parse.c) and what runs on its IR in
 * the library: the C code generator, the symbolic derivative (through codegen) and the
 * interval evaluator (range checks and block classification) over a few grids. The first
 * input byte picks mask or score mod; the rest is the expression. Two arrays are bound:
 * doc (i32 [64]) and bias (f32 [4, 33], with grad for score mods). */
#include "jit/jit_internal.h"

#include <stdlib.h>
#include <string.h>

static int32_t doc[64];
static float bias[4 * 33];

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096) return 0;
    for (int i = 0; i < 64; i++)
        doc[i] = (i * 7) % 5 - 1;
    bool is_mask = data[0] & 1;
    char *expr = malloc(size);
    if (!expr) return 0;
    memcpy(expr, data + 1, size - 1);
    expr[size - 1] = '\0';
    ct_jit_binding b[2] = {{"doc", CT_DTYPE_I32, 1, {64}, doc, false},
                           {"bias", CT_DTYPE_F32, 2, {4, 33}, bias, !is_mask}};
    char *src = NULL;
    if (ct_jit_generate_source(expr, is_mask, b, 2, &src) == CT_OK) {
        if (!src || !strstr(src, is_mask ? "ctj_mask_tile" : "ctj_score_fwd")) abort();
        ct_free(src);
        jir *ir = malloc(sizeof *ir);
        if (ir && jit_parse("fuzz", expr, is_mask, b, 2, ir) == CT_OK) {
            ctj_arr a[2] = {{doc, {64}, {1}, 64, 0}, {bias, {4, 33}, {33, 1}, 132, 0}};
            jival vr[2] = {{-1, 3}, {0, 0}};
            static jival v[JIT_MAX_NODES];
            int64_t lens[3][4] = {{1, 1, 1, 1}, {2, 4, 64, 64}, {3, 2, INT64_MAX / 4, 1000}};
            for (int g = 0; g < 3; g++) {
                jbound bd = {a, vr, {{0, 0}, {0, lens[g][0] - 1}, {0, lens[g][1] - 1},
                                     {0, lens[g][2] - 1}, {0, lens[g][3] - 1}}};
                jit_intervals(ir, &bd, v);
                if (v[ir->root].lo > v[ir->root].hi && ir->n[ir->root].t != JT_FLOAT) abort();
            }
        }
        free(ir);
    }
    free(expr);
    return 0;
}
