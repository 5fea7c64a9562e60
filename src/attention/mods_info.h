/* What a mask_mod / score_mod is (src/attention/mods.c): the library's built-in mods are
 * recognised by their callbacks (their contexts are private to mods.c), so a device can run
 * the same mask or score as its own built-in (src/device/flex_device.c maps them onto the
 * flex slots' ct_flex_mods). Read-only: the pointers returned point into the mod's context
 * and live as long as the mod. */
#ifndef CT_ATTENTION_MODS_INFO_H
#define CT_ATTENTION_MODS_INFO_H

#include "ctorch/attention.h"

typedef enum at_mod_kind {
    AT_MOD_OTHER = 0, /* not made by mods.c: a user callback, or a compiled (jit) mod */
    AT_MOD_NOOP,      /* ct_mask_mod_noop */
    AT_MOD_BAND,      /* ct_mask_mod_causal / _sliding_window / _prefix_lm */
    AT_MOD_DOCUMENT,  /* ct_mask_mod_document */
    AT_MOD_AND,       /* ct_mask_mod_and */
    AT_MOD_OR,        /* ct_mask_mod_or */
    AT_MOD_NOT,       /* ct_mask_mod_not */
    AT_MOD_SOFTCAP,   /* ct_score_mod_softcap */
    AT_MOD_ALIBI,     /* ct_score_mod_alibi */
    AT_MOD_RELBIAS,   /* ct_score_mod_relative_bias */
} at_mod_kind;

/* A band's bounds on q - kv when there is none. */
#define AT_BAND_NONE_LO (INT64_MIN / 4)
#define AT_BAND_NONE_HI (INT64_MAX / 4)

typedef struct at_mask_info {
    at_mod_kind kind;
    /* AT_MOD_BAND: kept when kv < prefix, or lo <= q - kv <= hi (AT_BAND_NONE_*: unbounded).
     * causal: lo 0, hi none, prefix 0; sliding window w: lo 0 (causal) or -w, hi w;
     * prefix LM p: lo 0, hi none, prefix p. */
    int64_t lo, hi, prefix;
    /* AT_MOD_DOCUMENT: ids [doc_batch, q_len] and [doc_batch, kv_len] (row-major) */
    const int32_t *q_doc, *kv_doc;
    int64_t doc_batch, doc_q_len, doc_kv_len;
    /* AT_MOD_AND / _OR / _NOT: the children (n of them) */
    const ct_mask_mod *kids;
    int n;
} at_mask_info;

typedef struct at_score_info {
    at_mod_kind kind;
    float cap;           /* AT_MOD_SOFTCAP */
    int64_t heads;       /* AT_MOD_ALIBI: slope of head h is slopes[h % heads] */
    const float *slopes; /* AT_MOD_ALIBI */
} at_score_info;

/* Describe m (NULL: AT_MOD_OTHER). */
void at_mask_describe(const ct_mask_mod *m, at_mask_info *out);
void at_score_describe(const ct_score_mod *m, at_score_info *out);

#endif
