/* ct_score_mod_compile / ct_mask_mod_compile: parse, build (compile layer), then bind the
 * arrays into a context and hand out the tile callbacks, the range check and the interval
 * block classifier. */
#include "attention/attn.h"
#include "jit/jit_internal.h"

#include <stdio.h>
#include <string.h>

typedef struct jctx {
    const jkernel *k;
    int narr;
    ctj_arr a[CT_JIT_MAX_ARRAYS];
    jival vr[CT_JIT_MAX_ARRAYS];
    char names[CT_JIT_MAX_ARRAYS][64];
} jctx;

static void j_score_fwd(void *ctx, const ct_attn_tile *t, float *s)
{
    const jctx *c = ctx;
    c->k->score_fwd(c->a, t, s);
}

static void j_score_grad(void *ctx, const ct_attn_tile *t, const float *s, float *g, float *dparam)
{
    const jctx *c = ctx;
    c->k->score_grad(c->a, t, s, g, dparam);
}

static void j_mask_tile(void *ctx, const ct_attn_tile *t, uint8_t *keep)
{
    const jctx *c = ctx;
    c->k->mask_tile(c->a, t, keep);
}

static ct_block_kind j_mask_block(void *ctx, int64_t b, int64_t h, int64_t q0, int64_t nq,
                                  int64_t kv0, int64_t nkv)
{
    const jctx *c = ctx;
    const jir *ir = c->k->ir;
    jival v[JIT_MAX_NODES];
    jbound bd = {c->a, c->vr, {{0, 0}, {b, b}, {h, h}, {q0, q0 + nq - 1}, {kv0, kv0 + nkv - 1}}};
    jit_intervals(ir, &bd, v);
    jival r = v[ir->root];
    if (r.lo >= 1) return CT_BLOCK_FULL;
    if (r.hi <= 0) return CT_BLOCK_EMPTY;
    return CT_BLOCK_PARTIAL;
}

static ct_status j_check(void *ctx, int64_t B, int64_t H, int64_t L, int64_t S)
{
    const jctx *c = ctx;
    const jir *ir = c->k->ir;
    if (B < 1 || H < 1 || L < 1 || S < 1)
        return ct_error(CT_EINVAL, "compiled mod: B, H, Q_LEN, KV_LEN must be >= 1");
    jival v[JIT_MAX_NODES];
    jbound bd = {c->a, c->vr, {{0, 0}, {0, B - 1}, {0, H - 1}, {0, L - 1}, {0, S - 1}}};
    jit_intervals(ir, &bd, v);
    for (int x = 0; x < ir->len; x++) {
        const jnode *n = &ir->n[x];
        if (n->op != J_ARR) continue;
        const ctj_arr *a = &c->a[n->arr];
        for (int d = 0; d < n->nk; d++) {
            jival iv = v[n->k[d]];
            if (iv.lo >= 0 && iv.hi < a->shape[d]) continue;
            return ct_error(CT_EINVAL,
                            "compiled mod: index %d of '%s' can reach [%lld, %lld], outside its "
                            "size %lld (for B=%lld H=%lld Q_LEN=%lld KV_LEN=%lld)",
                            d, c->names[n->arr], (long long)iv.lo, (long long)iv.hi,
                            (long long)a->shape[d], (long long)B, (long long)H, (long long)L,
                            (long long)S);
        }
    }
    return CT_OK;
}

ct_status jit_mask_check(const ct_mask_mod *m, int64_t B, int64_t H, int64_t L, int64_t S)
{
    return m->tile == j_mask_tile ? j_check(m->ctx, B, H, L, S) : CT_OK;
}

ct_status jit_score_check(const ct_score_mod *m, int64_t B, int64_t H, int64_t L, int64_t S)
{
    return m->fwd == j_score_fwd ? j_check(m->ctx, B, H, L, S) : CT_OK;
}

const jir *jit_mask_mod_ir(const ct_mask_mod *m, const ctj_arr **arrs)
{
    if (!m || m->tile != j_mask_tile || !m->ctx) return NULL;
    const jctx *c = m->ctx;
    if (arrs) *arrs = c->a;
    return c->k->ir;
}

const jir *jit_score_mod_ir(const ct_score_mod *m, const ctj_arr **arrs)
{
    if (!m || m->fwd != j_score_fwd || !m->ctx) return NULL;
    const jctx *c = m->ctx;
    if (arrs) *arrs = c->a;
    return c->k->ir;
}

ct_status ct_jit_check_mask(const ct_mask_mod *m, int64_t B, int64_t H, int64_t L, int64_t S)
{
    if (!m) return ct_error(CT_EINVAL, "ct_jit_check_mask: m must not be NULL");
    return at_mask_check(m, B, H, L, S);
}

ct_status ct_jit_check_score(const ct_score_mod *m, int64_t B, int64_t H, int64_t L, int64_t S)
{
    if (!m) return ct_error(CT_EINVAL, "ct_jit_check_score: m must not be NULL");
    return jit_score_check(m, B, H, L, S);
}

static void j_free(void *ctx)
{
    ct_free(ctx);
}

/* Which of b and h the root reaches. */
static void uses(const jir *ir, bool *ub, bool *uh)
{
    bool live[JIT_MAX_NODES] = {false};
    live[ir->root] = true;
    *ub = *uh = false;
    for (int x = ir->len - 1; x >= 0; x--) {
        if (!live[x]) continue;
        const jnode *n = &ir->n[x];
        for (int i = 0; i < n->nk; i++)
            live[n->k[i]] = true;
        if (n->op == J_VAR && n->iv == JV_B) *ub = true;
        if (n->op == J_VAR && n->iv == JV_H) *uh = true;
    }
}

/* True when the score mod needs no backward callback (derivative 1, no parameters). */
static ct_status identity_grad(const jir *ir, bool *out)
{
    jir *w;
    int *memo;
    CT_TRY(ct_alloc((void **)&w, sizeof *w));
    ct_status s = ct_alloc((void **)&memo, sizeof(int) * JIT_MAX_NODES);
    if (s != CT_OK) {
        ct_free(w);
        return s;
    }
    *w = *ir;
    *out = false;
    int d = jir_deriv(w, ir->root, -1, memo);
    if (d < -1) s = CT_EINVAL;
    bool one = d >= 0 && w->n[d].op == J_CONST && w->n[d].t == JT_FLOAT && w->n[d].fv == 1.0;
    bool params = false;
    for (int i = 0; i < ir->narr; i++)
        params = params || ir->arr[i].grad;
    *out = s == CT_OK && one && !params;
    ct_free(memo);
    ct_free(w);
    return s;
}

static ct_status bind(const char *fn, const ct_jit_binding *bb, int n, jctx *c, int64_t *param_len)
{
    c->narr = n;
    int64_t gofs = 0;
    for (int i = 0; i < n; i++) {
        const ct_jit_binding *b = &bb[i];
        ctj_arr *a = &c->a[i];
        snprintf(c->names[i], sizeof c->names[i], "%s", b->name);
        int64_t numel = 1;
        for (int d = b->ndim - 1; d >= 0; d--) {
            if (b->shape[d] < 0)
                return ct_error(CT_EINVAL, "%s: binding '%s' has a negative size in dim %d", fn,
                                b->name, d);
            a->shape[d] = b->shape[d];
            a->stride[d] = numel;
            if (__builtin_mul_overflow(numel, b->shape[d], &numel) || numel > ((int64_t)1 << 40))
                return ct_error(CT_EOVERFLOW, "%s: binding '%s' is too large", fn, b->name);
        }
        a->numel = numel;
        a->data = b->data;
        if (numel > 0 && !b->data)
            return ct_error(CT_EINVAL, "%s: binding '%s' has %lld elements but data is NULL", fn,
                            b->name, (long long)numel);
        a->gofs = b->requires_grad ? gofs : 0;
        if (b->requires_grad) gofs += numel;
        jival r = {0, 0};
        if (b->dtype != CT_DTYPE_F32 && numel > 0) {
            r = (jival){INT64_MAX, INT64_MIN};
            for (int64_t e = 0; e < numel; e++) {
                int64_t x = b->dtype == CT_DTYPE_I32   ? ((const int32_t *)b->data)[e]
                            : b->dtype == CT_DTYPE_I64 ? ((const int64_t *)b->data)[e]
                                                       : ((const uint8_t *)b->data)[e] != 0;
                if (x < r.lo) r.lo = x;
                if (x > r.hi) r.hi = x;
            }
        }
        c->vr[i] = r;
    }
    *param_len = gofs;
    return CT_OK;
}

ct_status ct_mod_compile_many(const ct_jit_request *reqs, int n, const ct_jit_options *opt)
{
    const char *fn = "ct_mod_compile_many";
    if (!reqs || n < 1 || n > 4096)
        return ct_error(CT_EINVAL, "%s: need 1 .. 4096 requests, got %d", fn, n);
    for (int i = 0; i < n; i++) {
        if (!reqs[i].score_out == !reqs[i].mask_out)
            return ct_error(CT_EINVAL, "%s: request %d must set exactly one of score_out, mask_out", fn, i);
        if (reqs[i].score_out) memset(reqs[i].score_out, 0, sizeof *reqs[i].score_out);
        if (reqs[i].mask_out) memset(reqs[i].mask_out, 0, sizeof *reqs[i].mask_out);
    }
    jir **irs;
    jkernel **ks;
    jctx **ctx;
    CT_TRY(ct_calloc((void **)&irs, (size_t)n * sizeof *irs));
    ct_status s = ct_calloc((void **)&ks, (size_t)n * sizeof *ks);
    if (s == CT_OK) s = ct_calloc((void **)&ctx, (size_t)n * sizeof *ctx);
    if (s != CT_OK) {
        ct_free(irs);
        ct_free(ks);
        return s;
    }
    for (int i = 0; i < n && s == CT_OK; i++) {
        const ct_jit_request *r = &reqs[i];
        const char *what = r->mask_out ? "ct_mask_mod_compile" : "ct_score_mod_compile";
        s = ct_alloc((void **)&irs[i], sizeof(jir));
        if (s == CT_OK) s = jit_parse(what, r->expr, r->mask_out != NULL, r->bindings, r->n, irs[i]);
        if (s == CT_OK) s = ct_calloc((void **)&ctx[i], sizeof(jctx));
        int64_t pl;
        if (s == CT_OK) s = bind(what, r->bindings, r->n, ctx[i], &pl);
    }
    if (s == CT_OK) s = jit_build(irs, n, opt, ks);
    for (int i = 0; i < n && s == CT_OK; i++) {
        const ct_jit_request *r = &reqs[i];
        jctx *c = ctx[i];
        c->k = ks[i];
        const jir *ir = ks[i]->ir;
        bool ub, uh;
        uses(ir, &ub, &uh);
        if (r->mask_out) {
            *r->mask_out = (ct_mask_mod){j_mask_tile, j_mask_block, c, j_free, ub, uh};
        } else {
            bool ident;
            s = identity_grad(ir, &ident);
            if (s != CT_OK) break;
            int64_t pl = 0;
            for (int a = 0; a < ir->narr; a++)
                if (ir->arr[a].grad) pl += c->a[a].numel;
            *r->score_out = (ct_score_mod){j_score_fwd, ident ? NULL : j_score_grad, c, j_free,
                                           NULL, pl};
        }
        ctx[i] = NULL;
    }
    if (s != CT_OK)
        for (int i = 0; i < n; i++) {
            if (reqs[i].score_out && reqs[i].score_out->ctx) ct_free(reqs[i].score_out->ctx);
            if (reqs[i].mask_out && reqs[i].mask_out->ctx) ct_free(reqs[i].mask_out->ctx);
            if (reqs[i].score_out) memset(reqs[i].score_out, 0, sizeof *reqs[i].score_out);
            if (reqs[i].mask_out) memset(reqs[i].mask_out, 0, sizeof *reqs[i].mask_out);
        }
    for (int i = 0; i < n; i++) {
        ct_free(irs[i]);
        ct_free(ctx[i]);
    }
    ct_free(irs);
    ct_free(ks);
    ct_free(ctx);
    return s;
}

ct_status ct_score_mod_compile(const char *expr, const ct_jit_binding *bindings, int n,
                               const ct_jit_options *opt, ct_score_mod *out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_score_mod_compile: out must not be NULL");
    ct_jit_request r = {expr, bindings, n, out, NULL};
    return ct_mod_compile_many(&r, 1, opt);
}

ct_status ct_mask_mod_compile(const char *expr, const ct_jit_binding *bindings, int n,
                              const ct_jit_options *opt, ct_mask_mod *out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_mask_mod_compile: out must not be NULL");
    ct_jit_request r = {expr, bindings, n, NULL, out};
    return ct_mod_compile_many(&r, 1, opt);
}

ct_status ct_jit_generate_source(const char *expr, bool is_mask, const ct_jit_binding *bindings,
                                 int n, char **out)
{
    if (!out) return ct_error(CT_EINVAL, "ct_jit_generate_source: out must not be NULL");
    *out = NULL;
    jir *ir;
    CT_TRY(ct_alloc((void **)&ir, sizeof *ir));
    ct_status s = jit_parse("ct_jit_generate_source", expr, is_mask, bindings, n, ir);
    if (s == CT_OK) s = jit_codegen(ir, out);
    ct_free(ir);
    return s;
}
