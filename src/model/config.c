/* Model configuration: defaults, rules, JSON. */
#include "core/internal.h"
#include "ctorch/model.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

ct_gpt_config ct_gpt_config_default(void)
{
    ct_gpt_config c = {32768, 128, 4, 128, 4, 2, 384, 10000.0f, 0, true, 1e-5f, 0.0f};
    return c;
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
    if (c->d_model < 2 || c->d_model > (1 << 16) || c->d_model % c->n_head)
        return ct_error(CT_EINVAL,
                        "%s: d_model must be a multiple of n_head = %lld in [2, 65536], got %lld",
                        fn, (long long)c->n_head, (long long)c->d_model);
    if ((c->d_model / c->n_head) % 2)
        return ct_error(
            CT_EINVAL, "%s: the head dim d_model / n_head = %lld must be even (RoPE rotates pairs)",
            fn, (long long)(c->d_model / c->n_head));
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
    return CT_OK;
}

ct_status ct_gpt_config_to_json(const ct_gpt_config *c, char **json)
{
    if (!c || !json)
        return ct_error(CT_EINVAL, "ct_gpt_config_to_json: arguments must not be NULL");
    json_t *j = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:I, s:b, s:f, s:f}", "vocab_size",
        (json_int_t)c->vocab_size, "context", (json_int_t)c->context, "n_layer",
        (json_int_t)c->n_layer, "d_model", (json_int_t)c->d_model, "n_head", (json_int_t)c->n_head,
        "n_kv_head", (json_int_t)c->n_kv_head, "d_ff", (json_int_t)c->d_ff, "rope_base",
        (double)c->rope_base, "window", (json_int_t)c->window, "tied", (int)c->tied, "norm_eps",
        (double)c->norm_eps, "init_std", (double)c->init_std);
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
                                 "n_head",     "n_kv_head", "d_ff",    "window"};
    int64_t *iv[] = {&c->vocab_size, &c->context,   &c->n_layer, &c->d_model,
                     &c->n_head,     &c->n_kv_head, &c->d_ff,    &c->window};
    static const char *floats[] = {"rope_base", "norm_eps", "init_std"};
    float *fv[] = {&c->rope_base, &c->norm_eps, &c->init_std};
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
        if (!known && !strcmp(key, "tied")) {
            known = true;
            if (!json_is_boolean(val))
                s = ct_error(CT_EFORMAT, "gpt config: \"tied\" must be true or false");
            else
                c->tied = json_is_true(val);
        }
        if (!known && s == CT_OK)
            s = ct_error(
                CT_EFORMAT,
                "gpt config: unknown key \"%s\" (keys: vocab_size, context, n_layer, "
                "d_model, n_head, n_kv_head, d_ff, rope_base, window, tied, norm_eps, init_std)",
                key);
        if (s) break;
    }
    json_decref(j);
    CT_TRY(s);
    return ct_gpt_config_check(c);
}
