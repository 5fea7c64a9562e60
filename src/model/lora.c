/* LoRA adapters in PEFT's layout (include/ctorch/model.h): apply, gradients, save, merge. */
#include "model/gpt_internal.h"
#include "model/hf_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* The targets: CT_LORA_* bit, short name, PEFT module, ctorch tensor suffix, row half. */
static const struct {
    uint32_t bit;
    const char *shortname, *module, *hf_part, *ct;
    int half; /* 0: the whole tensor; 1: gate rows of w_gate_up; 2: up rows */
} TARGETS[] = {
    {CT_LORA_Q, "q", "q_proj", "self_attn.q_proj", "attention.wq.weight", 0},
    {CT_LORA_K, "k", "k_proj", "self_attn.k_proj", "attention.wk.weight", 0},
    {CT_LORA_V, "v", "v_proj", "self_attn.v_proj", "attention.wv.weight", 0},
    {CT_LORA_O, "o", "o_proj", "self_attn.o_proj", "attention.wo.weight", 0},
    {CT_LORA_GATE, "gate", "gate_proj", "mlp.gate_proj", "feed_forward.w_gate_up.weight", 1},
    {CT_LORA_UP, "up", "up_proj", "mlp.up_proj", "feed_forward.w_gate_up.weight", 2},
    {CT_LORA_DOWN, "down", "down_proj", "mlp.down_proj", "feed_forward.w_down.weight", 0},
};
#define N_TARGETS (int)(sizeof TARGETS / sizeof TARGETS[0])

typedef struct adapter {
    char name_a[160], name_b[160]; /* PEFT tensor names */
    char ct[96];                   /* ctorch tensor name */
    int target;                    /* index into TARGETS */
    int64_t layer, out, in;
    float *w, *g;  /* the model's weight and gradient rows */
    float *base;   /* [out, in] frozen copy */
    int64_t a_off, b_off; /* into params / grads */
} adapter;

struct ct_lora {
    ct_gpt *m;
    ct_lora_options o;
    float scale;
    int n;
    adapter *ad;
    int64_t np;
    float *params, *grads, *bases; /* one allocation each */
};

ct_lora_options ct_lora_options_default(void)
{
    ct_lora_options o = {8, 8.0f, CT_LORA_Q | CT_LORA_V};
    return o;
}

ct_status ct_lora_targets_parse(const char *list, uint32_t *targets)
{
    if (!list || !targets) return ct_error(CT_EINVAL, "ct_lora_targets_parse: NULL argument");
    uint32_t bits = 0;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int k = -1;
        for (int i = 0; i < N_TARGETS && k < 0; i++)
            if ((strlen(TARGETS[i].shortname) == n && !strncmp(p, TARGETS[i].shortname, n)) ||
                (strlen(TARGETS[i].module) == n && !strncmp(p, TARGETS[i].module, n)))
                k = i;
        if (k < 0)
            return ct_error(CT_EINVAL,
                            "lora targets: unknown entry '%.*s' (q, k, v, o, gate, up, down)",
                            (int)(n > 64 ? 64 : n), p);
        bits |= TARGETS[k].bit;
        p += n;
        if (*p == ',') p++;
    }
    if (!bits) return ct_error(CT_EINVAL, "lora targets: the list is empty");
    *targets = bits;
    return CT_OK;
}

static int find_tensor(const ct_gpt *m, const char *name)
{
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return i;
    return -1;
}

/* Point adapter fields at the model tensor of (target k, layer l). */
static ct_status locate(const ct_gpt *m, int k, int64_t l, adapter *a)
{
    snprintf(a->ct, sizeof a->ct, "layers.%lld.%s", (long long)l, TARGETS[k].ct);
    int t = find_tensor(m, a->ct);
    if (t < 0) return ct_error(CT_EINTERNAL, "lora: model tensor '%s' not found", a->ct);
    const gpt_tensor *gt = &m->tensors[t];
    int64_t rows = gt->shape[0], cols = gt->shape[1], F = m->cfg.d_ff;
    int64_t r0 = TARGETS[k].half == 2 ? F : 0;
    if (TARGETS[k].half) rows = F;
    a->target = k;
    a->layer = l;
    a->out = rows;
    a->in = cols;
    a->w = m->params + gt->offset + r0 * cols;
    a->g = m->grads + gt->offset + r0 * cols;
    snprintf(a->name_a, sizeof a->name_a, "base_model.model.model.layers.%lld.%s.lora_A.weight",
             (long long)l, TARGETS[k].hf_part);
    snprintf(a->name_b, sizeof a->name_b, "base_model.model.model.layers.%lld.%s.lora_B.weight",
             (long long)l, TARGETS[k].hf_part);
    return CT_OK;
}

void ct_lora_free(ct_lora *l)
{
    if (!l) return;
    ct_free(l->ad);
    ct_free(l->params);
    ct_free(l->grads);
    ct_free(l->bases);
    ct_free(l);
}

static ct_status check_options(const ct_lora_options *o)
{
    if (o->rank < 1 || o->rank > 4096)
        return ct_error(CT_EINVAL, "lora: rank must be in [1, 4096], got %lld", (long long)o->rank);
    if (!(o->alpha > 0) || !isfinite(o->alpha))
        return ct_error(CT_EINVAL, "lora: alpha must be > 0 and finite, got %g", o->alpha);
    if (!o->targets || (o->targets & ~(uint32_t)127))
        return ct_error(CT_EINVAL, "lora: targets must be a non-empty set of CT_LORA_* bits");
    return CT_OK;
}

ct_status ct_lora_create(ct_gpt *m, const ct_lora_options *opt, uint64_t seed, ct_lora **out)
{
    if (!m || !out) return ct_error(CT_EINVAL, "ct_lora_create: m and out must not be NULL");
    *out = NULL;
    ct_lora_options o = opt ? *opt : ct_lora_options_default();
    CT_TRY(check_options(&o));
    if (m->mapped)
        return ct_error(CT_EINVAL, "ct_lora_create: the model's weights are mapped (inference only)");
    ct_lora *l;
    CT_TRY(ct_calloc((void **)&l, sizeof *l));
    l->m = m;
    l->o = o;
    l->scale = o.alpha / (float)o.rank;
    int per = 0;
    for (int k = 0; k < N_TARGETS; k++)
        per += (o.targets & TARGETS[k].bit) != 0;
    ct_status s = ct_calloc((void **)&l->ad, (size_t)(per * m->cfg.n_layer) * sizeof(adapter));
    size_t nb = 0, np = 0;
    for (int64_t L = 0; L < m->cfg.n_layer && s == CT_OK; L++)
        for (int k = 0; k < N_TARGETS && s == CT_OK; k++) {
            if (!(o.targets & TARGETS[k].bit)) continue;
            adapter *a = &l->ad[l->n++];
            if ((s = locate(m, k, L, a))) break;
            if (o.rank > a->out || o.rank > a->in)
                s = ct_error(CT_EINVAL, "ct_lora_create: rank %lld exceeds %s's [%lld, %lld]",
                             (long long)o.rank, a->ct, (long long)a->out, (long long)a->in);
            a->a_off = (int64_t)np;
            np += (size_t)(o.rank * a->in);
            a->b_off = (int64_t)np;
            np += (size_t)(a->out * o.rank);
            nb += (size_t)(a->out * a->in);
        }
    l->np = (int64_t)np;
    if (s == CT_OK && (s = ct_calloc((void **)&l->params, np * sizeof(float))) == CT_OK &&
        (s = ct_calloc((void **)&l->grads, np * sizeof(float))) == CT_OK)
        s = ct_alloc((void **)&l->bases, nb * sizeof(float));
    if (s) {
        ct_lora_free(l);
        return s;
    }
    ct_rng r;
    ct_rng_seed(&r, seed ^ 0x4C6F5241ull);
    size_t bo = 0;
    for (int i = 0; i < l->n; i++) {
        adapter *a = &l->ad[i];
        a->base = l->bases + bo;
        bo += (size_t)(a->out * a->in);
        memcpy(a->base, a->w, (size_t)(a->out * a->in) * sizeof(float));
        float bound = 1.0f / sqrtf((float)a->in);
        for (int64_t j = 0; j < o.rank * a->in; j++)
            l->params[a->a_off + j] = bound * (float)(2.0 * ct_rng_uniform(&r) - 1.0);
    }
    *out = l;
    return ct_lora_apply(l);
}

const ct_lora_options *ct_lora_get_options(const ct_lora *l)
{
    return &l->o;
}

ct_status ct_lora_apply(ct_lora *l)
{
    if (!l) return ct_error(CT_EINVAL, "ct_lora_apply: l must not be NULL");
    int64_t r = l->o.rank;
    for (int i = 0; i < l->n; i++) {
        adapter *a = &l->ad[i];
        memcpy(a->w, a->base, (size_t)(a->out * a->in) * sizeof(float));
        /* W[out, in] += s B[out, r] A[r, in] */
        CT_TRY(ct_gemm_f32(false, false, a->out, a->in, r, l->scale, l->params + a->b_off, r,
                           l->params + a->a_off, a->in, 1.0f, a->w, a->in));
    }
    return CT_OK;
}

ct_status ct_lora_backward(ct_lora *l)
{
    if (!l) return ct_error(CT_EINVAL, "ct_lora_backward: l must not be NULL");
    int64_t r = l->o.rank;
    for (int i = 0; i < l->n; i++) {
        adapter *a = &l->ad[i];
        /* dA[r, in] = s B^T G;  dB[out, r] = s G A^T */
        CT_TRY(ct_gemm_f32(true, false, r, a->in, a->out, l->scale, l->params + a->b_off, r, a->g,
                           a->in, 0.0f, l->grads + a->a_off, a->in));
        CT_TRY(ct_gemm_f32(false, true, a->out, r, a->in, l->scale, a->g, a->in,
                           l->params + a->a_off, a->in, 0.0f, l->grads + a->b_off, r));
    }
    return CT_OK;
}

int64_t ct_lora_num_params(const ct_lora *l)
{
    return l ? l->np : 0;
}

float *ct_lora_params(ct_lora *l)
{
    return l->params;
}

float *ct_lora_grads(ct_lora *l)
{
    return l->grads;
}

int ct_lora_num_tensors(const ct_lora *l)
{
    return l ? 2 * l->n : 0;
}

ct_status ct_lora_tensor(ct_lora *l, int i, const char **name, ct_tensor *param, ct_tensor *grad)
{
    if (!l || i < 0 || i >= 2 * l->n)
        return ct_error(CT_EINVAL, "ct_lora_tensor: index %d is outside [0, %d)", i, l ? 2 * l->n : 0);
    const adapter *a = &l->ad[i / 2];
    bool isb = i % 2;
    int64_t shape[2] = {isb ? a->out : l->o.rank, isb ? l->o.rank : a->in};
    int64_t off = isb ? a->b_off : a->a_off;
    if (name) *name = isb ? a->name_b : a->name_a;
    if (param) CT_TRY(ct_tensor_wrap(param, l->params + off, CT_DTYPE_F32, 2, shape, NULL));
    if (grad) CT_TRY(ct_tensor_wrap(grad, l->grads + off, CT_DTYPE_F32, 2, shape, NULL));
    return CT_OK;
}

ct_status ct_lora_base(ct_lora *l, const char *name, ct_tensor *base)
{
    if (!l || !name || !base) return ct_error(CT_EINVAL, "ct_lora_base: NULL argument");
    /* w_gate_up may have two adapters (gate and up halves): the base is per half, so look for
     * "NAME" or "NAME#gate" / "NAME#up" */
    const char *hash = strchr(name, '#');
    size_t n = hash ? (size_t)(hash - name) : strlen(name);
    for (int i = 0; i < l->n; i++) {
        const adapter *a = &l->ad[i];
        if (strlen(a->ct) != n || strncmp(a->ct, name, n)) continue;
        if (TARGETS[a->target].half ? !hash || strcmp(hash + 1, TARGETS[a->target].shortname)
                                    : hash != NULL)
            continue;
        int64_t shape[2] = {a->out, a->in};
        return ct_tensor_wrap(base, a->base, CT_DTYPE_F32, 2, shape, NULL);
    }
    return ct_error(CT_EINVAL, "ct_lora_base: no adapter on '%s'", name);
}

/* ---- files -------------------------------------------------------------------------------- */

ct_status ct_lora_save(const ct_lora *l, const char *dir, const char *base_model)
{
    const char *fn = "ct_lora_save";
    if (!l || !dir) return ct_error(CT_EINVAL, "%s: l and dir must not be NULL", fn);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ct_error(CT_EIO, "%s: cannot create '%s': %s", fn, dir, strerror(errno));
    ct_tensor *ts = NULL;
    const char **names = NULL;
    char *path = NULL;
    ct_status s = CT_OK;
    if ((s = ct_calloc((void **)&ts, (size_t)(2 * l->n + 1) * sizeof *ts)) ||
        (s = ct_calloc((void **)&names, (size_t)(2 * l->n + 1) * sizeof *names)))
        goto done;
    for (int i = 0; i < 2 * l->n && s == CT_OK; i++)
        s = ct_lora_tensor((ct_lora *)l, i, &names[i], &ts[i], NULL);
    static const char *mk[] = {"format"}, *mv[] = {"pt"};
    if (s || (s = hf_join(dir, "adapter_model.safetensors", &path)) ||
        (s = ct_save_safetensors(path, ts, names, (size_t)(2 * l->n), mk, mv, 1, NULL)))
        goto done;
    ct_free(path);
    path = NULL;
    json_t *tm = json_array();
    for (int k = 0; k < N_TARGETS; k++)
        if (l->o.targets & TARGETS[k].bit) json_array_append_new(tm, json_string(TARGETS[k].module));
    char alpha[32];
    snprintf(alpha, sizeof alpha, "%.9g", (double)l->o.alpha);
    json_t *j = json_object();
    json_object_set_new(j, "base_model_name_or_path",
                        base_model ? json_string(base_model) : json_null());
    json_object_set_new(j, "bias", json_string("none"));
    json_object_set_new(j, "fan_in_fan_out", json_false());
    json_object_set_new(j, "inference_mode", json_true());
    json_object_set_new(j, "init_lora_weights", json_true());
    double a = strtod(alpha, NULL);
    json_object_set_new(j, "lora_alpha", a == floor(a) && fabs(a) < 1e15 ? json_integer((json_int_t)a)
                                                                          : json_real(a));
    json_object_set_new(j, "lora_dropout", json_real(0.0));
    json_object_set_new(j, "modules_to_save", json_null());
    json_object_set_new(j, "peft_type", json_string("LORA"));
    json_object_set_new(j, "r", json_integer((json_int_t)l->o.rank));
    json_object_set_new(j, "target_modules", tm);
    json_object_set_new(j, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(j, "use_rslora", json_false());
    json_object_set_new(j, "use_dora", json_false());
    char *txt = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(9));
    json_decref(j);
    if (!txt) {
        s = ct_error(CT_ENOMEM, "%s: out of memory", fn);
        goto done;
    }
    if ((s = hf_join(dir, "adapter_config.json", &path)) == CT_OK)
        s = hf_write_atomic(path, txt, strlen(txt));
    free(txt);
done:
    ct_free(path);
    ct_free(names);
    ct_free(ts);
    return s;
}

/* Keys of adapter_config.json accepted when they hold their "nothing" value. */
static bool harmless(const char *key, const json_t *v)
{
    static const char *any[] = {"base_model_name_or_path", "inference_mode", "init_lora_weights",
                                "revision", "auto_mapping", "lora_dropout", "peft_version"};
    for (size_t i = 0; i < sizeof any / sizeof any[0]; i++)
        if (!strcmp(key, any[i])) return true;
    static const char *empty[] = {"rank_pattern",   "alpha_pattern",   "modules_to_save",
                                  "layers_to_transform", "layers_pattern", "megatron_config",
                                  "loftq_config",  "layer_replication", "exclude_modules",
                                  "megatron_core", "runtime_config",  "eva_config",
                                  "corda_config",  "trainable_token_indices", "target_parameters",
                                  "qalora_group_size", "use_qalora", "lora_bias",
                                  "fan_in_fan_out", "use_dora",
                                  /* peft 0.21's variants, off */
                                  "alora_invocation_tokens", "arrow_config", "ensure_weight_tying",
                                  "kasa_config", "lora_ga_config", "monteclora_config",
                                  "use_bdlora", "velora_config"};
    for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++)
        if (!strcmp(key, empty[i]))
            return json_is_null(v) || json_is_false(v) ||
                   (json_is_object(v) && json_object_size(v) == 0) ||
                   (json_is_array(v) && json_array_size(v) == 0) ||
                   (json_is_string(v) && !strcmp(key, "megatron_core")) ||
                   (json_is_integer(v) && !strcmp(key, "qalora_group_size"));
    return false;
}

/* Parse adapter_config.json text: rank, alpha, targets bits, rslora. */
ct_status lora_parse_config(const char *text, size_t len, int64_t *rank, double *alpha,
                                      uint32_t *targets, bool *rslora)
{
    const char *what = "adapter_config.json";
    json_error_t err;
    json_t *j = hf_json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!j) return ct_error(CT_EFORMAT, "%s: not JSON (line %d: %s)", what, err.line, err.text);
    ct_status s = CT_OK;
    *rank = 0;
    *alpha = 0;
    *targets = 0;
    *rslora = false;
    const char *key;
    json_t *v;
    if (!json_is_object(j)) {
        s = ct_error(CT_EFORMAT, "%s: must be a JSON object", what);
        goto done;
    }
    json_object_foreach(j, key, v)
    {
        if (!strcmp(key, "r")) {
            if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 4096) {
                s = ct_error(CT_EFORMAT, "%s: \"r\" must be an integer in [1, 4096]", what);
                goto done;
            }
            *rank = (int64_t)json_integer_value(v);
        } else if (!strcmp(key, "lora_alpha")) {
            if (!json_is_number(v) || !(json_number_value(v) > 0) ||
                !isfinite(json_number_value(v)) || json_number_value(v) > 1e9) {
                s = ct_error(CT_EFORMAT, "%s: \"lora_alpha\" must be a number > 0", what);
                goto done;
            }
            *alpha = json_number_value(v);
        } else if (!strcmp(key, "target_modules")) {
            if (!json_is_array(v) || json_array_size(v) == 0) {
                s = ct_error(CT_EUNSUPPORTED,
                             "%s: \"target_modules\" must be a non-empty list of module names (a "
                             "regex string is not supported)",
                             what);
                goto done;
            }
            for (size_t i = 0; i < json_array_size(v); i++) {
                const json_t *e = json_array_get(v, i);
                int k = -1;
                for (int q = 0; q < N_TARGETS && json_is_string(e) && k < 0; q++)
                    if (!strcmp(json_string_value(e), TARGETS[q].module)) k = q;
                if (k < 0) {
                    s = ct_error(CT_EUNSUPPORTED,
                                 "%s: \"target_modules\" entry %s is not one of q_proj, k_proj, "
                                 "v_proj, o_proj, gate_proj, up_proj, down_proj",
                                 what, json_is_string(e) ? json_string_value(e) : "(not a string)");
                    goto done;
                }
                *targets |= TARGETS[k].bit;
            }
        } else if (!strcmp(key, "bias")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "none")) {
                s = ct_error(CT_EUNSUPPORTED, "%s: \"bias\" must be \"none\"", what);
                goto done;
            }
        } else if (!strcmp(key, "task_type")) {
            if (!json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "CAUSAL_LM"))) {
                s = ct_error(CT_EUNSUPPORTED, "%s: \"task_type\" must be \"CAUSAL_LM\"", what);
                goto done;
            }
        } else if (!strcmp(key, "peft_type")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "LORA")) {
                s = ct_error(CT_EUNSUPPORTED, "%s: \"peft_type\" must be \"LORA\"", what);
                goto done;
            }
        } else if (!strcmp(key, "use_rslora")) {
            if (!json_is_boolean(v)) {
                s = ct_error(CT_EFORMAT, "%s: \"use_rslora\" must be true or false", what);
                goto done;
            }
            *rslora = json_is_true(v);
        } else if (!harmless(key, v)) {
            s = ct_error(CT_EUNSUPPORTED, "%s: key \"%s\" is unknown or holds a value ctorch does "
                         "not implement", what, key);
            goto done;
        }
    }
    if (!*rank || !*alpha || !*targets)
        s = ct_error(CT_EFORMAT, "%s: \"%s\" is missing", what,
                     !*rank ? "r" : !*alpha ? "lora_alpha" : "target_modules");
done:
    json_decref(j);
    return s;
}

/* Which (target, layer, A or B) a PEFT tensor name is; false when it is none. */
static bool parse_adapter_name(const char *name, int64_t n_layer, int *target, int64_t *layer,
                               bool *is_b)
{
    const char *pre = "base_model.model.model.layers.";
    size_t pn = strlen(pre);
    if (strncmp(name, pre, pn) || name[pn] < '0' || name[pn] > '9' ||
        (name[pn] == '0' && name[pn + 1] != '.'))
        return false;
    char *end;
    errno = 0;
    long long L = strtoll(name + pn, &end, 10);
    if (errno || *end != '.' || L >= n_layer) return false;
    for (int k = 0; k < N_TARGETS; k++) {
        size_t hn = strlen(TARGETS[k].hf_part);
        if (strncmp(end + 1, TARGETS[k].hf_part, hn)) continue;
        const char *rest = end + 1 + hn;
        if (!strcmp(rest, ".lora_A.weight") || !strcmp(rest, ".lora_B.weight")) {
            *target = k;
            *layer = L;
            *is_b = rest[6] == 'B';
            return true;
        }
    }
    return false;
}

static bool lora_float_dtype(const ct_tensor_info *x)
{
    return x->has_dtype && (x->dtype == CT_DTYPE_F32 || x->dtype == CT_DTYPE_BF16 ||
                            x->dtype == CT_DTYPE_F16 || x->dtype == CT_DTYPE_F64);
}

/* Every value of an adapter read as f32 (x->numel of them) is finite: merging a NaN or an
 * infinity would spoil the whole weight (PEFT's merge(safe_merge=True) refuses it too). */
static ct_status lora_values_ok(const char *dir, const ct_tensor_info *x, const float *v)
{
    for (uint64_t i = 0; i < x->numel; i++)
        if (!isfinite(v[i])) {
            int64_t cols = x->ndim == 2 ? x->shape[1] : 1;
            return ct_error(CT_EFORMAT,
                            "%s: adapter '%s' holds %s at [%lld, %lld]: a broken adapter (merging "
                            "it would make the weight non-finite); nothing was merged",
                            dir, x->name, isnan(v[i]) ? "NaN" : "an infinity",
                            (long long)(i / (uint64_t)cols), (long long)(i % (uint64_t)cols));
        }
    return CT_OK;
}

/* W += s B A as PEFT merges (delta = s (B A), then W + delta), 64 rows of the delta at a time.
 * apply false: only check that no finite weight becomes NaN or infinite (finite adapters can
 * still overflow: PEFT's safe_merge refuses that too); the delta is computed the same way both
 * times (ct_gemm_f32 is deterministic), so what was checked is what is added. */
static ct_status lora_delta(const char *dir, const char *name, const adapter *a, int64_t rank,
                            float scale, const float *a32, const float *b32, bool apply)
{
    enum { ROWS = 64 };
    float *tmp;
    CT_TRY(ct_alloc((void **)&tmp, (size_t)(ROWS * a->in) * sizeof(float)));
    ct_status s = CT_OK;
    int64_t row0 = TARGETS[a->target].half == 2 ? a->out : 0; /* up_proj: w_gate_up's 2nd half */
    for (int64_t o = 0; o < a->out && !s; o += ROWS) {
        int64_t n = a->out - o < ROWS ? a->out - o : ROWS;
        if ((s = ct_gemm_f32(false, false, n, a->in, rank, scale, b32 + o * rank, rank, a32, a->in,
                             0.0f, tmp, a->in)))
            break;
        float *w = a->w + o * a->in;
        for (int64_t k = 0; k < n * a->in; k++) {
            if (apply) {
                w[k] += tmp[k];
            } else if (isfinite(w[k]) && !isfinite(w[k] + tmp[k])) {
                s = ct_error(CT_EFORMAT,
                             "%s: adapter '%s' would make '%s' non-finite at [%lld, %lld] (%g + "
                             "%g): a broken adapter; nothing was merged",
                             dir, name, a->ct, (long long)(row0 + o + k / a->in),
                             (long long)(k % a->in),
                             (double)w[k], (double)tmp[k]);
                break;
            }
        }
    }
    ct_free(tmp);
    return s;
}

ct_status ct_lora_merge(ct_gpt *m, const char *dir, int *n_merged)
{
    const char *fn = "ct_lora_merge";
    if (!m || !dir) return ct_error(CT_EINVAL, "%s: m and dir must not be NULL", fn);
    if (m->mapped) return ct_error(CT_EINVAL, "%s: the model's weights are mapped", fn);
    char *path = NULL, *text = NULL;
    size_t len;
    int64_t rank = 0;
    double alpha = 0;
    uint32_t targets = 0;
    bool rslora = false;
    ct_tensor_file *f = NULL;
    float *a32 = NULL, *b32 = NULL;
    bool *seen = NULL;
    ct_status s;
    if ((s = hf_join(dir, "adapter_config.json", &path)) ||
        (s = hf_read_text(path, HF_CONFIG_MAX, &text, &len)))
        goto done;
    if ((s = lora_parse_config(text, len, &rank, &alpha, &targets, &rslora))) {
        s = ct_error_wrap(s, "%s", dir);
        goto done;
    }
    ct_free(path);
    path = NULL;
    if ((s = hf_join(dir, "adapter_model.safetensors", &path))) goto done;
    ct_load_options lo = ct_load_options_default();
    lo.format = CT_FORMAT_SAFETENSORS;
    if ((s = ct_load(path, &lo, &f))) goto done;
    float scale = (float)(rslora ? alpha / sqrt((double)rank) : alpha / (double)rank);
    size_t nt = ct_tensor_file_count(f);
    if ((s = ct_calloc((void **)&seen, (nt ? nt : 1) * sizeof(bool)))) goto done;
    int merged = 0;
    /* pass 0 checks every adapter (names, partners, shapes, a float dtype, finite values) and
     * pass 1 merges: a bad adapter leaves the weights as they were */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < nt; i++) {
            ct_tensor_info in;
            if ((s = ct_tensor_file_info(f, i, &in))) goto done;
            int k;
            int64_t L;
            bool isb;
            if (!parse_adapter_name(in.name, m->cfg.n_layer, &k, &L, &isb) ||
                !(targets & TARGETS[k].bit)) {
                s = ct_error(CT_EFORMAT,
                             "%s/adapter_model.safetensors: tensor '%s' is not a LoRA adapter of this "
                             "model's target_modules",
                             dir, in.name);
                goto done;
            }
            if (isb) continue;
            /* its partner B */
            adapter a;
            memset(&a, 0, sizeof a);
            if ((s = locate(m, k, L, &a))) goto done;
            size_t ib;
            if (ct_tensor_file_find(f, a.name_b, &ib) != CT_OK) {
                s = ct_error(CT_EFORMAT, "%s: adapter '%s' has no '%s'", dir, in.name, a.name_b);
                goto done;
            }
            ct_tensor_info bi;
            if ((s = ct_tensor_file_info(f, ib, &bi))) goto done;
            if (in.ndim != 2 || in.shape[0] != rank || in.shape[1] != a.in || bi.ndim != 2 ||
                bi.shape[0] != a.out || bi.shape[1] != rank) {
                s = ct_error(CT_EFORMAT,
                             "%s: adapter '%s' must be A [%lld, %lld] and B [%lld, %lld] (r = %lld)",
                             dir, in.name, (long long)rank, (long long)a.in, (long long)a.out,
                             (long long)rank, (long long)rank);
                goto done;
            }
            for (int q = 0; q < 2; q++) {
                const ct_tensor_info *x = q ? &bi : &in;
                if (!lora_float_dtype(x)) {
                    s = ct_error(CT_EFORMAT,
                                 "%s: adapter '%s' is %s: LoRA adapters must hold floats (F32, "
                                 "BF16, F16 or F64); an integer adapter is not a trained one",
                                 dir, x->name, ct_st_dtype_name(x->st_dtype));
                    goto done;
                }
            }
            int64_t as[2] = {rank, a.in}, bs[2] = {a.out, rank};
            ct_tensor ta, tb;
            if ((s = ct_alloc((void **)&a32, (size_t)(rank * a.in) * sizeof(float))) ||
                (s = ct_alloc((void **)&b32, (size_t)(a.out * rank) * sizeof(float))) ||
                (s = ct_tensor_wrap(&ta, a32, CT_DTYPE_F32, 2, as, NULL)) ||
                (s = ct_tensor_wrap(&tb, b32, CT_DTYPE_F32, 2, bs, NULL)) ||
                (s = ct_tensor_file_read_into(f, i, &ta)) || (s = ct_tensor_file_read_into(f, ib, &tb)))
                goto done;
            if (!pass) {
                if ((s = lora_values_ok(dir, &in, a32)) || (s = lora_values_ok(dir, &bi, b32)) ||
                    (s = lora_delta(dir, in.name, &a, rank, scale, a32, b32, false)))
                    goto done;
                seen[i] = seen[ib] = true;
            } else {
                if ((s = lora_delta(dir, in.name, &a, rank, scale, a32, b32, true))) goto done;
                merged++;
            }
            ct_free(a32);
            ct_free(b32);
            a32 = b32 = NULL;
        }
        if (!pass)
            for (size_t i = 0; i < nt; i++)
                if (!seen[i]) {
                    ct_tensor_info in;
                    ct_tensor_file_info(f, i, &in);
                    s = ct_error(CT_EFORMAT, "%s: '%s' has no lora_A partner", dir, in.name);
                    goto done;
                }
    }
    if (!merged) {
        s = ct_error(CT_EFORMAT, "%s/adapter_model.safetensors holds no adapters", dir);
        goto done;
    }
    if (n_merged) *n_merged = merged;
done:
    ct_free(a32);
    ct_free(b32);
    ct_free(seen);
    ct_tensor_file_close(f);
    ct_free(path);
    ct_free(text);
    return s;
}
