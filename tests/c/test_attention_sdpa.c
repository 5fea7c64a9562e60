/* Dense SDPA (no mask, is_causal, boolean and additive mask tensors with broadcasting)
 * against the naive reference, and is_causal against flex causal (the same kernels). */
#include "test_attention_ref.h"

/* The reference reads the same mask tensors through mods. */
typedef struct dmask {
    const void *m;
    int64_t sb, sh, L, S;
} dmask;

static void dm_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    const dmask *d = ctx;
    const uint8_t *m = d->m;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t j = 0; j < t->nkv; j++)
            keep[i * t->q_stride + j * t->kv_stride] =
                m[t->b * d->sb + t->h * d->sh + (t->q0 + i) * d->S + t->kv0 + j];
}

static void dm_add(void *ctx, const ct_attn_tile *t, float *s)
{
    const dmask *d = ctx;
    const float *m = d->m;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t j = 0; j < t->nkv; j++)
            s[i * t->q_stride + j * t->kv_stride] +=
                m[t->b * d->sb + t->h * d->sh + (t->q0 + i) * d->S + t->kv0 + j];
}

static ct_status run_sdpa(const acase *c, const ct_sdpa_options *so, abufs *a)
{
    ct_tensor q = a_wrap(a->q, CT_DTYPE_F32, c->B, c->Hq, c->L, c->E);
    ct_tensor k = a_wrap(a->k, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->E);
    ct_tensor v = a_wrap(a->v, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->Ev);
    ct_tensor o = a_wrap(a->out, CT_DTYPE_F32, c->B, c->Hq, c->L, c->Ev);
    ct_tensor l = a_wrap(a->lse, CT_DTYPE_F32, c->B, c->Hq, c->L, -1);
    ct_tensor dO = a_wrap(a->dout, CT_DTYPE_F32, c->B, c->Hq, c->L, c->Ev);
    ct_tensor dq = a_wrap(a->dq, CT_DTYPE_F32, c->B, c->Hq, c->L, c->E);
    ct_tensor dk = a_wrap(a->dk, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->E);
    ct_tensor dv = a_wrap(a->dv, CT_DTYPE_F32, c->B, c->Hkv, c->S, c->Ev);
    ct_status s = ct_sdpa_forward(&q, &k, &v, so, &o, &l);
    if (s != CT_OK) return s;
    return ct_sdpa_backward(&q, &k, &v, &o, &l, &dO, so, &dq, &dk, &dv);
}

int main(void)
{
    int64_t B = 2, H = 4, Hkv = 2, L = 150, S = 170, E = 16;
    float scale = 0.25f;
    acase c = {B, H, Hkv, L, S, E, E, scale, NULL, NULL};
    ct_sdpa_options so = ct_sdpa_options_default();
    so.scale = scale;

    /* no mask */
    abufs a;
    abufs_init(&a, &c);
    CHECK_OK(run_sdpa(&c, &so, &a));
    CHECK(a_compare(&c, &a, 1e-4, "sdpa dense"));

    /* is_causal equals flex with the causal block mask, bit for bit */
    so.is_causal = true;
    CHECK_OK(run_sdpa(&c, &so, &a));
    ct_mask_mod causal;
    CHECK_OK(ct_mask_mod_causal(&causal));
    c.mask = &causal;
    CHECK(a_compare(&c, &a, 1e-4, "sdpa causal"));
    abufs f;
    t_rng = 99;
    abufs_init(&f, &c);
    memcpy(f.q, a.q, 4 * a_nq(&c)), memcpy(f.k, a.k, 4 * a_nk(&c));
    memcpy(f.v, a.v, 4 * a_nv(&c)), memcpy(f.dout, a.dout, 4 * a_no(&c));
    ct_block_mask *bm;
    CHECK_OK(ct_block_mask_create(&causal, B, H, L, S, 128, &bm));
    CHECK_OK(a_run(&c, bm, &f));
    CHECK(memcmp(f.out, a.out, 4 * a_no(&c)) == 0 && memcmp(f.dk, a.dk, 4 * a_nk(&c)) == 0);
    ct_block_mask_free(bm);
    abufs_free(&f);
    so.is_causal = false;

    /* boolean mask [B, 1, L, S] with a fully masked row, broadcast over heads */
    uint8_t *bmask = malloc((size_t)(B * L * S));
    for (int64_t x = 0; x < B * L * S; x++)
        bmask[x] = t_uniform(0, 1) < 0.7f;
    memset(bmask + 5 * S, 0, (size_t)S);
    ct_tensor tm;
    CHECK_OK(ct_tensor_wrap(&tm, bmask, CT_DTYPE_BOOL, 4, (int64_t[]){B, 1, L, S}, NULL));
    so.attn_mask = &tm;
    dmask dm = {bmask, L * S, 0, L, S};
    ct_mask_mod um = {dm_tile, NULL, &dm, NULL, true, false};
    c.mask = &um;
    CHECK_OK(run_sdpa(&c, &so, &a));
    CHECK(a_compare(&c, &a, 1e-4, "sdpa bool mask"));
    CHECK(a.lse[5] == -INFINITY && a.out[5 * E] == 0.0f);

    /* boolean mask [L, S] shared by all */
    CHECK_OK(ct_tensor_wrap(&tm, bmask, CT_DTYPE_U8, 2, (int64_t[]){L, S}, NULL));
    dm.sb = 0;
    CHECK_OK(run_sdpa(&c, &so, &a));
    CHECK(a_compare(&c, &a, 1e-4, "sdpa u8 mask 2-d"));

    /* additive mask [1, H, L, S] */
    float *fmask = malloc(sizeof(float) * (size_t)(H * L * S));
    t_fill(fmask, (size_t)(H * L * S), -2, 2);
    for (int64_t x = 0; x < H * L * S; x += 7)
        fmask[x] = -INFINITY;
    CHECK_OK(ct_tensor_wrap(&tm, fmask, CT_DTYPE_F32, 4, (int64_t[]){1, H, L, S}, NULL));
    dmask da = {fmask, 0, L * S, L, S};
    ct_score_mod add = {dm_add, NULL, &da, NULL, NULL, 0};
    c.mask = NULL;
    c.sm = &add;
    CHECK_OK(run_sdpa(&c, &so, &a));
    CHECK(a_compare(&c, &a, 1e-4, "sdpa additive mask"));

    free(bmask);
    free(fmask);
    abufs_free(&a);
    ct_mask_mod_free(&causal);
    return t_report("test_attention_sdpa");
}
