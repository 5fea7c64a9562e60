/* Private entry points shared by flex attention and dense SDPA: both run the same tiled
 * kernels (flex.c), SDPA with a block mask and mods made from its options (sdpa.c). */
#ifndef CT_ATTENTION_ATTN_H
#define CT_ATTENTION_ATTN_H

#include "ctorch/attention.h"

/* Forward / backward as documented for ct_flex_attention_*; fn names the caller in errors. */
ct_status at_forward(const char *fn, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                     const ct_block_mask *bm, const ct_flex_options *opt, ct_tensor *out,
                     ct_tensor *lse);
ct_status at_backward(const char *fn, const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                      const ct_tensor *out, const ct_tensor *lse, const ct_tensor *dout,
                      const ct_block_mask *bm, const ct_flex_options *opt, ct_tensor *dq,
                      ct_tensor *dk, ct_tensor *dv);

/* Validate a mod for a grid of B x H x L x S before it is used: compiled mods (src/jit)
 * range-check their array indices; combinators check their children; others pass. */
ct_status at_mask_check(const ct_mask_mod *m, int64_t B, int64_t H, int64_t L, int64_t S);
ct_status at_score_check(const ct_score_mod *m, int64_t B, int64_t H, int64_t L, int64_t S);
/* The compile backend's side of those checks (src/jit/mod.c): CT_OK for mods it did not make. */
ct_status jit_mask_check(const ct_mask_mod *m, int64_t B, int64_t H, int64_t L, int64_t S);
ct_status jit_score_check(const ct_score_mod *m, int64_t B, int64_t H, int64_t L, int64_t S);

#endif
