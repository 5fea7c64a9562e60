/* The sharded model of include/ctorch/fsdp.h: parameter groups, shards, gathered block
 * buffers, all-gather / reduce-scatter on the comm layer's async work, AdamW on the shards. */
#include "dist/dist_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

ct_fsdp_options ct_fsdp_options_default(void)
{
    /* group_reshard_after_forward (not named) is NULL */
    return (ct_fsdp_options){.mode = CT_FSDP_FULL_SHARD,
                             .reshard_after_forward = true,
                             .root_reshard_after_forward = false,
                             .forward_prefetch = 1,
                             .backward_prefetch = 1,
                             .param_dtype = CT_DTYPE_F32,
                             .reduce_dtype = CT_DTYPE_F32,
                             .gradient_divide_factor = 0.0,
                             .requires_gradient_sync = true,
                             .separate_reduce_scatter_comm = true,
                             .overlap = true,
                             .timeout_s = 0.0};
}

ct_status ct_fsdp_mode_from_name(const char *name, ct_fsdp_mode *out)
{
    if (name && !strcmp(name, "fsdp")) {
        *out = CT_FSDP_FULL_SHARD;
        return CT_OK;
    }
    if (name && !strcmp(name, "dp")) {
        *out = CT_FSDP_REPLICATE;
        return CT_OK;
    }
    return ct_error(CT_EINVAL, "fsdp mode: '%s' is neither \"fsdp\" nor \"dp\"",
                    name ? name : "(null)");
}

const char *ct_fsdp_mode_name(ct_fsdp_mode mode)
{
    return mode == CT_FSDP_FULL_SHARD ? "fsdp" : mode == CT_FSDP_REPLICATE ? "dp" : "?";
}

double ds_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---- bf16 ------------------------------------------------------------------------------- */

static uint16_t to_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                                          /* nearest even */
    return (uint16_t)(u >> 16);
}

static float from_bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ---- works -------------------------------------------------------------------------------- */

/* Wait for *w (exposed time counted), account its run time, free it. */
static ct_status finish(ct_fsdp *f, ct_work **w)
{
    if (!*w) return CT_OK;
    double t0 = ds_now();
    ct_status s = ct_work_wait(*w, -1);
    f->st.exposed_s += ds_now() - t0;
    if ((*w)->t_started && (*w)->t_completed > (*w)->t_started)
        f->st.collective_s += (double)((*w)->t_completed - (*w)->t_started) * 1e-9;
    if (s) s = ct_error(s, "fsdp: %s", ct_work_error(*w));
    ct_work_free(*w);
    *w = NULL;
    return s;
}

/* A block's compute starts: count it, and whether a collective is issued and not yet waited
 * (the structural sign of overlap, independent of timing). */
static void block_compute(ct_fsdp *f)
{
    f->st.block_computes++;
    bool busy = false;
    for (int g = 0; g < f->ng && !busy; g++)
        busy = f->g[g].ag != NULL;
    for (int i = 0; i < DS_RS_BUFS && !busy; i++)
        busy = f->rsb[i].w != NULL;
    if (busy) f->st.block_computes_overlapped++;
}

static void issued(ct_fsdp *f, double bytes)
{
    f->st.collectives++;
    f->st.bytes_sent += bytes;
}

/* ---- memory of gathered buffers ------------------------------------------------------------- */

static ct_status gather_alloc(ct_fsdp *f, void **p, size_t bytes)
{
    CT_TRY(ct_alloc(p, bytes ? bytes : 64));
    f->st.gathered_bytes += bytes;
    if (f->st.gathered_bytes > f->st.peak_gathered_bytes)
        f->st.peak_gathered_bytes = f->st.gathered_bytes;
    return CT_OK;
}

static void gather_free(ct_fsdp *f, void **p, size_t bytes)
{
    if (!*p) return;
    ct_free(*p);
    *p = NULL;
    f->st.gathered_bytes -= bytes;
}

/* ---- groups and layout ------------------------------------------------------------------- */

/* Group of tensor name: 1 + i for layers.{i}.*, 0 (root) otherwise. */
static int group_of(const char *name, int64_t n_layer)
{
    long long l;
    int used = 0;
    if (sscanf(name, "layers.%lld.%n", &l, &used) == 1 && used > 0 && l >= 0 && l < n_layer)
        return 1 + (int)l;
    return 0;
}

static ct_status build_layout(ct_fsdp *f)
{
    ct_gpt *m = f->m;
    int nt = m->ntensors, N = f->size, r = f->rank;
    bool shard = f->o.mode == CT_FSDP_FULL_SHARD;
    f->ng = 1 + (int)m->cfg.n_layer;
    CT_TRY(ct_calloc((void **)&f->g, (size_t)f->ng * sizeof *f->g));
    CT_TRY(ct_calloc((void **)&f->t, (size_t)nt * sizeof *f->t));
    CT_TRY(ct_calloc((void **)&f->tp, (size_t)nt * sizeof *f->tp));
    CT_TRY(ct_calloc((void **)&f->tg, (size_t)nt * sizeof *f->tg));
    for (int k = 0; k < nt; k++) {
        int g = group_of(m->tensors[k].name, m->cfg.n_layer);
        f->g[g].nt++;
    }
    for (int g = 0; g < f->ng; g++) {
        CT_TRY(ct_calloc((void **)&f->g[g].idx, (size_t)(f->g[g].nt ? f->g[g].nt : 1) * sizeof(int)));
        f->g[g].nt = 0;
        f->g[g].slot = -1;
        f->g[g].id = g;
    }
    for (int k = 0; k < nt; k++) {
        int g = group_of(m->tensors[k].name, m->cfg.n_layer);
        f->g[g].idx[f->g[g].nt++] = k;
    }
    int64_t off = 0;
    for (int g = 0; g < f->ng; g++) {
        ds_group *G = &f->g[g];
        G->shard_off = off;
        int64_t S = 0, U = 0;
        for (int i = 0; i < G->nt; i++) {
            ds_tensor *T = &f->t[G->idx[i]];
            const gpt_tensor *mt = &m->tensors[G->idx[i]];
            T->group = g;
            T->rows = mt->shape[0];
            T->cols = mt->ndim == 2 ? mt->shape[1] : 1;
            T->decay = mt->decay;
            T->chunk = shard ? (T->rows + N - 1) / N : T->rows;
            T->r0 = shard ? (int64_t)r * T->chunk : 0;
            if (T->r0 > T->rows) T->r0 = T->rows;
            T->r1 = T->r0 + T->chunk < T->rows ? T->r0 + T->chunk : T->rows;
            T->soff = S;
            T->uoff = U;
            int64_t cs;
            if (__builtin_mul_overflow(T->chunk, T->cols, &cs) || __builtin_add_overflow(S, cs, &S))
                return ct_error(CT_EOVERFLOW, "ct_fsdp_create: group sizes overflow");
            U += mt->numel;
        }
        G->S = S;
        G->U = U;
        off += S;
        if (S > f->S_max) f->S_max = S;
        if (U > f->U_max && g) f->U_max = U;
        bool rf = g ? f->o.reshard_after_forward : f->o.root_reshard_after_forward;
        if (f->o.group_reshard_after_forward) rf = f->o.group_reshard_after_forward[g];
        G->reshard = rf;
    }
    f->S_total = off;
    return CT_OK;
}

static size_t pdt_size(const ct_fsdp *f)
{
    return f->o.param_dtype == CT_DTYPE_BF16 ? 2 : 4;
}

/* Bytes of one group's gathered buffers: the block (f32) and, sharded, the staging area of
 * the all-gather (N shards), its bf16 send buffer, and in compute dtype bf16 the block's
 * bf16 copy (one per gathered group: never a whole bf16 model). */
static size_t slot_bytes(const ct_fsdp *f, size_t *param, size_t *stage, size_t *send,
                         size_t *pbf)
{
    size_t U = (size_t)(f->U_max > f->g[0].U ? f->U_max : f->g[0].U);
    *param = U * sizeof(float);
    *stage = (size_t)f->size * (size_t)f->S_max * pdt_size(f);
    *send = f->o.param_dtype == CT_DTYPE_BF16 ? (size_t)f->S_max * 2 : 0;
    *pbf = gpt_bf16(f->m) ? U * sizeof(uint16_t) : 0;
    return *param + *stage + *send + *pbf;
}

/* The bf16 copy of the matrix a bound view w points into (gpt_create_sharded): in a gathered
 * group's slot (FSDP) or in the replica (data parallel). */
static const uint16_t *wbf_of(const void *ctx, const float *w)
{
    const ct_fsdp *f = ctx;
    if (f->o.mode == CT_FSDP_REPLICATE) return f->pbf + (w - f->p);
    for (int i = 0; i < f->nslots; i++) {
        const ds_slot *sl = &f->slots[i];
        if (sl->group >= 0 && w >= sl->param && w < sl->param + f->g[sl->group].U)
            return sl->pbf + (w - sl->param);
    }
    return NULL; /* not reached: the model reads the weights of gathered groups only */
}

/* ---- create / free ------------------------------------------------------------------------ */

ct_status ct_fsdp_create(ct_comm *comm, const ct_gpt_config *cfg, const ct_gpt_options *mopt,
                         const ct_fsdp_options *opt, ct_fsdp **out)
{
    const char *fn = "ct_fsdp_create";
    if (!out || !comm || !cfg) return ct_error(CT_EINVAL, "%s: comm, cfg and out must not be NULL", fn);
    *out = NULL;
    ct_fsdp_options o = opt ? *opt : ct_fsdp_options_default();
    if (o.mode != CT_FSDP_FULL_SHARD && o.mode != CT_FSDP_REPLICATE)
        return ct_error(CT_EINVAL, "%s: mode %d is not a ct_fsdp_mode", fn, (int)o.mode);
    if (o.forward_prefetch < 0 || o.forward_prefetch > 8 || o.backward_prefetch < 0 ||
        o.backward_prefetch > 8)
        return ct_error(CT_EINVAL, "%s: forward_prefetch and backward_prefetch must be in [0, 8]",
                        fn);
    if (o.param_dtype != CT_DTYPE_F32 && o.param_dtype != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "%s: param_dtype must be f32 or bf16", fn);
    if (o.reduce_dtype != CT_DTYPE_F32)
        return ct_error(CT_EINVAL, "%s: reduce_dtype must be f32", fn);
    if (!(o.gradient_divide_factor >= 0) || !isfinite(o.gradient_divide_factor))
        return ct_error(CT_EINVAL, "%s: gradient_divide_factor must be finite and >= 0 (0: world size)",
                        fn);
    if (o.mode == CT_FSDP_REPLICATE && o.param_dtype != CT_DTYPE_F32)
        return ct_error(CT_EINVAL, "%s: data parallel keeps f32 replicas (param_dtype f32)", fn);
    o.group_reshard_after_forward = opt ? opt->group_reshard_after_forward : NULL;
    ct_fsdp *f;
    CT_TRY(ct_calloc((void **)&f, sizeof *f));
    f->o = o;
    f->world = comm;
    f->rank = ct_comm_rank(comm);
    f->size = ct_comm_size(comm);
    f->sync = o.requires_gradient_sync;
    for (int i = 0; i < DS_RS_BUFS; i++)
        f->rsb[i].group = -1;
    f->div = o.gradient_divide_factor > 0 ? o.gradient_divide_factor : (double)f->size;
    ct_status s = gpt_create_sharded(cfg, mopt, wbf_of, f, &f->m);
    if (!s) s = build_layout(f);
    if (!s) f->o.group_reshard_after_forward = NULL; /* read at creation only */
    size_t S = (size_t)f->S_total;
    if (!s) s = ct_calloc((void **)&f->p, (S ? S : 1) * sizeof(float));
    if (!s) s = ct_calloc((void **)&f->gr, (S ? S : 1) * sizeof(float));
    if (!s) s = ct_calloc((void **)&f->m1, (S ? S : 1) * sizeof(float));
    if (!s) s = ct_calloc((void **)&f->m2, (S ? S : 1) * sizeof(float));
    if (!s) f->st.state_bytes = 4 * S * sizeof(float);
    /* data parallel in bf16: the replica's bf16 copy (the f32 replica is whole anyway) */
    if (!s && f->o.mode == CT_FSDP_REPLICATE && gpt_bf16(f->m))
        s = ct_calloc((void **)&f->pbf, (S ? S : 1) * sizeof(uint16_t));
    if (!s && f->o.mode == CT_FSDP_FULL_SHARD)
        s = ct_calloc((void **)&f->slots, (size_t)f->ng * sizeof *f->slots);
    /* the communicators: all-gathers on a duplicate of comm, reduce-scatters (bucket
     * all_reduces) on one of their own or the same */
    int *all = NULL;
    if (!s) s = ct_alloc((void **)&all, (size_t)f->size * sizeof(int));
    for (int i = 0; !s && i < f->size; i++)
        all[i] = i;
    if (!s) s = ct_comm_split(comm, all, f->size, NULL, &f->ag);
    if (!s && o.separate_reduce_scatter_comm) s = ct_comm_split(comm, all, f->size, NULL, &f->rs);
    if (!s && !o.separate_reduce_scatter_comm) f->rs = f->ag;
    ct_free(all);
    if (!s && f->o.mode == CT_FSDP_REPLICATE) {
        /* the replica is the group layout: bind once */
        for (int k = 0; k < f->m->ntensors; k++) {
            ds_tensor *T = &f->t[k];
            f->tp[k] = f->p + f->g[T->group].shard_off + T->soff;
            f->tg[k] = f->gr + f->g[T->group].shard_off + T->soff;
        }
        gpt_bind(f->m, &f->m->w, f->tp);
        gpt_bind(f->m, &f->m->g, f->tg);
    }
    if (!s) {
        size_t a, b, c, d;
        f->st.block_bytes = f->o.mode == CT_FSDP_FULL_SHARD ? slot_bytes(f, &a, &b, &c, &d) : 0;
    }
    if (s) {
        ct_fsdp_free(f);
        return s;
    }
    *out = f;
    return CT_OK;
}


void ct_fsdp_free(ct_fsdp *f)
{
    if (!f) return;
    for (int g = 0; f->g && g < f->ng; g++)
        if (f->g[g].ag) {
            ct_work_wait(f->g[g].ag, -1);
            ct_work_free(f->g[g].ag);
            f->g[g].ag = NULL;
        }
    for (int i = 0; i < DS_RS_BUFS; i++)
        if (f->rsb[i].w) {
            ct_work_wait(f->rsb[i].w, -1);
            ct_work_free(f->rsb[i].w);
        }
    if (f->slots) ds_drop_gathered(f);
    for (int i = 0; f->slots && i < f->nslots; i++) {
        ds_slot *sl = &f->slots[i];
        size_t a, b, c, d;
        slot_bytes(f, &a, &b, &c, &d);
        gather_free(f, (void **)&sl->param, a);
        gather_free(f, &sl->stage, b);
        gather_free(f, &sl->send, c);
        gather_free(f, (void **)&sl->pbf, d);
    }
    for (int i = 0; i < DS_RS_BUFS; i++) {
        ct_free(f->rsb[i].send);
        ct_free(f->rsb[i].recv);
    }
    for (int g = 0; f->g && g < f->ng; g++) {
        ct_free(f->g[g].idx);
        ct_free(f->g[g].ugrad);
    }
    ct_free(f->bgrad);
    if (f->rs && f->rs != f->ag) ct_comm_free(f->rs);
    ct_comm_free(f->ag);
    ct_free(f->slots);
    ct_free(f->g);
    ct_free(f->t);
    ct_free(f->tp);
    ct_free(f->tg);
    ct_free(f->p);
    ct_free(f->gr);
    ct_free(f->m1);
    ct_free(f->m2);
    ct_free(f->pbf);
    ct_gpt_free(f->m);
    ct_free(f);
}

int ct_fsdp_rank(const ct_fsdp *f)
{
    return f->rank;
}

int ct_fsdp_world_size(const ct_fsdp *f)
{
    return f->size;
}

int ct_fsdp_num_groups(const ct_fsdp *f)
{
    return f->ng;
}

const ct_fsdp_options *ct_fsdp_get_options(const ct_fsdp *f)
{
    return &f->o;
}

int ct_fsdp_num_tensors(const ct_fsdp *f)
{
    return f->m->ntensors;
}

ct_status ct_fsdp_tensor(ct_fsdp *f, int i, const char **name, int *ndim, int64_t shape[2],
                         int64_t *row0, int64_t *row1, float **param, float **exp_avg,
                         float **exp_avg_sq)
{
    if (!f || i < 0 || i >= f->m->ntensors)
        return ct_error(CT_EINVAL, "ct_fsdp_tensor: index %d is outside [0, %d)", i,
                        f ? f->m->ntensors : 0);
    const gpt_tensor *mt = &f->m->tensors[i];
    const ds_tensor *T = &f->t[i];
    int64_t o = f->g[T->group].shard_off + T->soff;
    if (name) *name = mt->name;
    if (ndim) *ndim = mt->ndim;
    if (shape) shape[0] = mt->shape[0], shape[1] = mt->ndim == 2 ? mt->shape[1] : 0;
    if (row0) *row0 = T->r0;
    if (row1) *row1 = T->r1;
    if (param) *param = f->p + o;
    if (exp_avg) *exp_avg = f->m1 + o;
    if (exp_avg_sq) *exp_avg_sq = f->m2 + o;
    return CT_OK;
}

ct_status ct_fsdp_init(ct_fsdp *f, uint64_t seed)
{
    if (!f) return ct_error(CT_EINVAL, "ct_fsdp_init: f must not be NULL");
    ct_rng r;
    ct_rng_seed(&r, seed);
    memset(f->p, 0, (size_t)f->S_total * sizeof(float));
    for (int k = 0; k < f->m->ntensors; k++) {
        const ds_tensor *T = &f->t[k];
        gpt_init_tensor(f->m, k, &r, T->r0, T->r1, f->p + f->g[T->group].shard_off + T->soff);
    }
    ds_drop_gathered(f);
    ct_fsdp_zero_grad(f);
    return CT_OK;
}

void ct_fsdp_zero_grad(ct_fsdp *f)
{
    memset(f->gr, 0, (size_t)f->S_total * sizeof(float));
    f->dp_synced = false;
    for (int g = 0; g < f->ng; g++)
        f->g[g].pending = false;
}

void ct_fsdp_set_requires_gradient_sync(ct_fsdp *f, bool sync)
{
    f->sync = sync;
}

void ct_fsdp_get_stats(const ct_fsdp *f, ct_fsdp_stats *out)
{
    *out = f->st;
}

void ct_fsdp_reset_stats(ct_fsdp *f)
{
    f->st.exposed_s = f->st.collective_s = f->st.bytes_sent = 0;
    f->st.collectives = f->st.block_computes = f->st.block_computes_overlapped = 0;
    f->st.peak_gathered_bytes = f->st.gathered_bytes;
}

/* ---- gathering ------------------------------------------------------------------------------- */

static void bind_group_params(ct_fsdp *f, ds_group *G, float *base)
{
    for (int i = 0; i < G->nt; i++) {
        int k = G->idx[i];
        f->tp[k] = base ? base + f->t[k].uoff : NULL;
    }
    gpt_bind(f->m, &f->m->w, f->tp);
}

/* A free slot (one group's gathered buffers), allocated when none is free. */
static ct_status get_slot(ct_fsdp *f, int *out)
{
    for (int i = 0; i < f->nslots; i++)
        if (f->slots[i].group < 0) {
            *out = i;
            return CT_OK;
        }
    if (f->nslots >= f->ng) return ct_error(CT_EINVAL, "fsdp: more gathered groups than groups");
    ds_slot *sl = &f->slots[f->nslots];
    size_t a, b, c, d;
    slot_bytes(f, &a, &b, &c, &d);
    ct_status s = gather_alloc(f, (void **)&sl->param, a);
    if (!s) s = gather_alloc(f, &sl->stage, b);
    if (!s && c) s = gather_alloc(f, &sl->send, c);
    if (!s && d) s = gather_alloc(f, (void **)&sl->pbf, d);
    if (s) {
        gather_free(f, (void **)&sl->param, a);
        gather_free(f, &sl->stage, b);
        gather_free(f, &sl->send, c);
        gather_free(f, (void **)&sl->pbf, d);
        return s;
    }
    sl->group = -1;
    *out = f->nslots++;
    return CT_OK;
}

/* Issue group g's all-gather (no-op when gathered or in flight). */
static ct_status issue_gather(ct_fsdp *f, int g)
{
    if (f->o.mode != CT_FSDP_FULL_SHARD || g < 0 || g >= f->ng) return CT_OK;
    ds_group *G = &f->g[g];
    if (G->slot >= 0) return CT_OK;
    int si = -1;
    CT_TRY(get_slot(f, &si));
    ds_slot *sl = &f->slots[si];
    sl->group = g;
    G->slot = si;
    G->ready = false;
    const float *shard = f->p + G->shard_off;
    const void *send = shard;
    if (f->o.param_dtype == CT_DTYPE_BF16) {
        uint16_t *h = sl->send;
        for (int64_t i = 0; i < G->S; i++)
            h[i] = to_bf16(shard[i]);
        send = h;
    }
    ct_status s = ct_comm_all_gather_single(f->ag, send, sl->stage, (size_t)G->S, f->o.param_dtype,
                                            f->o.timeout_s, &G->ag);
    if (s) return s;
    issued(f, (double)G->S * (double)pdt_size(f));
    if (!f->o.overlap) return finish(f, &G->ag);
    return CT_OK;
}

/* Make group g's parameters usable: wait for its gather, copy the shards out. */
static ct_status use_group(ct_fsdp *f, int g)
{
    if (f->o.mode != CT_FSDP_FULL_SHARD) return CT_OK;
    ds_group *G = &f->g[g];
    CT_TRY(issue_gather(f, g));
    if (G->ready) {
        bind_group_params(f, G, f->slots[G->slot].param);
        return CT_OK;
    }
    CT_TRY(finish(f, &G->ag));
    ds_slot *sl = &f->slots[G->slot];
    bool bf = f->o.param_dtype == CT_DTYPE_BF16;
    for (int j = 0; j < f->size; j++)
        for (int i = 0; i < G->nt; i++) {
            const ds_tensor *T = &f->t[G->idx[i]];
            int64_t r0 = (int64_t)j * T->chunk, r1 = r0 + T->chunk < T->rows ? r0 + T->chunk : T->rows;
            if (r1 <= r0) continue;
            size_t n = (size_t)((r1 - r0) * T->cols);
            size_t src = (size_t)j * (size_t)G->S + (size_t)T->soff;
            float *dst = sl->param + T->uoff + r0 * T->cols;
            if (bf) {
                const uint16_t *h = (const uint16_t *)sl->stage + src;
                for (size_t e = 0; e < n; e++)
                    dst[e] = from_bf16(h[e]);
            } else {
                memcpy(dst, (const float *)sl->stage + src, n * sizeof(float));
            }
        }
    /* compute dtype bf16: the GEMMs' copy of the gathered weights, rounded as the one-process
     * model rounds its own (after a bf16 all-gather the values are bf16 already: the identity) */
    if (gpt_bf16(f->m)) CT_TRY(gpt_to_bf16(f->m, sl->pbf, sl->param, G->U));
    G->ready = true;
    bind_group_params(f, G, sl->param);
    return CT_OK;
}

/* Free group g's gathered parameters (the slot goes back to the pool). */
static void release_group(ct_fsdp *f, int g)
{
    if (f->o.mode != CT_FSDP_FULL_SHARD) return;
    ds_group *G = &f->g[g];
    if (G->slot < 0) return;
    if (G->ag) { /* never used: let it end */
        ct_work_wait(G->ag, -1);
        ct_work_free(G->ag);
        G->ag = NULL;
    }
    f->slots[G->slot].group = -1;
    G->slot = -1;
    G->ready = false;
    bind_group_params(f, G, NULL);
}

void ds_drop_gathered(ct_fsdp *f)
{
    for (int g = 0; g < f->ng; g++)
        release_group(f, g);
}

/* ---- gradient reduction ---------------------------------------------------------------------- */

/* Fold a finished reduce-scatter's result into the shard gradients. */
static ct_status rs_complete(ct_fsdp *f, ds_rs *b)
{
    if (b->group < 0) return CT_OK;
    ct_status s = finish(f, &b->w);
    ds_group *G = &f->g[b->group];
    b->group = -1;
    CT_TRY(s);
    float inv = (float)(1.0 / f->div);
    float *g = f->gr + G->shard_off;
    if (f->o.mode == CT_FSDP_FULL_SHARD) {
        for (int64_t i = 0; i < G->S; i++)
            g[i] += b->recv[i] * inv;
    } else {
        for (int64_t i = 0; i < G->S; i++)
            g[i] *= inv;
    }
    return CT_OK;
}

static ct_status rs_drain(ct_fsdp *f)
{
    ct_status first = CT_OK;
    for (int i = 0; i < DS_RS_BUFS; i++) {
        ct_status s = rs_complete(f, &f->rsb[(f->rs_next + i) % DS_RS_BUFS]);
        if (s && !first) first = s;
    }
    return first;
}

/* Reduce group g's unsharded gradients ugrad[U] (FSDP: pack by rank, reduce-scatter; DP:
 * all_reduce of the group's bucket in place). */
static ct_status reduce_group(ct_fsdp *f, int g, const float *ugrad)
{
    ds_group *G = &f->g[g];
    ds_rs *b = &f->rsb[f->rs_next];
    f->rs_next = (f->rs_next + 1) % DS_RS_BUFS;
    CT_TRY(rs_complete(f, b)); /* the buffer's previous reduction */
    size_t N = (size_t)f->size;
    if (f->o.mode == CT_FSDP_REPLICATE) {
        float *bucket = f->gr + G->shard_off;
        CT_TRY(ct_comm_all_reduce(f->rs, bucket, bucket, (size_t)G->S, CT_DTYPE_F32, CT_REDUCE_SUM,
                                  f->o.timeout_s, &b->w));
        issued(f, (double)G->S * 4);
    } else {
        if (!b->send) {
            CT_TRY(ct_alloc((void **)&b->send, N * (size_t)f->S_max * sizeof(float) + 64));
            CT_TRY(ct_alloc((void **)&b->recv, (size_t)f->S_max * sizeof(float) + 64));
        }
        for (size_t j = 0; j < N; j++)
            for (int i = 0; i < G->nt; i++) {
                const ds_tensor *T = &f->t[G->idx[i]];
                int64_t r0 = (int64_t)j * T->chunk, r1 = r0 + T->chunk < T->rows ? r0 + T->chunk : T->rows;
                if (r1 < r0) r1 = r0;
                float *dst = b->send + j * (size_t)G->S + (size_t)T->soff;
                size_t n = (size_t)((r1 - r0) * T->cols), cap = (size_t)(T->chunk * T->cols);
                if (n) memcpy(dst, ugrad + T->uoff + r0 * T->cols, n * sizeof(float));
                if (cap > n) memset(dst + n, 0, (cap - n) * sizeof(float));
            }
        CT_TRY(ct_comm_reduce_scatter_single(f->rs, b->send, b->recv, (size_t)G->S, CT_DTYPE_F32,
                                             CT_REDUCE_SUM, f->o.timeout_s, &b->w));
        issued(f, (double)G->S * 4 * (double)N);
    }
    b->group = g;
    if (!f->o.overlap) return rs_complete(f, b);
    return CT_OK;
}

/* The unsharded gradient buffer group g accumulates into for this backward; zeroed unless
 * it holds unsynced gradients. */
static ct_status grad_target(ct_fsdp *f, int g, float **out)
{
    ds_group *G = &f->g[g];
    size_t bytes = (size_t)G->U * sizeof(float);
    if (f->o.mode == CT_FSDP_REPLICATE) {
        *out = f->gr + G->shard_off;
        return CT_OK;
    }
    bool persist = g == 0 || !f->sync || G->pending;
    if (persist) {
        if (!G->ugrad) CT_TRY(ct_alloc((void **)&G->ugrad, bytes ? bytes : 64));
        if (!G->pending) memset(G->ugrad, 0, bytes);
        *out = G->ugrad;
    } else {
        if (!f->bgrad) CT_TRY(ct_alloc((void **)&f->bgrad, (size_t)f->U_max * sizeof(float) + 64));
        memset(f->bgrad, 0, bytes);
        *out = f->bgrad;
    }
    return CT_OK;
}

static void bind_group_grads(ct_fsdp *f, ds_group *G, float *base)
{
    for (int i = 0; i < G->nt; i++) {
        int k = G->idx[i];
        f->tg[k] = base + f->t[k].uoff;
    }
    gpt_bind(f->m, &f->m->g, f->tg);
}

/* After group g's backward: reduce now (sync) or keep accumulating. */
static ct_status group_grads_done(ct_fsdp *f, int g, float *ugrad)
{
    ds_group *G = &f->g[g];
    if (!f->sync) {
        G->pending = true;
        return CT_OK;
    }
    G->pending = false;
    return reduce_group(f, g, ugrad);
}

/* ---- forward / backward ------------------------------------------------------------------ */

static ct_status forward_blocks(ct_fsdp *f, int64_t B, int64_t T, bool training)
{
    int L = (int)f->m->cfg.n_layer, pf = f->o.overlap ? f->o.forward_prefetch : 0;
    if (f->pbf) CT_TRY(gpt_to_bf16(f->m, f->pbf, f->p, f->S_total));
    CT_TRY(issue_gather(f, 0));
    for (int i = 0; i < pf && i < L; i++)
        CT_TRY(issue_gather(f, 1 + i));
    CT_TRY(use_group(f, 0));
    if (B) CT_TRY(gpt_embed_forward(f->m, B, T));
    for (int l = 0; l < L; l++) {
        for (int i = 1; i <= pf && l + i < L; i++)
            CT_TRY(issue_gather(f, 1 + l + i));
        CT_TRY(use_group(f, 1 + l));
        block_compute(f);
        if (B) CT_TRY(gpt_block_forward(f->m, l, B, T));
        if (f->g[1 + l].reshard || !training) release_group(f, 1 + l);
    }
    if (B) CT_TRY(gpt_final_norm_forward(f->m, B, T));
    return CT_OK;
}

static ct_status check_rows(ct_fsdp *f, const int32_t *tokens, int64_t B, int64_t T, const char *fn)
{
    if (!f) return ct_error(CT_EINVAL, "%s: f must not be NULL", fn);
    if (B < 0 || B > f->m->opt.batch)
        return ct_error(CT_EINVAL, "%s: B must be in [0, batch = %lld], got %lld", fn,
                        (long long)f->m->opt.batch, (long long)B);
    if (B) CT_TRY(gpt_load_batch(f->m, tokens, B, T, fn));
    return CT_OK;
}

ct_status ct_fsdp_forward(ct_fsdp *f, const int32_t *tokens, int64_t B, int64_t T, float *loss)
{
    const char *fn = "ct_fsdp_forward";
    CT_TRY(check_rows(f, tokens, B, T, fn));
    if (!loss) return ct_error(CT_EINVAL, "%s: loss must not be NULL", fn);
    ct_status s = forward_blocks(f, B, T, false);
    *loss = 0;
    if (!s && B) s = gpt_head_loss(f->m, B, T, loss);
    if (f->g[0].reshard) release_group(f, 0);
    return s;
}

ct_status ct_fsdp_forward_backward(ct_fsdp *f, const int32_t *tokens, int64_t B, int64_t T,
                                   float grad_scale, float *loss)
{
    const char *fn = "ct_fsdp_forward_backward";
    CT_TRY(check_rows(f, tokens, B, T, fn));
    if (f->o.mode == CT_FSDP_REPLICATE && f->sync && f->dp_synced)
        return ct_error(CT_EINVAL,
                        "%s: data parallel reduces the gradient buckets in place: zero the "
                        "gradients between synced backwards (accumulate with "
                        "requires_gradient_sync false)",
                        fn);
    if (f->sync) f->dp_synced = true;
    int L = (int)f->m->cfg.n_layer, pf = f->o.overlap ? f->o.backward_prefetch : 0;
    CT_TRY(forward_blocks(f, B, T, true));
    if (f->g[0].reshard) release_group(f, 0);
    /* backward: the root (head, final norm) first, while the last blocks gather */
    CT_TRY(issue_gather(f, 0));
    for (int i = 0; i < pf && i < L; i++)
        CT_TRY(issue_gather(f, L - i));
    float lossv = 0, *rg;
    CT_TRY(use_group(f, 0));
    CT_TRY(grad_target(f, 0, &rg));
    bind_group_grads(f, &f->g[0], rg);
    if (B) CT_TRY(gpt_head_backward(f->m, B, T, grad_scale, &lossv));
    if (loss) *loss = lossv;
    for (int l = L - 1; l >= 0; l--) {
        for (int i = 1; i <= pf && l - i >= 0; i++)
            CT_TRY(issue_gather(f, 1 + l - i));
        float *ug;
        CT_TRY(use_group(f, 1 + l));
        CT_TRY(grad_target(f, 1 + l, &ug));
        bind_group_grads(f, &f->g[1 + l], ug);
        block_compute(f);
        if (B) CT_TRY(gpt_block_backward(f->m, l, B, T));
        release_group(f, 1 + l);
        CT_TRY(group_grads_done(f, 1 + l, ug));
    }
    if (B) CT_TRY(gpt_embed_backward(f->m, B, T));
    if (f->g[0].reshard) release_group(f, 0);
    CT_TRY(group_grads_done(f, 0, rg));
    return rs_drain(f);
}

/* ---- norm, optimizer ------------------------------------------------------------------------ */

ct_status ct_fsdp_all_reduce_f64(ct_fsdp *f, double *v, int n)
{
    if (!f || !v || n < 1) return ct_error(CT_EINVAL, "ct_fsdp_all_reduce_f64: bad arguments");
    ct_work *w = NULL;
    CT_TRY(ct_comm_all_reduce(f->world, v, v, (size_t)n, CT_DTYPE_F64, CT_REDUCE_SUM,
                              f->o.timeout_s, &w));
    issued(f, (double)n * 8);
    return finish(f, &w);
}

ct_status ct_fsdp_clip_grad_norm(ct_fsdp *f, float max_norm, double *norm)
{
    if (!f) return ct_error(CT_EINVAL, "ct_fsdp_clip_grad_norm: f must not be NULL");
    /* partial sum of squares over the rows this rank holds (padding is zero), in double and
     * in a fixed order; the replicas of data parallel are all the same, so no reduction */
    double acc[4] = {0, 0, 0, 0};
    const float *g = f->gr;
    int64_t n = f->S_total, i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++)
            acc[k] += (double)g[i + k] * g[i + k];
    for (; i < n; i++)
        acc[0] += (double)g[i] * g[i];
    double sq = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    if (f->o.mode == CT_FSDP_FULL_SHARD && f->size > 1) CT_TRY(ct_fsdp_all_reduce_f64(f, &sq, 1));
    double N = sqrt(sq);
    if (norm) *norm = N;
    if (max_norm > 0 && N > max_norm) {
        float c = (float)(max_norm / (N + 1e-6)); /* element-wise: the serial loop's bits */
        CT_DEV(f->m->dev, scale, f->gr, c, n);
    }
    return CT_OK;
}

ct_status ct_fsdp_adamw_step(ct_fsdp *f, int64_t step, const ct_adamw_options *opt)
{
    if (!f || !opt) return ct_error(CT_EINVAL, "ct_fsdp_adamw_step: arguments must not be NULL");
    ct_adamw_options nd = *opt;
    nd.weight_decay = 0;
    for (int k = 0; k < f->m->ntensors; k++) {
        const ds_tensor *T = &f->t[k];
        int64_t o = f->g[T->group].shard_off + T->soff, n = (T->r1 - T->r0) * T->cols;
        if (n <= 0) continue;
        const ct_adamw_options *a = T->decay ? opt : &nd;
        CT_DEV(f->m->dev, adamw, f->p + o, f->gr + o, f->m1 + o, f->m2 + o, n, step, a->lr,
               a->beta1, a->beta2, a->eps, a->weight_decay);
    }
    ds_drop_gathered(f);
    return CT_OK;
}
