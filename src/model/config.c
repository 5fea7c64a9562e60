/* Model configuration: defaults, rules, JSON. */
#include "core/internal.h"
#include "ctorch/model.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

ct_gpt_config ct_gpt_config_default(void)
{
    ct_gpt_config c = {32768, 128, 4, 128, 4, 2, 384, 10000.0f, 0, true, 1e-5f, 0.0f,
                       0,     false, false, CT_ROPE_SCALING_NONE, 1.0f, 1.0f, 4.0f, 8192,
                       "",    ""};
    return c;
}

int64_t ct_gpt_head_dim(const ct_gpt_config *c)
{
    return c->head_dim ? c->head_dim : c->d_model / (c->n_head ? c->n_head : 1);
}

static const char *SCALING[] = {"none", "linear", "llama3"};

ct_status ct_gpt_rope_inv_freq(const ct_gpt_config *c, float *inv_freq)
{
    CT_TRY(ct_gpt_config_check(c));
    if (!inv_freq) return ct_error(CT_EINVAL, "ct_gpt_rope_inv_freq: inv_freq must not be NULL");
    int64_t E = ct_gpt_head_dim(c), P = E / 2;
    /* as Hugging Face: 1 / base ** (arange(0, E, 2).float() / E), all in f32 */
    for (int64_t i = 0; i < P; i++)
        inv_freq[i] = 1.0f / powf(c->rope_base, (float)(2 * i) / (float)E);
    if (c->rope_scaling == CT_ROPE_SCALING_LINEAR) {
        for (int64_t i = 0; i < P; i++)
            inv_freq[i] = inv_freq[i] / c->rope_factor;
    } else if (c->rope_scaling == CT_ROPE_SCALING_LLAMA3) {
        /* HF computes the wavelengths and bounds in f32 tensors against Python floats */
        float factor = c->rope_factor, lo = c->rope_low_freq_factor,
              hi = c->rope_high_freq_factor, old = (float)c->rope_original_context;
        double lo_wave = (double)c->rope_original_context / lo,
               hi_wave = (double)c->rope_original_context / hi;
        const float two_pi = (float)(2.0 * 3.14159265358979323846);
        for (int64_t i = 0; i < P; i++) {
            float f = inv_freq[i], wave = two_pi / f;
            float scaled = (double)wave > lo_wave ? f / factor : f;
            if (!((double)wave < hi_wave) && !((double)wave > lo_wave)) {
                float sm = (old / wave - lo) / (hi - lo);
                scaled = (1.0f - sm) * scaled / factor + sm * scaled;
            }
            inv_freq[i] = scaled;
        }
    }
    return CT_OK;
}

ct_status ct_gpt_config_check(const ct_gpt_config *c)
{
    const char *fn = "gpt config";
    if (!c) return ct_error(CT_EINVAL, "%s: cfg must not be NULL", fn);
    if (c->vocab_size < 2 || c->vocab_size > INT32_MAX)
        return ct_error(CT_EINVAL, "%s: vocab_size must be in [2, 2^31), got %lld", fn,
                        (long long)c->vocab_size);
    if (c->context < 1 || c->context > (1 << 20))
        return ct_error(CT_EINVAL, "%s: context must be in [1, 2^20], got %lld", fn,
                        (long long)c->context);
    if (c->n_layer < 1 || c->n_layer > 1024)
        return ct_error(CT_EINVAL, "%s: n_layer must be in [1, 1024], got %lld", fn,
                        (long long)c->n_layer);
    if (c->n_head < 1 || c->n_head > 1024)
        return ct_error(CT_EINVAL, "%s: n_head must be in [1, 1024], got %lld", fn,
                        (long long)c->n_head);
    if (c->head_dim < 0 || c->head_dim > 4096 || c->head_dim % 2)
        return ct_error(CT_EINVAL,
                        "%s: head_dim must be even in [0, 4096] (0: d_model / n_head), got %lld",
                        fn, (long long)c->head_dim);
    if (c->d_model < 2 || c->d_model > (1 << 16) || (!c->head_dim && c->d_model % c->n_head))
        return ct_error(CT_EINVAL,
                        "%s: d_model must be a multiple of n_head = %lld in [2, 65536], got %lld",
                        fn, (long long)c->n_head, (long long)c->d_model);
    if ((c->d_model / c->n_head) % 2 && !c->head_dim)
        return ct_error(
            CT_EINVAL, "%s: the head dim d_model / n_head = %lld must be even (RoPE rotates pairs)",
            fn, (long long)(c->d_model / c->n_head));
    if (ct_gpt_head_dim(c) < 2)
        return ct_error(CT_EINVAL, "%s: the head dim must be >= 2, got %lld", fn,
                        (long long)ct_gpt_head_dim(c));
    if (c->n_kv_head < 1 || c->n_head % c->n_kv_head)
        return ct_error(CT_EINVAL, "%s: n_kv_head must divide n_head = %lld, got %lld", fn,
                        (long long)c->n_head, (long long)c->n_kv_head);
    if (c->d_ff < 1 || c->d_ff > (1 << 20))
        return ct_error(CT_EINVAL, "%s: d_ff must be in [1, 2^20], got %lld", fn,
                        (long long)c->d_ff);
    if (!(c->rope_base > 0) || !isfinite(c->rope_base))
        return ct_error(CT_EINVAL, "%s: rope_base must be > 0 and finite, got %g", fn,
                        c->rope_base);
    if (c->window < 0)
        return ct_error(CT_EINVAL, "%s: window must be >= 0 (0: full causal), got %lld", fn,
                        (long long)c->window);
    if (!(c->norm_eps > 0) || !isfinite(c->norm_eps))
        return ct_error(CT_EINVAL, "%s: norm_eps must be > 0, got %g", fn, c->norm_eps);
    if (!(c->init_std >= 0) || !isfinite(c->init_std))
        return ct_error(CT_EINVAL, "%s: init_std must be >= 0 (0: 1 / sqrt(d_model)), got %g", fn,
                        c->init_std);
    if (c->rope_scaling < CT_ROPE_SCALING_NONE || c->rope_scaling > CT_ROPE_SCALING_LLAMA3)
        return ct_error(CT_EINVAL, "%s: rope_scaling must be 0 (none), 1 (linear) or 2 (llama3), "
                        "got %d", fn, (int)c->rope_scaling);
    if (!(c->rope_factor > 0) || !isfinite(c->rope_factor))
        return ct_error(CT_EINVAL, "%s: rope_factor must be > 0 and finite, got %g", fn,
                        c->rope_factor);
    if (!(c->rope_low_freq_factor > 0) || !isfinite(c->rope_high_freq_factor) ||
        !(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return ct_error(CT_EINVAL,
                        "%s: rope_low_freq_factor and rope_high_freq_factor must be finite with "
                        "0 < low < high, got %g and %g",
                        fn, c->rope_low_freq_factor, c->rope_high_freq_factor);
    if (c->rope_original_context < 1 || c->rope_original_context > (1 << 30))
        return ct_error(CT_EINVAL, "%s: rope_original_context must be in [1, 2^30], got %lld", fn,
                        (long long)c->rope_original_context);
    if (!memchr(c->score_mod, '\0', sizeof c->score_mod) ||
        !memchr(c->mask_mod, '\0', sizeof c->mask_mod))
        return ct_error(CT_EINVAL, "%s: score_mod and mask_mod must be strings of < %d bytes", fn,
                        CT_GPT_MOD_MAX);
    if (c->mask_mod[0] && c->window)
        return ct_error(CT_EINVAL, "%s: mask_mod is exclusive with window (write the window into "
                        "the mask: q - kv <= W)", fn);
    return CT_OK;
}

ct_status ct_gpt_config_to_json(const ct_gpt_config *c, char **json)
{
    if (!c || !json)
        return ct_error(CT_EINVAL, "ct_gpt_config_to_json: arguments must not be NULL");
    if (c->rope_scaling < 0 || c->rope_scaling > 2)
        return ct_error(CT_EINVAL, "ct_gpt_config_to_json: rope_scaling %d is not 0, 1 or 2",
                        (int)c->rope_scaling);
    json_t *j = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:b, s:f, s:f}", "vocab_size",
        (json_int_t)c->vocab_size, "context", (json_int_t)c->context, "n_layer",
        (json_int_t)c->n_layer, "d_model", (json_int_t)c->d_model, "n_head", (json_int_t)c->n_head,
        "n_kv_head", (json_int_t)c->n_kv_head, "d_ff", (json_int_t)c->d_ff, "rope_base",
        (double)c->rope_base, "window", (json_int_t)c->window, "tied", (int)c->tied, "norm_eps",
        (double)c->norm_eps, "init_std", (double)c->init_std);
    /* the keys added with Hugging Face models, written only when they differ from the defaults
     * so the configurations of older checkpoints keep their JSON text */
    ct_gpt_config d = ct_gpt_config_default();
    if (j && c->head_dim != d.head_dim)
        json_object_set_new(j, "head_dim", json_integer((json_int_t)c->head_dim));
    if (j && c->qkv_bias) json_object_set_new(j, "qkv_bias", json_true());
    if (j && c->o_bias) json_object_set_new(j, "o_bias", json_true());
    if (j && c->score_mod[0] && memchr(c->score_mod, '\0', sizeof c->score_mod))
        json_object_set_new(j, "score_mod", json_string(c->score_mod));
    if (j && c->mask_mod[0] && memchr(c->mask_mod, '\0', sizeof c->mask_mod))
        json_object_set_new(j, "mask_mod", json_string(c->mask_mod));
    if (j && c->rope_scaling != d.rope_scaling) {
        json_object_set_new(j, "rope_scaling", json_string(SCALING[c->rope_scaling]));
        json_object_set_new(j, "rope_factor", json_real((double)c->rope_factor));
        if (c->rope_scaling == CT_ROPE_SCALING_LLAMA3) {
            json_object_set_new(j, "rope_low_freq_factor",
                                json_real((double)c->rope_low_freq_factor));
            json_object_set_new(j, "rope_high_freq_factor",
                                json_real((double)c->rope_high_freq_factor));
            json_object_set_new(j, "rope_original_context",
                                json_integer((json_int_t)c->rope_original_context));
        }
    }
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(j);
    if (!s) return ct_error(CT_ENOMEM, "ct_gpt_config_to_json: out of memory");
    size_t n = strlen(s);
    ct_status st = ct_alloc((void **)json, n + 1);
    if (st == CT_OK) memcpy(*json, s, n + 1);
    free(s);
    return st;
}

ct_status ct_gpt_config_from_json(const char *text, ct_gpt_config *c)
{
    if (!text || !c)
        return ct_error(CT_EINVAL, "ct_gpt_config_from_json: arguments must not be NULL");
    json_error_t err;
    json_t *j = json_loads(text, 0, &err);
    if (!j) return ct_error(CT_EFORMAT, "gpt config: not JSON (line %d: %s)", err.line, err.text);
    if (!json_is_object(j)) {
        json_decref(j);
        return ct_error(CT_EFORMAT, "gpt config: must be a JSON object");
    }
    static const char *ints[] = {"vocab_size", "context",   "n_layer", "d_model",
                                 "n_head",     "n_kv_head", "d_ff",    "window",
                                 "head_dim",   "rope_original_context"};
    int64_t *iv[] = {&c->vocab_size, &c->context,   &c->n_layer, &c->d_model,
                     &c->n_head,     &c->n_kv_head, &c->d_ff,    &c->window,
                     &c->head_dim,   &c->rope_original_context};
    static const char *floats[] = {"rope_base",   "norm_eps",
                                   "init_std",    "rope_factor",
                                   "rope_low_freq_factor", "rope_high_freq_factor"};
    float *fv[] = {&c->rope_base,   &c->norm_eps,
                   &c->init_std,    &c->rope_factor,
                   &c->rope_low_freq_factor, &c->rope_high_freq_factor};
    static const char *bools[] = {"tied", "qkv_bias", "o_bias"};
    bool *bv[] = {&c->tied, &c->qkv_bias, &c->o_bias};
    const char *key;
    json_t *val;
    ct_status s = CT_OK;
    json_object_foreach(j, key, val)
    {
        bool known = false;
        for (size_t i = 0; i < sizeof ints / sizeof ints[0] && !known; i++)
            if (!strcmp(key, ints[i])) {
                known = true;
                if (!json_is_integer(val)) {
                    s = ct_error(CT_EFORMAT, "gpt config: \"%s\" must be an integer", key);
                    break;
                }
                *iv[i] = (int64_t)json_integer_value(val);
            }
        for (size_t i = 0; i < sizeof floats / sizeof floats[0] && !known; i++)
            if (!strcmp(key, floats[i])) {
                known = true;
                if (!json_is_number(val)) {
                    s = ct_error(CT_EFORMAT, "gpt config: \"%s\" must be a number", key);
                    break;
                }
                *fv[i] = (float)json_number_value(val);
            }
        for (size_t i = 0; i < sizeof bools / sizeof bools[0] && !known; i++)
            if (!strcmp(key, bools[i])) {
                known = true;
                if (!json_is_boolean(val))
                    s = ct_error(CT_EFORMAT, "gpt config: \"%s\" must be true or false", key);
                else
                    *bv[i] = json_is_true(val);
            }
        if (!known && (!strcmp(key, "score_mod") || !strcmp(key, "mask_mod"))) {
            known = true;
            char *dst = key[0] == 's' ? c->score_mod : c->mask_mod;
            if (!json_is_string(val) || json_string_length(val) >= CT_GPT_MOD_MAX ||
                strlen(json_string_value(val)) != json_string_length(val))
                s = ct_error(CT_EFORMAT, "gpt config: \"%s\" must be a string of < %d bytes", key,
                             CT_GPT_MOD_MAX);
            else
                memcpy(dst, json_string_value(val), json_string_length(val) + 1);
        }
        if (!known && !strcmp(key, "rope_scaling")) {
            known = true;
            int found = -1;
            for (int i = 0; i < 3 && json_is_string(val); i++)
                if (!strcmp(json_string_value(val), SCALING[i])) found = i;
            if (found < 0)
                s = ct_error(CT_EFORMAT,
                             "gpt config: \"rope_scaling\" must be \"none\", \"linear\" or "
                             "\"llama3\"");
            else
                c->rope_scaling = found;
        }
        if (!known && s == CT_OK)
            s = ct_error(
                CT_EFORMAT,
                "gpt config: unknown key \"%s\" (keys: vocab_size, context, n_layer, "
                "d_model, n_head, n_kv_head, d_ff, rope_base, window, tied, norm_eps, init_std, "
                "head_dim, qkv_bias, o_bias, rope_scaling, rope_factor, rope_low_freq_factor, "
                "rope_high_freq_factor, rope_original_context, score_mod, mask_mod)",
                key);
        if (s) break;
    }
    json_decref(j);
    CT_TRY(s);
    return ct_gpt_config_check(c);
}
