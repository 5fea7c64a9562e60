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

#endif
