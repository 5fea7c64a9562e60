/* The trainer: micro-batches from a token stream, gradient accumulation, clipping, AdamW on
 * a warmup + cosine schedule, held-out evaluation, and checkpoints that resume exactly. */
#include "model/gpt_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ct_trainer {
    ct_gpt_config cfg;
    ct_train_options o;
    ct_gpt *m;
    float *moments; /* one allocation: exp_avg [P] then exp_avg_sq [P] */
    float *dstat;   /* a GPU run: [double sum of squares][accum losses], read back once a step */
    int32_t *batch; /* [B, T+1] */
    const int32_t *train, *eval;
    int64_t n_train, n_eval;
    int64_t step, epoch, pos;
    ct_rng rng;
    ct_lora *lora;    /* LoRA: only these adapters train (ct_trainer_enable_lora) */
    float *lmoments;  /* their AdamW moments: exp_avg [LP] then exp_avg_sq [LP] */
};

ct_gpt_options ct_train_model_options(const ct_train_options *o)
{
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = o->batch;
    mo.seq = o->seq;
    mo.fused_head = o->fused_head;
    mo.dense_attention = o->dense_attention;
    mo.eos_token = o->eos_token;
    mo.z_loss = o->z_loss;
    mo.label_smoothing = o->label_smoothing;
    mo.dtype = o->dtype;
    mo.device = o->device;
    return mo;
}

ct_train_options ct_train_options_default(void)
{
    ct_train_options o;
    memset(&o, 0, sizeof o);
    o.seed = 1;
    o.batch = 8;
    o.seq = 0;
    o.accum = 1;
    o.steps = 350;
    o.warmup = 20;
    o.lr = 3e-3f;
    o.min_lr = 3e-4f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.weight_decay = 0.1f;
    o.clip = 1.0f;
    o.fused_head = true;
    o.eos_token = -1;
    o.eval_batches = 8;
    o.dtype = CT_DTYPE_F32;
    return o;
}

static ct_status check_train_options(const ct_gpt_config *c, ct_train_options *o)
{
    return gpt_check_train_options(c, o, "ct_trainer_create");
}

ct_status gpt_check_train_options(const ct_gpt_config *c, ct_train_options *o, const char *fn)
{
    if (o->seq == 0) o->seq = c->context;
    if (o->batch < 1)
        return ct_error(CT_EINVAL, "%s: batch must be >= 1, got %lld", fn, (long long)o->batch);
    if (o->seq < 1 || o->seq > c->context)
        return ct_error(CT_EINVAL, "%s: seq must be in [1, context = %lld], got %lld", fn,
                        (long long)c->context, (long long)o->seq);
    if (o->batch > CT_TRAIN_MAX_BATCH)
        return ct_error(CT_EINVAL, "%s: batch must be <= 2^20, got %lld", fn, (long long)o->batch);
    if (o->accum < 1 || o->accum > CT_TRAIN_MAX_ACCUM)
        return ct_error(CT_EINVAL, "%s: accum must be in [1, 2^20], got %lld", fn,
                        (long long)o->accum);
    if (o->steps < 1)
        return ct_error(CT_EINVAL, "%s: steps must be >= 1, got %lld", fn, (long long)o->steps);
    if (o->warmup < 0)
        return ct_error(CT_EINVAL, "%s: warmup must be >= 0, got %lld", fn, (long long)o->warmup);
    if (!(o->lr >= 0) || !(o->min_lr >= 0) || !isfinite(o->lr) || !isfinite(o->min_lr))
        return ct_error(CT_EINVAL, "%s: lr and min_lr must be finite and >= 0 (got %g, %g)", fn,
                        o->lr, o->min_lr);
    if (o->dtype != CT_DTYPE_F32 && o->dtype != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "%s: dtype must be f32 or bf16, got %s", fn,
                        ct_dtype_name(o->dtype));
    if (o->eval_batches < 0 || o->eval_batches > CT_TRAIN_MAX_BATCH)
        return ct_error(CT_EINVAL, "%s: eval_batches must be in [0, 2^20], got %lld", fn,
                        (long long)o->eval_batches);
    ct_adamw_options a = {o->lr, o->beta1, o->beta2, o->eps, o->weight_decay};
    if (!(a.beta1 >= 0 && a.beta1 < 1) || !(a.beta2 >= 0 && a.beta2 < 1) || !(a.eps > 0) ||
        !(a.weight_decay >= 0))
        return ct_error(CT_EINVAL, "%s: need beta1, beta2 in [0, 1), eps > 0, weight_decay >= 0",
                        fn);
    return CT_OK;
}

static ct_status check_tokens(const int32_t *x, int64_t n, int64_t V, const char *what)
{
    return gpt_check_tokens(x, n, V, what, "ct_trainer_create");
}

ct_status gpt_check_tokens(const int32_t *x, int64_t n, int64_t V, const char *what,
                           const char *fn)
{
    for (int64_t i = 0; i < n; i++)
        if (x[i] < 0 || x[i] >= V)
            return ct_error(CT_EINVAL, "%s: %s token %lld is %d, outside the vocabulary [0, %lld)",
                            fn, what, (long long)i, x[i], (long long)V);
    return CT_OK;
}

ct_status ct_trainer_create(const ct_gpt_config *cfg, const ct_train_options *opt,
                            const int32_t *train, int64_t n_train, const int32_t *eval,
                            int64_t n_eval, ct_trainer **out)
{
    const char *fn = "ct_trainer_create";
    if (!out) return ct_error(CT_EINVAL, "%s: out must not be NULL", fn);
    *out = NULL;
    CT_TRY(ct_gpt_config_check(cfg));
    ct_train_options o = opt ? *opt : ct_train_options_default();
    CT_TRY(check_train_options(cfg, &o));
    if (!train || n_train < o.seq + 1)
        return ct_error(CT_EINVAL,
                        "%s: the training data needs at least seq + 1 = %lld tokens, got %lld", fn,
                        (long long)(o.seq + 1), (long long)(train ? n_train : 0));
    if (n_eval && (!eval || n_eval < o.seq + 1))
        return ct_error(CT_EINVAL,
                        "%s: the held-out data needs at least seq + 1 = %lld tokens, got %lld", fn,
                        (long long)(o.seq + 1), (long long)n_eval);
    CT_TRY(check_tokens(train, n_train, cfg->vocab_size, "training"));
    CT_TRY(check_tokens(eval, n_eval, cfg->vocab_size, "held-out"));
    ct_trainer *t;
    CT_TRY(ct_calloc((void **)&t, sizeof *t));
    t->cfg = *cfg;
    t->o = o;
    t->train = train, t->n_train = n_train, t->eval = eval, t->n_eval = n_eval;
    ct_gpt_options mo = ct_train_model_options(&o);
    ct_status s = ct_gpt_create(cfg, &mo, &t->m);
    if (s == CT_OK) s = ct_gpt_init(t->m, o.seed);
    if (s == CT_OK) {
        size_t mb = 2 * t->m->pbytes;
        s = ct_dev_alloc(t->m->dev, mb ? mb : 4, "ct_trainer AdamW moments", (void **)&t->moments);
        if (s == CT_OK) s = ct_dev_zero(t->m->dev, t->moments, mb);
        if (s == CT_OK && !gpt_host(t->m)) /* the step's read-back area: a double, accum losses */
            s = ct_dev_alloc(t->m->dev, (size_t)(2 + o.accum) * sizeof(float), "ct_trainer statistics",
                             (void **)&t->dstat);
    }
    if (s == CT_OK)
        s = ct_alloc((void **)&t->batch, (size_t)(o.batch * (o.seq + 1)) * sizeof(int32_t));
    if (s != CT_OK) {
        ct_trainer_free(t);
        return s;
    }
    /* the data order's random state is separate from the initialisation's */
    ct_rng_seed(&t->rng, o.seed ^ 0x5DEECE66Dull);
    *out = t;
    return CT_OK;
}

void ct_trainer_free(ct_trainer *t)
{
    if (!t) return;
    ct_lora_free(t->lora);
    ct_free(t->lmoments);
    if (t->m && t->moments) ct_dev_free(t->m->dev, t->moments, t->m->pbytes ? 2 * t->m->pbytes : 4);
    if (t->m && t->dstat) ct_dev_free(t->m->dev, t->dstat, (size_t)(2 + t->o.accum) * sizeof(float));
    ct_gpt_free(t->m);
    ct_free(t->batch);
    ct_free(t);
}

ct_status gpt_clip_grad_norm(ct_gpt *m, float *g, int64_t n, float max_norm, double *norm)
{
    double s = 0, *d = &s;
    if (!gpt_host(m)) { /* a device double in the activations, read back once */
        CT_TRY(gpt_acts_ready(m));
        d = (double *)(void *)(m->a.scal + 2);
    }
    GPT_DEV(m, sumsq, d, g, n);
    if (d != &s) CT_TRY(ct_dev_d2h(m->dev, &s, d, sizeof s));
    double N = sqrt(s);
    *norm = N;
    if (max_norm > 0 && N > max_norm) GPT_DEV(m, scale, g, (float)(max_norm / (N + 1e-6)), n);
    return CT_OK;
}

ct_gpt *ct_trainer_model(ct_trainer *t)
{
    return t->m;
}

int64_t ct_trainer_step_count(const ct_trainer *t)
{
    return t->step;
}

/* The next micro-batch: B consecutive windows of T + 1 tokens (neighbours share one token).
 * When the stream runs out, a new epoch starts at a random offset in [0, T). */
void gpt_next_batch(const int32_t *train, int64_t n_train, int64_t B, int64_t T, int64_t *pos,
                    int64_t *epoch, ct_rng *rng, int32_t *batch)
{
    if (*pos + B * T + 1 > n_train) {
        (*epoch)++;
        int64_t span = n_train - B * T - 1;
        int64_t off = (int64_t)(ct_rng_uniform(rng) * (double)T);
        *pos = span > 0 ? off % (span + 1) : 0;
    }
    for (int64_t b = 0; b < B; b++) {
        int64_t s = *pos + b * T;
        if (s + T + 1 > n_train) s = (s % (n_train - T)); /* tiny streams: wrap rows */
        memcpy(batch + b * (T + 1), train + s, (size_t)(T + 1) * sizeof(int32_t));
    }
    *pos += B * T;
}

static void next_batch(ct_trainer *t)
{
    gpt_next_batch(t->train, t->n_train, t->o.batch, t->o.seq, &t->pos, &t->epoch, &t->rng,
                   t->batch);
}

/* A GPU step's one read-back: sum of squares of the gradients (the double at dstat[0..1]) and
 * the micro-batches' losses (dstat[2..]); *loss their sum in micro-batch order (as the host's
 * loop adds them), *norm the gradients' norm. */
static ct_status device_stats(ct_trainer *t, double *loss, double *norm)
{
    ct_gpt *m = t->m;
    GPT_DEV(m, sumsq, (double *)(void *)t->dstat, ct_gpt_grads(m), ct_gpt_num_params(m));
    size_t bytes = (size_t)(2 + t->o.accum) * sizeof(float);
    float *h;
    CT_TRY(ct_alloc((void **)&h, bytes));
    ct_status s = ct_dev_d2h(m->dev, h, t->dstat, bytes);
    if (s == CT_OK) {
        double sq;
        memcpy(&sq, h, sizeof sq);
        *norm = sqrt(sq);
        *loss = 0;
        for (int64_t k = 0; k < t->o.accum; k++)
            *loss += h[2 + k];
    }
    ct_free(h);
    return s;
}

ct_status ct_trainer_step(ct_trainer *t, ct_train_step_info *info)
{
    if (!t) return ct_error(CT_EINVAL, "ct_trainer_step: t must not be NULL");
    ct_gpt *m = t->m;
    /* bf16: the weights' bf16 copy from the f32 master weights once for all the step's
     * micro-batches (so after the last step's update and anything written since: a load,
     * --init-from, LoRA); held while they run, released before the update so that any other
     * forward on this model refreshes it again */
    if (gpt_bf16(m)) {
        CT_TRY(gpt_bf16_refresh(m));
        m->wbf_held = true;
    }
    ct_gpt_zero_grad(m);
    double loss = 0;
    float scale = 1.0f / (float)t->o.accum;
    bool dev = !gpt_host(m); /* a GPU: the losses stay there until the one read-back */
    for (int64_t k = 0; k < t->o.accum; k++) {
        next_batch(t);
        float l;
        ct_status s = ct_gpt_forward_backward(m, t->batch, t->o.batch, t->o.seq, scale, dev ? NULL : &l);
        if (s == CT_OK && dev)
            s = ct_dev_d2d(m->dev, t->dstat + 2 + k, m->a.scal, sizeof(float)); /* after the double */
        if (s) {
            m->wbf_held = false;
            return s;
        }
        if (!dev) loss += l;
    }
    m->wbf_held = false;
    int64_t P = ct_gpt_num_params(m), D = ct_gpt_num_decayed(m);
    double norm;
    if (dev && !t->lora) /* the step's one read-back: the gradients' sum of squares and the losses */
        CT_TRY(device_stats(t, &loss, &norm));
    float lr = ct_lr_cosine(t->step, t->o.warmup, t->o.steps, t->o.lr, t->o.min_lr);
    ct_adamw_options a = {lr, t->o.beta1, t->o.beta2, t->o.eps, t->o.weight_decay};
    if (t->lora) { /* only the adapters move; the model's weights are base + s B A again */
        int64_t LP = ct_lora_num_params(t->lora);
        float *lp = ct_lora_params(t->lora), *lg = ct_lora_grads(t->lora);
        CT_TRY(ct_lora_backward(t->lora));
        CT_TRY(ct_clip_grad_norm(lg, LP, t->o.clip, &norm));
        CT_TRY(ct_adamw_step(lp, lg, t->lmoments, t->lmoments + LP, LP, t->step + 1, &a));
        CT_TRY(ct_lora_apply(t->lora));
    } else {
        if (dev) { /* the norm is known: clip on the device */
            if (t->o.clip > 0 && norm > t->o.clip)
                GPT_DEV(m, scale, ct_gpt_grads(m), (float)(t->o.clip / (norm + 1e-6)), P);
        } else {
            CT_TRY(gpt_clip_grad_norm(m, ct_gpt_grads(m), P, t->o.clip, &norm));
        }
        float *p = ct_gpt_params(m), *g = ct_gpt_grads(m), *mo = t->moments, *v = t->moments + P;
        int64_t st = t->step + 1;
        GPT_DEV(m, adamw, p, g, mo, v, D, st, a.lr, a.beta1, a.beta2, a.eps, a.weight_decay);
        GPT_DEV(m, adamw, p + D, g + D, mo + D, v + D, P - D, st, a.lr, a.beta1, a.beta2, a.eps, 0.0f);
    }
    t->step++;
    if (info) {
        info->step = t->step;
        info->loss = (float)(loss / (double)t->o.accum);
        info->lr = lr;
        info->grad_norm = norm;
        info->tokens = t->o.accum * t->o.batch * t->o.seq;
        info->epoch = t->epoch;
    }
    return CT_OK;
}

ct_status ct_trainer_evaluate(ct_trainer *t, float *loss)
{
    if (!t || !loss) return ct_error(CT_EINVAL, "ct_trainer_evaluate: arguments must not be NULL");
    int64_t B = t->o.batch, T = t->o.seq, windows = (t->n_eval - 1) / T;
    if (windows < 1)
        return ct_error(CT_EINVAL, "ct_trainer_evaluate: the trainer has no held-out tokens");
    if (gpt_bf16(t->m)) {
        CT_TRY(gpt_bf16_refresh(t->m));
        t->m->wbf_held = true; /* the weights do not change while it runs */
    }
    double sum = 0;
    int64_t batches = 0;
    for (int64_t k = 0; k < t->o.eval_batches; k++) {
        int64_t w0 = k * B, nb = windows - w0 < B ? windows - w0 : B;
        if (nb <= 0) break;
        for (int64_t b = 0; b < nb; b++)
            memcpy(t->batch + b * (T + 1), t->eval + (w0 + b) * T,
                   (size_t)(T + 1) * sizeof(int32_t));
        float l;
        ct_status s = ct_gpt_forward(t->m, t->batch, nb, T, &l);
        if (s) {
            t->m->wbf_held = false;
            return s;
        }
        sum += (double)l * (double)nb;
        batches += nb;
    }
    t->m->wbf_held = false;
    if (!batches) return ct_error(CT_EINVAL, "ct_trainer_evaluate: eval_batches is 0");
    *loss = (float)(sum / (double)batches);
    return CT_OK;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

/* The options as JSON fields, in one table so writing and reading agree. */
typedef enum { F_I64, F_U64, F_F32, F_BOOL, F_I32, F_DTYPE } field_kind;
typedef struct {
    const char *name;
    field_kind kind;
    size_t offset;
} field;

#define FIELD(n, k)                                                                                \
    {                                                                                              \
#n, k, offsetof(ct_train_options, n)                                                       \
    }
static const field FIELDS[] = {
    FIELD(seed, F_U64),
    FIELD(batch, F_I64),
    FIELD(seq, F_I64),
    FIELD(accum, F_I64),
    FIELD(steps, F_I64),
    FIELD(warmup, F_I64),
    FIELD(lr, F_F32),
    FIELD(min_lr, F_F32),
    FIELD(beta1, F_F32),
    FIELD(beta2, F_F32),
    FIELD(eps, F_F32),
    FIELD(weight_decay, F_F32),
    FIELD(clip, F_F32),
    FIELD(z_loss, F_F32),
    FIELD(label_smoothing, F_F32),
    FIELD(fused_head, F_BOOL),
    FIELD(dense_attention, F_BOOL),
    FIELD(eos_token, F_I32),
    FIELD(eval_batches, F_I64),
    FIELD(dtype, F_DTYPE), /* "f32" | "bf16" (absent in older checkpoints: f32) */
};
#define N_FIELDS (sizeof FIELDS / sizeof FIELDS[0])

ct_status ct_train_options_to_json(const ct_train_options *o, char **json)
{
    if (!o || !json)
        return ct_error(CT_EINVAL, "ct_train_options_to_json: arguments must not be NULL");
    json_t *j = json_object();
    for (size_t i = 0; i < N_FIELDS; i++) {
        const char *p = (const char *)o + FIELDS[i].offset;
        json_t *v = NULL;
        switch (FIELDS[i].kind) {
        case F_I64:
            v = json_integer((json_int_t) * (const int64_t *)p);
            break;
        case F_U64:
            v = json_integer((json_int_t) * (const uint64_t *)p);
            break;
        case F_I32:
            v = json_integer((json_int_t) * (const int32_t *)p);
            break;
        case F_F32:
            v = json_real((double)*(const float *)p);
            break;
        case F_BOOL:
            v = json_boolean(*(const bool *)p);
            break;
        case F_DTYPE:
            v = json_string(ct_dtype_name(*(const ct_dtype *)p));
            break;
        }
        json_object_set_new(j, FIELDS[i].name, v);
    }
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!s) return ct_error(CT_ENOMEM, "ct_train_options_to_json: out of memory");
    size_t n = strlen(s);
    ct_status st = ct_alloc((void **)json, n + 1);
    if (st == CT_OK) memcpy(*json, s, n + 1);
    free(s);
    return st;
}

ct_status ct_train_options_from_json(const char *text, ct_train_options *o)
{
    if (!text || !o)
        return ct_error(CT_EINVAL, "ct_train_options_from_json: arguments must not be NULL");
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return ct_error(CT_EFORMAT, "train options: not a JSON object");
    }
    const char *key;
    json_t *val;
    ct_status s = CT_OK;
    json_object_foreach(j, key, val)
    {
        size_t i = 0;
        while (i < N_FIELDS && strcmp(FIELDS[i].name, key))
            i++;
        if (i == N_FIELDS) {
            s = ct_error(CT_EFORMAT, "train options: unknown key \"%s\"", key);
            break;
        }
        char *p = (char *)o + FIELDS[i].offset;
        bool ok = FIELDS[i].kind == F_F32     ? json_is_number(val)
                  : FIELDS[i].kind == F_BOOL  ? json_is_boolean(val)
                  : FIELDS[i].kind == F_DTYPE ? json_is_string(val)
                                              : json_is_integer(val);
        if (!ok) {
            s = ct_error(CT_EFORMAT, "train options: \"%s\" has the wrong type", key);
            break;
        }
        switch (FIELDS[i].kind) {
        case F_I64:
            *(int64_t *)p = (int64_t)json_integer_value(val);
            break;
        case F_U64:
            *(uint64_t *)p = (uint64_t)json_integer_value(val);
            break;
        case F_I32:
            *(int32_t *)p = (int32_t)json_integer_value(val);
            break;
        case F_F32:
            *(float *)p = (float)json_number_value(val);
            break;
        case F_BOOL:
            *(bool *)p = json_is_true(val);
            break;
        case F_DTYPE: {
            const char *name = json_string_value(val);
            ct_dtype dt = CT_DTYPE_F32;
            if (strcmp(name, "f32") && strcmp(name, "bf16")) {
                s = ct_error(CT_EFORMAT, "train options: \"dtype\" must be \"f32\" or \"bf16\", "
                                         "got \"%.40s\"", name);
                break;
            }
            ct_dtype_from_name(name, &dt);
            *(ct_dtype *)p = dt;
            break;
        }
        }
        if (s) break;
    }
    json_decref(j);
    return s;
}

static const char *RESERVED[] = {"format", "config", "train", "step", "epoch", "data_pos", "rng"};
#define N_RESERVED (sizeof RESERVED / sizeof RESERVED[0])

ct_status ct_trainer_save(const ct_trainer *t, const char *path, size_t n_extra,
                          const char *const *keys, const char *const *values)
{
    const char *fn = "ct_trainer_save";
    if (!t || !path) return ct_error(CT_EINVAL, "%s: t and path must not be NULL", fn);
    if (n_extra && (!keys || !values))
        return ct_error(CT_EINVAL, "%s: keys and values must not be NULL", fn);
    for (size_t i = 0; i < n_extra; i++)
        for (size_t r = 0; r < N_RESERVED; r++)
            if (!keys[i] || !values[i] || !strcmp(keys[i], RESERVED[r]))
                return ct_error(CT_EINVAL, "%s: extra metadata key %zu ('%s') is NULL or reserved",
                                fn, i, keys[i] ? keys[i] : "(null)");
    ct_gpt *m = t->m;
    int nt = ct_gpt_num_tensors(m);
    int64_t P = ct_gpt_num_params(m);
    int nl = ct_lora_num_tensors(t->lora); /* LoRA: adapters, their moments and the bases */
    size_t count = 3 * (size_t)nt + 4 * (size_t)nl, nmeta = N_RESERVED + n_extra + (nl ? 1 : 0);
    char lora_meta[160];
    ct_tensor *tens = NULL;
    char **names = NULL, *namebuf = NULL, *cfg = NULL, *trn = NULL;
    const char **mk = NULL, **mv = NULL;
    char step[32], epoch[32], pos[32], rng[80];
    ct_status s;
    /* a GPU run: the weights and moments copied to the host for the file */
    float *hp = NULL, *hm = NULL;
    if (!gpt_host(m) && ((s = ct_alloc((void **)&hp, m->pbytes ? m->pbytes : 4)) ||
                         (s = ct_alloc((void **)&hm, m->pbytes ? 2 * m->pbytes : 4)) ||
                         (s = ct_gpt_read_params(m, false, hp)) ||
                         (s = ct_dev_d2h(m->dev, hm, t->moments, 2 * m->pbytes)))) {
        ct_free(hp);
        ct_free(hm);
        return s;
    }
    float *params = hp ? hp : m->params, *moments = hm ? hm : t->moments;
    if ((s = ct_alloc((void **)&tens, count * sizeof *tens)) ||
        (s = ct_alloc((void **)&names, count * sizeof *names)) ||
        (s = ct_alloc((void **)&namebuf, count * 128)) ||
        (s = ct_alloc((void **)&mk, nmeta * sizeof *mk)) ||
        (s = ct_alloc((void **)&mv, nmeta * sizeof *mv)) ||
        (s = ct_gpt_config_to_json(&t->cfg, &cfg)))
        goto done;
    for (int i = 0; i < nt && s == CT_OK; i++) {
        const gpt_tensor *gt = &m->tensors[i];
        const char *name = gt->name;
        ct_tensor p;
        int64_t off = gt->offset;
        if ((s = ct_tensor_wrap(&p, params + off, CT_DTYPE_F32, gt->ndim, gt->shape, NULL))) break;
        for (int k = 0; k < 3; k++) {
            size_t e = (size_t)k * (size_t)nt + (size_t)i;
            names[e] = namebuf + e * 128;
            snprintf(names[e], 128, "%s%s",
                     k == 0   ? ""
                     : k == 1 ? "optimizer.exp_avg."
                              : "optimizer.exp_avg_sq.",
                     name);
            tens[e] = p;
            if (k) tens[e].data = moments + (k - 1) * P + off;
        }
    }
    if (s) goto done;
    for (int i = 0; i < nl && s == CT_OK; i++) {
        const char *name;
        ct_tensor p;
        if ((s = ct_lora_tensor(t->lora, i, &name, &p, NULL))) break;
        int64_t off = (float *)p.data - ct_lora_params(t->lora), LP = ct_lora_num_params(t->lora);
        for (int k = 0; k < 3; k++) {
            size_t e = 3 * (size_t)nt + 3 * (size_t)i + (size_t)k;
            names[e] = namebuf + e * 128;
            snprintf(names[e], 128, "%slora.%s",
                     k == 0   ? ""
                     : k == 1 ? "optimizer.exp_avg."
                              : "optimizer.exp_avg_sq.",
                     name);
            tens[e] = p;
            if (k) tens[e].data = t->lmoments + (k - 1) * LP + off;
        }
    }
    if (nl) { /* the frozen bases (one per adapter pair) after the adapters */
        size_t e = 3 * (size_t)nt + 3 * (size_t)nl;
        count = e;
        for (int i = 0; i < nt && s == CT_OK; i++) {
            const char *name;
            if ((s = ct_gpt_tensor(m, i, &name, NULL, NULL))) break;
            static const char *halves[] = {"", "#gate", "#up"};
            for (int h = 0; h < 3 && s == CT_OK; h++) {
                char key[112];
                snprintf(key, sizeof key, "%s%s", name, halves[h]);
                ct_tensor b;
                if (ct_lora_base(t->lora, key, &b) != CT_OK) continue;
                names[count] = namebuf + count * 128;
                snprintf(names[count], 128, "lora.base.%s", key);
                tens[count++] = b;
            }
        }
        const ct_lora_options *lo = ct_lora_get_options(t->lora);
        snprintf(lora_meta, sizeof lora_meta, "{\"r\":%lld,\"lora_alpha\":%.9g,\"targets\":%u}",
                 (long long)lo->rank, (double)lo->alpha, (unsigned)lo->targets);
    }
    if (s) goto done;
    if ((s = ct_train_options_to_json(&t->o, &trn))) goto done;
    snprintf(step, sizeof step, "%lld", (long long)t->step);
    snprintf(epoch, sizeof epoch, "%lld", (long long)t->epoch);
    snprintf(pos, sizeof pos, "%lld", (long long)t->pos);
    snprintf(rng, sizeof rng, "%016" PRIx64 "%016" PRIx64 "%016" PRIx64 "%016" PRIx64, t->rng.s[0],
             t->rng.s[1], t->rng.s[2], t->rng.s[3]);
    const char *vals[N_RESERVED] = {"ctorch-gpt", cfg, trn, step, epoch, pos, rng};
    for (size_t r = 0; r < N_RESERVED; r++)
        mk[r] = RESERVED[r], mv[r] = vals[r];
    for (size_t i = 0; i < n_extra; i++)
        mk[N_RESERVED + i] = keys[i], mv[N_RESERVED + i] = values[i];
    if (nl) mk[N_RESERVED + n_extra] = "lora", mv[N_RESERVED + n_extra] = lora_meta;
    s = ct_save_safetensors(path, tens, (const char *const *)names, count, mk, mv, nmeta, NULL);
done:
    ct_free(trn);
    ct_free(cfg);
    ct_free(mv);
    ct_free(mk);
    ct_free(namebuf);
    ct_free(names);
    ct_free(tens);
    ct_free(hp);
    ct_free(hm);
    return s;
}

static ct_status read_config(const ct_tensor_file *f, ct_gpt_config *cfg)
{
    const char *fmt = ct_tensor_file_metadata_get(f, "format");
    const char *js = ct_tensor_file_metadata_get(f, "config");
    if (!fmt || strcmp(fmt, "ctorch-gpt") || !js)
        return ct_error(
            CT_EFORMAT,
            "checkpoint: not a ctorch-gpt checkpoint (metadata \"format\" and \"config\" "
            "missing)");
    *cfg = ct_gpt_config_default();
    ct_status s = ct_gpt_config_from_json(js, cfg);
    if (s) return ct_error_wrap(CT_EFORMAT, "checkpoint: bad \"config\"");
    return CT_OK;
}

static bool float_dtype(ct_dtype dt)
{
    return dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_F16 || dt == CT_DTYPE_BF16 ||
           dt == CT_DTYPE_F8_E4M3 || dt == CT_DTYPE_F8_E5M2;
}

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Tensor `name` of the file has the shape of table entry t and a floating dtype. */
static ct_status check_tensor(const ct_tensor_file *f, const char *name, const gpt_tensor *t)
{
    size_t idx;
    if (ct_tensor_file_find(f, name, &idx) != CT_OK)
        return ct_error(CT_EFORMAT, "checkpoint: tensor '%s' is missing", name);
    ct_tensor_info info;
    CT_TRY(ct_tensor_file_info(f, idx, &info));
    if (!info.has_dtype || !float_dtype(info.dtype))
        return ct_error(CT_EFORMAT,
                        "checkpoint: tensor '%s' has dtype %s; parameters need a floating-point "
                        "one (F32, F64, F16, BF16, F8)",
                        name, ct_st_dtype_name(info.st_dtype));
    bool same = info.ndim == t->ndim;
    for (int d = 0; same && d < t->ndim; d++)
        same = info.shape[d] == t->shape[d];
    if (!same) {
        char want[64], got[160];
        shape_text(want, sizeof want, t->ndim, t->shape);
        shape_text(got, sizeof got, info.ndim > 8 ? 8 : info.ndim, info.shape);
        return ct_error(CT_EFORMAT,
                        "checkpoint: tensor '%s' has shape %s%s, not the configuration's %s", name,
                        got, info.ndim > 8 ? " (first 8 dims)" : "", want);
    }
    return CT_OK;
}

static ct_status meta_int(gpt_meta_get get, const void *src, const char *key, int64_t lo,
                          int64_t *out)
{
    const char *v = get(src, key);
    char *end;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno == ERANGE || x < lo)
        return ct_error(CT_EFORMAT,
                        "checkpoint: metadata \"%s\" must be an integer in [%lld, 2^63), got "
                        "\"%.40s\"",
                        key, (long long)lo, v ? v : "");
    *out = x;
    return CT_OK;
}

ct_status gpt_read_trainer_state(gpt_meta_get get, const void *src, int64_t *step,
                                 int64_t *epoch, int64_t *pos, ct_rng *rng)
{
    CT_TRY(meta_int(get, src, "step", 0, step));
    CT_TRY(meta_int(get, src, "epoch", 0, epoch));
    CT_TRY(meta_int(get, src, "data_pos", 0, pos));
    const char *r = get(src, "rng");
    if (!r || strlen(r) != 64)
        return ct_error(CT_EFORMAT, "checkpoint: metadata \"rng\" must be 64 hex digits");
    for (int i = 0; i < 4; i++) {
        char w[17], *end;
        memcpy(w, r + 16 * i, 16);
        w[16] = '\0';
        for (int k = 0; k < 16; k++)
            if (!((w[k] >= '0' && w[k] <= '9') || (w[k] >= 'a' && w[k] <= 'f') ||
                  (w[k] >= 'A' && w[k] <= 'F')))
                return ct_error(CT_EFORMAT, "checkpoint: metadata \"rng\" must be 64 hex digits");
        rng->s[i] = strtoull(w, &end, 16);
    }
    if (!(rng->s[0] | rng->s[1] | rng->s[2] | rng->s[3]))
        return ct_error(CT_EFORMAT,
                        "checkpoint: metadata \"rng\" is all zero, which is not a state of the "
                        "generator (it would only ever return 0)");
    return CT_OK;
}

static const char *file_meta(const void *f, const char *key)
{
    return ct_tensor_file_metadata_get(f, key);
}

/* The trainer state of a checkpoint's metadata: step, epoch, data position, random state. */
static ct_status read_state(const ct_tensor_file *f, int64_t *step, int64_t *epoch, int64_t *pos,
                            ct_rng *rng)
{
    return gpt_read_trainer_state(file_meta, f, step, epoch, pos, rng);
}

ct_status ct_gpt_checkpoint_check(const ct_tensor_file *f, bool trainer_state,
                                  ct_gpt_config *cfg)
{
    if (!f || !cfg)
        return ct_error(CT_EINVAL, "ct_gpt_checkpoint_check: arguments must not be NULL");
    CT_TRY(read_config(f, cfg));
    gpt_tensor *tab;
    int n;
    CT_TRY(gpt_tensor_table(cfg, &tab, &n));
    ct_status s = CT_OK;
    for (int i = 0; i < n && !s; i++) {
        s = check_tensor(f, tab[i].name, &tab[i]);
        for (int k = 0; trainer_state && k < 2 && !s; k++) {
            char nm[128];
            snprintf(nm, sizeof nm, "%s%s", k ? "optimizer.exp_avg_sq." : "optimizer.exp_avg.",
                     tab[i].name);
            s = check_tensor(f, nm, &tab[i]);
        }
    }
    ct_free(tab);
    if (s || !trainer_state) return s;
    const char *tj = ct_tensor_file_metadata_get(f, "train");
    if (tj) {
        ct_train_options o = ct_train_options_default();
        s = ct_train_options_from_json(tj, &o);
        if (!s) s = check_train_options(cfg, &o);
        if (s) return ct_error_wrap(CT_EFORMAT, "checkpoint: metadata \"train\"");
    }
    int64_t step, epoch, pos;
    ct_rng rng;
    return read_state(f, &step, &epoch, &pos, &rng);
}

ct_status ct_gpt_checkpoint_config(const ct_tensor_file *f, ct_gpt_config *cfg)
{
    if (!f || !cfg)
        return ct_error(CT_EINVAL, "ct_gpt_checkpoint_config: arguments must not be NULL");
    return ct_gpt_checkpoint_check(f, false, cfg);
}

ct_status ct_trainer_load(ct_trainer *t, const char *path)
{
    if (!t || !path) return ct_error(CT_EINVAL, "ct_trainer_load: t and path must not be NULL");
    ct_tensor_file *f;
    CT_TRY(ct_load(path, NULL, &f));
    ct_gpt_config c;
    ct_status s = ct_gpt_checkpoint_check(f, true, &c);
    char *mine = NULL, *theirs = NULL;
    if (s == CT_OK && (s = ct_gpt_config_to_json(&t->cfg, &mine)) == CT_OK &&
        (s = ct_gpt_config_to_json(&c, &theirs)) == CT_OK && strcmp(mine, theirs))
        s = ct_error(CT_EFORMAT,
                     "checkpoint: its model configuration %s differs from this run's %s", theirs,
                     mine);
    ct_free(mine);
    ct_free(theirs);
    int64_t step = 0, epoch = 0, pos = 0;
    ct_rng rng = {{0, 0, 0, 0}};
    if (s == CT_OK) s = read_state(f, &step, &epoch, &pos, &rng);
    /* the data position must be one this run's data can continue from */
    if (s == CT_OK && pos > t->n_train)
        s = ct_error(
            CT_EFORMAT,
            "checkpoint: data position %lld is past the end of the training data (%lld tokens)",
            (long long)pos, (long long)t->n_train);
    if (s == CT_OK) s = ct_gpt_load_params(t->m, f);
    int nt = ct_gpt_num_tensors(t->m);
    int64_t P = ct_gpt_num_params(t->m);
    float *moments = t->moments, *hm = NULL; /* a GPU run: read on the host, then copied */
    if (s == CT_OK && !gpt_host(t->m) &&
        (s = ct_alloc((void **)&hm, t->m->pbytes ? 2 * t->m->pbytes : 4)) == CT_OK)
        moments = hm;
    for (int i = 0; i < nt && s == CT_OK; i++) {
        const gpt_tensor *gt = &t->m->tensors[i];
        const char *name = gt->name;
        ct_tensor p;
        int64_t off = gt->offset;
        if ((s = ct_tensor_wrap(&p, moments + off, CT_DTYPE_F32, gt->ndim, gt->shape, NULL))) break;
        for (int k = 0; k < 2 && s == CT_OK; k++) {
            char nm[128];
            snprintf(nm, sizeof nm, "%s%s", k ? "optimizer.exp_avg_sq." : "optimizer.exp_avg.",
                     name);
            size_t idx;
            if (ct_tensor_file_find(f, nm, &idx) != CT_OK) {
                s = ct_error(CT_EFORMAT, "checkpoint: tensor '%s' is missing", nm);
                break;
            }
            ct_tensor dst = p;
            dst.data = moments + k * P + off;
            s = ct_tensor_file_read_into(f, idx, &dst);
            if (s) s = ct_error_wrap(CT_EFORMAT, "checkpoint: tensor '%s'", nm);
        }
    }
    /* LoRA: the same adapters enabled here as there, then theirs restored */
    ct_lora_options lo;
    bool has_lora = false;
    if (s == CT_OK) s = ct_lora_checkpoint_options(f, &lo, &has_lora);
    if (s == CT_OK && has_lora != (t->lora != NULL))
        s = ct_error(CT_EFORMAT, "checkpoint: it %s LoRA adapters and this run %s", has_lora ? "has" : "has no",
                     t->lora ? "trains them" : "does not");
    if (s == CT_OK && t->lora) {
        const ct_lora_options *mine_o = ct_lora_get_options(t->lora);
        if (lo.rank != mine_o->rank || lo.alpha != mine_o->alpha || lo.targets != mine_o->targets)
            s = ct_error(CT_EFORMAT, "checkpoint: its LoRA adapters (r %lld, alpha %g, targets %u) "
                         "are not this run's (r %lld, alpha %g, targets %u)",
                         (long long)lo.rank, lo.alpha, lo.targets, (long long)mine_o->rank,
                         mine_o->alpha, mine_o->targets);
        int nl = ct_lora_num_tensors(t->lora);
        int64_t LP = ct_lora_num_params(t->lora);
        for (int i = 0; i < nl && s == CT_OK; i++) {
            const char *name;
            ct_tensor p;
            if ((s = ct_lora_tensor(t->lora, i, &name, &p, NULL))) break;
            int64_t off = (float *)p.data - ct_lora_params(t->lora);
            for (int k = 0; k < 3 && s == CT_OK; k++) {
                char nm[160];
                snprintf(nm, sizeof nm, "%slora.%s",
                         k == 0 ? "" : k == 1 ? "optimizer.exp_avg." : "optimizer.exp_avg_sq.", name);
                size_t idx;
                if (ct_tensor_file_find(f, nm, &idx) != CT_OK) {
                    s = ct_error(CT_EFORMAT, "checkpoint: tensor '%s' is missing", nm);
                    break;
                }
                ct_tensor dst = p;
                if (k) dst.data = t->lmoments + (k - 1) * LP + off;
                s = ct_tensor_file_read_into(f, idx, &dst);
                if (s) s = ct_error_wrap(CT_EFORMAT, "checkpoint: tensor '%s'", nm);
            }
        }
        for (int i = 0; i < nt && s == CT_OK; i++) {
            const char *name;
            if ((s = ct_gpt_tensor(t->m, i, &name, NULL, NULL))) break;
            static const char *halves[] = {"", "#gate", "#up"};
            for (int h = 0; h < 3 && s == CT_OK; h++) {
                char key[112], nm[160];
                snprintf(key, sizeof key, "%s%s", name, halves[h]);
                ct_tensor b;
                if (ct_lora_base(t->lora, key, &b) != CT_OK) continue;
                snprintf(nm, sizeof nm, "lora.base.%s", key);
                size_t idx;
                if (ct_tensor_file_find(f, nm, &idx) != CT_OK) {
                    s = ct_error(CT_EFORMAT, "checkpoint: tensor '%s' is missing", nm);
                    break;
                }
                s = ct_tensor_file_read_into(f, idx, &b);
                if (s) s = ct_error_wrap(CT_EFORMAT, "checkpoint: tensor '%s'", nm);
            }
        }
        if (s == CT_OK) s = ct_lora_apply(t->lora);
    }
    if (s == CT_OK && hm) s = ct_dev_h2d(t->m->dev, t->moments, hm, 2 * t->m->pbytes);
    ct_free(hm);
    ct_tensor_file_close(f);
    CT_TRY(s);
    t->step = step;
    t->epoch = epoch;
    t->pos = pos;
    t->rng = rng;
    return CT_OK;
}

/* ---- LoRA ---------------------------------------------------------------------------------- */

ct_status ct_trainer_enable_lora(ct_trainer *t, const ct_lora_options *o)
{
    if (!t) return ct_error(CT_EINVAL, "ct_trainer_enable_lora: t must not be NULL");
    if (!gpt_host(t->m))
        return ct_error(CT_EUNSUPPORTED, "ct_trainer_enable_lora: LoRA trains on the CPU only (the "
                                         "model lives on %s)",
                        ct_device_name(t->m->dev));
    if (t->lora) return ct_error(CT_EINVAL, "ct_trainer_enable_lora: adapters are already enabled");
    if (t->step)
        return ct_error(CT_EINVAL, "ct_trainer_enable_lora: enable the adapters before any step");
    ct_lora *l;
    CT_TRY(ct_lora_create(t->m, o, t->o.seed, &l));
    ct_status s = ct_calloc((void **)&t->lmoments, 2 * (size_t)ct_lora_num_params(l) * sizeof(float));
    if (s) {
        ct_lora_free(l);
        return s;
    }
    t->lora = l;
    return CT_OK;
}

ct_lora *ct_trainer_lora(ct_trainer *t)
{
    return t ? t->lora : NULL;
}

ct_status ct_lora_checkpoint_options(const ct_tensor_file *f, ct_lora_options *o, bool *found)
{
    if (!f || !o || !found)
        return ct_error(CT_EINVAL, "ct_lora_checkpoint_options: arguments must not be NULL");
    *found = false;
    const char *js = ct_tensor_file_metadata_get(f, "lora");
    if (!js) return CT_OK;
    json_t *j = json_loads(js, JSON_REJECT_DUPLICATES, NULL);
    json_t *r = json_object_get(j, "r"), *a = json_object_get(j, "lora_alpha"),
           *tg = json_object_get(j, "targets");
    ct_status s = CT_OK;
    if (!json_is_integer(r) || !json_is_number(a) || !json_is_integer(tg) ||
        json_object_size(j) != 3 || json_integer_value(r) < 1 || json_integer_value(r) > 4096 ||
        !(json_number_value(a) > 0) || json_number_value(a) > 1e30 ||
        json_integer_value(tg) < 1 || json_integer_value(tg) > 127)
        s = ct_error(CT_EFORMAT,
                     "checkpoint: metadata \"lora\" must be {\"r\": 1..4096, \"lora_alpha\": > 0, "
                     "\"targets\": 1..127}");
    else {
        o->rank = (int64_t)json_integer_value(r);
        o->alpha = (float)json_number_value(a);
        o->targets = (uint32_t)json_integer_value(tg);
        *found = true;
    }
    json_decref(j);
    return s;
}
