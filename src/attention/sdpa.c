/* Dense scaled-dot-product attention on the flex kernels: is_causal becomes the built-in causal
 * block mask (blocks above the diagonal skipped, the mask evaluated on the diagonal only); a
 * boolean mask tensor becomes a mask whose every block is partial (every score is computed,
 * then the tensor is read for it); an additive f32 mask becomes a score mod. */
#include "attention/attn.h"
#include "core/internal.h"

#include <string.h>

typedef struct tmask {
    const char *data;
    ct_dtype dt;
    int64_t sb, sh, sq, sk; /* element strides, 0 along broadcast dims */
} tmask;

/* Transpose an 8 x 8 block of bytes held as 8 little-endian words (x[r] byte c -> x[c] byte r). */
static void transpose8(uint64_t x[8])
{
    for (int r = 0; r < 4; r++) {
        uint64_t t = ((x[r] >> 32) ^ x[r + 4]) & 0x00000000FFFFFFFFull;
        x[r] ^= t << 32, x[r + 4] ^= t;
    }
    for (int r = 0; r < 8; r += (r & 1) ? 3 : 1) { /* 0, 1, 4, 5 */
        uint64_t t = ((x[r] >> 16) ^ x[r + 2]) & 0x0000FFFF0000FFFFull;
        x[r] ^= t << 16, x[r + 2] ^= t;
    }
    for (int r = 0; r < 8; r += 2) {
        uint64_t t = ((x[r] >> 8) ^ x[r + 1]) & 0x00FF00FF00FF00FFull;
        x[r] ^= t << 8, x[r + 1] ^= t;
    }
}

static void tmask_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    const tmask *m = ctx;
    const uint8_t *base =
        (const uint8_t *)m->data + t->b * m->sb + t->h * m->sh + t->q0 * m->sq + t->kv0 * m->sk;
    int64_t i8 = 0, j8 = 0;
    if (t->q_stride == 1 && m->sk == 1) { /* the kernels' key-major tiles: 8 x 8 transposes */
        i8 = t->nq & ~(int64_t)7, j8 = t->nkv & ~(int64_t)7;
        for (int64_t i0 = 0; i0 < i8; i0 += 8)
            for (int64_t j0 = 0; j0 < j8; j0 += 8) {
                uint64_t x[8];
                for (int r = 0; r < 8; r++)
                    memcpy(&x[r], base + (i0 + r) * m->sq + j0, 8);
                transpose8(x);
                for (int c = 0; c < 8; c++)
                    memcpy(keep + (j0 + c) * t->kv_stride + i0, &x[c], 8);
            }
    }
    for (int64_t i = 0; i < t->nq; i++) { /* the rest, along the mask's rows */
        const uint8_t *row = base + i * m->sq;
        uint8_t *dst = keep + i * t->q_stride;
        for (int64_t j = i < i8 ? j8 : 0; j < t->nkv; j++)
            dst[j * t->kv_stride] = row[j * m->sk] != 0;
    }
}

static ct_block_kind tmask_block(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq,
                                 int64_t kv0, int64_t nkv)
{
    return CT_BLOCK_PARTIAL; /* dense: every score is computed, then masked */
}

static void tadd_fwd(void *ctx, const ct_attn_tile *t, float *s)
{
    const tmask *m = ctx;
    const float *base =
        (const float *)m->data + t->b * m->sb + t->h * m->sh + t->q0 * m->sq + t->kv0 * m->sk;
    for (int64_t i = 0; i < t->nq; i++) {
        const float *row = base + i * m->sq;
        float *dst = s + i * t->q_stride;
        for (int64_t j = 0; j < t->nkv; j++)
            dst[j * t->kv_stride] += row[j * m->sk];
    }
}

ct_sdpa_options ct_sdpa_options_default(void)
{
    return (ct_sdpa_options){.scale = 0.0f, .is_causal = false, .attn_mask = NULL};
}

/* What a call needs besides q, k, v: a block mask and mods made from the options. */
typedef struct sdpa_setup {
    tmask tm;
    ct_mask_mod mm;
    ct_score_mod sm;
    ct_block_mask *bm;
    ct_flex_options fo;
} sdpa_setup;

static void setup_free(sdpa_setup *u)
{
    ct_block_mask_free(u->bm);
    ct_mask_mod_free(&u->mm);
}

static ct_status setup(sdpa_setup *u, const char *fn, const ct_tensor *q, const ct_tensor *k,
                       const ct_sdpa_options *opt)
{
    memset(u, 0, sizeof *u);
    ct_sdpa_options o = opt ? *opt : ct_sdpa_options_default();
    u->fo = ct_flex_options_default();
    u->fo.scale = o.scale;
    if (!q || !k || q->ndim != 4 || k->ndim != 4)
        return ct_error(CT_EINVAL, "%s: q and k must be 4-dim tensors [B, H, len, dim]", fn);
    int64_t B = q->shape[0], H = q->shape[1], L = q->shape[2], S = k->shape[2];
    const ct_tensor *m = o.attn_mask;
    if (o.is_causal && m)
        return ct_error(CT_EINVAL, "%s: give either is_causal or attn_mask, not both", fn);
    if (m) {
        bool is_bool = m->dtype == CT_DTYPE_BOOL || m->dtype == CT_DTYPE_U8;
        if (!is_bool && m->dtype != CT_DTYPE_F32)
            return ct_error(CT_EINVAL, "%s: attn_mask must be bool, u8 or f32, got %s", fn,
                            ct_dtype_name(m->dtype));
        if (m->ndim < 2 || m->ndim > 4)
            return ct_error(CT_EINVAL, "%s: attn_mask must have 2 to 4 dims, got %d", fn, m->ndim);
        int64_t want[4] = {B, H, L, S}, st[4] = {0, 0, 0, 0};
        for (int d = 0; d < m->ndim; d++) {
            int wd = 4 - m->ndim + d;
            if (m->shape[d] != 1 && m->shape[d] != want[wd])
                return ct_error(CT_EINVAL, "%s: attn_mask.shape[%d] = %lld must be 1 or %lld", fn,
                                d, (long long)m->shape[d], (long long)want[wd]);
            st[wd] = m->shape[d] == 1 ? 0 : m->strides[d];
        }
        if (!m->data && L * S > 0)
            return ct_error(CT_EINVAL, "%s: attn_mask.data must not be NULL", fn);
        u->tm = (tmask){m->data, m->dtype, st[0], st[1], st[2], st[3]};
        if (!is_bool) {
            u->sm = (ct_score_mod){tadd_fwd, NULL, &u->tm, NULL, NULL, 0};
            u->fo.score_mod = &u->sm;
            return CT_OK;
        }
        u->mm = (ct_mask_mod){tmask_tile, tmask_block, &u->tm, NULL, st[0] != 0, st[1] != 0};
    } else if (o.is_causal) {
        CT_TRY(ct_mask_mod_causal(&u->mm));
    } else {
        return CT_OK;
    }
    if (B < 1 || H < 1 || L < 1 || S < 1) return CT_OK; /* empty: nothing to mask */
    return ct_block_mask_create(&u->mm, B, H, L, S, 128, &u->bm);
}

ct_status ct_sdpa_forward(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                          const ct_sdpa_options *opt, ct_tensor *out, ct_tensor *lse)
{
    const char *fn = "ct_sdpa_forward";
    sdpa_setup u;
    ct_status s = setup(&u, fn, q, k, opt);
    if (s == CT_OK) s = at_forward(fn, q, k, v, u.bm, &u.fo, out, lse);
    setup_free(&u);
    return s;
}

ct_status ct_sdpa_backward(const ct_tensor *q, const ct_tensor *k, const ct_tensor *v,
                           const ct_tensor *out, const ct_tensor *lse, const ct_tensor *dout,
                           const ct_sdpa_options *opt, ct_tensor *dq, ct_tensor *dk, ct_tensor *dv)
{
    const char *fn = "ct_sdpa_backward";
    sdpa_setup u;
    ct_status s = setup(&u, fn, q, k, opt);
    if (s == CT_OK) s = at_backward(fn, q, k, v, out, lse, dout, u.bm, &u.fo, dq, dk, dv);
    setup_free(&u);
    return s;
}
