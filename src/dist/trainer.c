/* The distributed trainer of include/ctorch/fsdp.h: ct_trainer's data order, schedule,
 * clipping and AdamW over a ct_fsdp model, each rank taking its rows of the global batch. */
#include "dist/trainer_internal.h"

#include <math.h>
#include <string.h>

static ct_status make_model(ct_fsdp_trainer *t)
{
    int N = ct_comm_size(t->comm);
    ct_gpt_options mo = ct_train_model_options(&t->o);
    mo.batch = (t->o.batch + N - 1) / N; /* this rank's rows of the global batch */
    /* each rank's rows carry the one-process model's loss gradient (grad_rows in the step),
     * so the reduction only sums */
    ct_fsdp_options fo = t->fo;
    fo.gradient_divide_factor = 1.0;
    return ct_fsdp_create(t->comm, &t->cfg, &mo, &fo, &t->f);
}

ct_status ct_fsdp_trainer_create(ct_comm *comm, const ct_gpt_config *cfg,
                                 const ct_train_options *opt, const ct_fsdp_options *fopt,
                                 const int32_t *train, int64_t n_train, const int32_t *eval,
                                 int64_t n_eval, ct_fsdp_trainer **out)
{
    const char *fn = "ct_fsdp_trainer_create";
    if (!out || !comm) return ct_error(CT_EINVAL, "%s: comm and out must not be NULL", fn);
    *out = NULL;
    /* the same checks as ct_trainer_create (a throwaway one-process trainer would allocate a
     * full model; check the options the way it does instead) */
    CT_TRY(ct_gpt_config_check(cfg));
    ct_train_options o = opt ? *opt : ct_train_options_default();
    CT_TRY(gpt_check_train_options(cfg, &o, fn));
    int N = ct_comm_size(comm);
    if (o.batch % N)
        return ct_error(CT_EINVAL,
                        "%s: the global batch %lld does not split evenly over %d ranks (each "
                        "takes batch / N rows)",
                        fn, (long long)o.batch, N);
    if (!train || n_train < o.seq + 1)
        return ct_error(CT_EINVAL,
                        "%s: the training data needs at least seq + 1 = %lld tokens, got %lld", fn,
                        (long long)(o.seq + 1), (long long)(train ? n_train : 0));
    if (n_eval && (!eval || n_eval < o.seq + 1))
        return ct_error(CT_EINVAL,
                        "%s: the held-out data needs at least seq + 1 = %lld tokens, got %lld", fn,
                        (long long)(o.seq + 1), (long long)n_eval);
    CT_TRY(gpt_check_tokens(train, n_train, cfg->vocab_size, "training", fn));
    CT_TRY(gpt_check_tokens(eval, n_eval, cfg->vocab_size, "held-out", fn));
    ct_fsdp_trainer *t;
    CT_TRY(ct_calloc((void **)&t, sizeof *t));
    t->cfg = *cfg;
    t->o = o;
    t->fo = fopt ? *fopt : ct_fsdp_options_default();
    t->comm = comm;
    t->train = train, t->n_train = n_train, t->eval = eval, t->n_eval = n_eval;
    ct_status s = make_model(t);
    if (!s) s = ct_fsdp_init(t->f, o.seed);
    if (!s) s = ct_alloc((void **)&t->batch, (size_t)(o.batch * (o.seq + 1)) * sizeof(int32_t));
    if (s) {
        ct_fsdp_trainer_free(t);
        return s;
    }
    ct_rng_seed(&t->rng, o.seed ^ 0x5DEECE66Dull);
    *out = t;
    return CT_OK;
}

void ct_fsdp_trainer_free(ct_fsdp_trainer *t)
{
    if (!t) return;
    ct_fsdp_free(t->f);
    ct_free(t->batch);
    ct_free(t);
}

ct_fsdp *ct_fsdp_trainer_model(ct_fsdp_trainer *t)
{
    return t->f;
}

int64_t ct_fsdp_trainer_step_count(const ct_fsdp_trainer *t)
{
    return t->step;
}

/* Rows [r0, r1) of a batch of B this rank takes. */
static void my_rows(const ct_fsdp_trainer *t, int64_t B, int64_t *r0, int64_t *r1)
{
    int64_t N = ct_fsdp_world_size(t->f), r = ct_fsdp_rank(t->f);
    *r0 = r * B / N;
    *r1 = (r + 1) * B / N;
}

ct_status ct_fsdp_trainer_step(ct_fsdp_trainer *t, ct_train_step_info *info)
{
    if (!t) return ct_error(CT_EINVAL, "ct_fsdp_trainer_step: t must not be NULL");
    ct_fsdp *f = t->f;
    int64_t B = t->o.batch, T = t->o.seq, r0, r1;
    my_rows(t, B, &r0, &r1);
    /* the data state before the step: an elastic restart of a replicated run redoes it */
    t->saved_pos = t->pos, t->saved_epoch = t->epoch, t->saved_rng = t->rng;
    t->in_step = true;
    ct_fsdp_zero_grad(f);
    double loss = 0;
    bool dp = ct_fsdp_get_options(f)->mode == CT_FSDP_REPLICATE;
    /* every row's loss gradient is the one-process trainer's, (1 / accum) / (B T), whatever
     * share of the rows this rank holds: the reduction sums (divide factor 1, make_model), and
     * a bf16 run rounds the same output gradients to bf16 as the one-process run does (a
     * per-rank mean scaled by N after the fact would round them differently unless N is a
     * power of two) */
    f->m->grad_rows = (double)B * (double)T;
    float scale = 1.0f / (float)t->o.accum;
    ct_status s = CT_OK;
    for (int64_t k = 0; k < t->o.accum && !s; k++) {
        gpt_next_batch(t->train, t->n_train, B, T, &t->pos, &t->epoch, &t->rng, t->batch);
        int64_t nb = r1 - r0;
        float l = 0;
        /* data parallel reduces once per step; FSDP reduces every micro-batch into the shards */
        ct_fsdp_set_requires_gradient_sync(f, !dp || k == t->o.accum - 1);
        s = ct_fsdp_forward_backward(f, t->batch + r0 * (T + 1), nb, T, scale, &l);
        loss += (double)l * (double)nb / (double)B;
    }
    f->m->grad_rows = 0;
    CT_TRY(s);
    ct_fsdp_set_requires_gradient_sync(f, true);
    CT_TRY(ct_fsdp_all_reduce_f64(f, &loss, 1));
    double norm;
    CT_TRY(ct_fsdp_clip_grad_norm(f, t->o.clip, &norm));
    float lr = ct_lr_cosine(t->step, t->o.warmup, t->o.steps, t->o.lr, t->o.min_lr);
    ct_adamw_options a = {lr, t->o.beta1, t->o.beta2, t->o.eps, t->o.weight_decay};
    CT_TRY(ct_fsdp_adamw_step(f, t->step + 1, &a));
    t->step++;
    t->in_step = false;
    if (info) {
        info->step = t->step;
        info->loss = (float)(loss / (double)t->o.accum);
        info->lr = lr;
        info->grad_norm = norm;
        info->tokens = t->o.accum * B * T;
        info->epoch = t->epoch;
    }
    return CT_OK;
}

ct_status ct_fsdp_trainer_evaluate(ct_fsdp_trainer *t, float *loss)
{
    if (!t || !loss)
        return ct_error(CT_EINVAL, "ct_fsdp_trainer_evaluate: arguments must not be NULL");
    int64_t B = t->o.batch, T = t->o.seq, windows = (t->n_eval - 1) / T;
    if (windows < 1)
        return ct_error(CT_EINVAL, "ct_fsdp_trainer_evaluate: the trainer has no held-out tokens");
    double sum = 0;
    int64_t batches = 0;
    for (int64_t k = 0; k < t->o.eval_batches; k++) {
        int64_t w0 = k * B, nb = windows - w0 < B ? windows - w0 : B;
        if (nb <= 0) break;
        int64_t r0, r1;
        my_rows(t, nb, &r0, &r1);
        for (int64_t b = r0; b < r1; b++)
            memcpy(t->batch + (b - r0) * (T + 1), t->eval + (w0 + b) * T,
                   (size_t)(T + 1) * sizeof(int32_t));
        float l = 0;
        CT_TRY(ct_fsdp_forward(t->f, t->batch, r1 - r0, T, &l));
        sum += (double)l * (double)(r1 - r0);
        batches += nb;
    }
    if (!batches) return ct_error(CT_EINVAL, "ct_fsdp_trainer_evaluate: eval_batches is 0");
    CT_TRY(ct_fsdp_all_reduce_f64(t->f, &sum, 1));
    *loss = (float)(sum / (double)batches);
    return CT_OK;
}

ct_status ct_fsdp_trainer_rebuild(ct_fsdp_trainer *t, ct_comm *comm)
{
    if (!t || !comm) return ct_error(CT_EINVAL, "ct_fsdp_trainer_rebuild: arguments must not be NULL");
    ct_fsdp *old = t->f;
    /* the old model's communicators were split from the failed one: end their work now */
    ct_comm_abort(old->ag);
    if (old->rs != old->ag) ct_comm_abort(old->rs);
    bool dp = ct_fsdp_get_options(old)->mode == CT_FSDP_REPLICATE;
    t->comm = comm;
    t->f = NULL;
    ct_status s = make_model(t);
    if (!s && dp) { /* replicas: every survivor holds the whole state of the last step */
        size_t n = (size_t)old->S_total * sizeof(float);
        memcpy(t->f->p, old->p, n);
        memcpy(t->f->m1, old->m1, n);
        memcpy(t->f->m2, old->m2, n);
        if (t->in_step) /* the interrupted step (its update had not run) is redone */
            t->pos = t->saved_pos, t->epoch = t->saved_epoch, t->rng = t->saved_rng;
        t->in_step = false;
    }
    ct_fsdp_free(old);
    if (s) return s;
    return CT_OK;
}
