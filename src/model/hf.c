/* Hugging Face Llama-family directories (include/ctorch/model.h): config.json, the index of
 * shards, tensor names, loading (copies or mapped views) and saving. */
#include "core/strmap.h"
#include "model/gpt_internal.h"
#include "model/hf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- small helpers ------------------------------------------------------------------------ */

ct_status hf_join(const char *dir, const char *name, char **path)
{
    size_t a = strlen(dir), b = strlen(name), n;
    if (!ct_add_size(a, b + 2, &n)) return ct_error(CT_EOVERFLOW, "path of '%s' overflows", name);
    CT_TRY(ct_alloc((void **)path, n));
    snprintf(*path, n, "%s%s%s", dir, (a && dir[a - 1] == '/') ? "" : "/", name);
    return CT_OK;
}

ct_status hf_read_text(const char *path, size_t max, char **buf, size_t *len)
{
    return ct_file_read_all(path, "JSON file", max, buf, len);
}

ct_status hf_write_atomic(const char *path, const char *data, size_t len)
{
    size_t n = strlen(path) + 48;
    char *tmp;
    CT_TRY(ct_alloc((void **)&tmp, n));
    snprintf(tmp, n, "%s.ctorch-tmp.%ld", path, (long)getpid());
    ct_status s = CT_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        s = ct_error(CT_EIO, "cannot create '%s': %s", tmp, strerror(errno));
        ct_free(tmp);
        return s;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            s = ct_error(CT_EIO, "writing '%s': %s", tmp, strerror(errno));
            break;
        }
        done += (size_t)w;
    }
    if (s == CT_OK && fsync(fd) != 0)
        s = ct_error(CT_EIO, "fsync of '%s': %s", tmp, strerror(errno));
    if (close(fd) != 0 && s == CT_OK)
        s = ct_error(CT_EIO, "closing '%s': %s", tmp, strerror(errno));
    if (s == CT_OK && rename(tmp, path) != 0)
        s = ct_error(CT_EIO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(errno));
    if (s) unlink(tmp);
    ct_free(tmp);
    return s;
}

static bool plain_int(const json_t *v)
{
    return json_is_integer(v);
}

json_t *hf_json_loadb(const char *text, size_t len, size_t flags, json_error_t *err)
{
    json_t *j = json_loadb(text, len, flags, err);
    if (j || !text) return j;
    /* Jansson refuses integers beyond int64; Python's json writes them (real files do): retry
     * with every integer literal of more than 18 digits outside strings read as a real (".0"
     * appended), so such a value is "not an integer" where an integer is wanted and harmless
     * elsewhere. The copy grows by at most 2 bytes per 19 of the text. */
    size_t cap = len + 2 * (len / 19) + 1, o = 0;
    char *buf = malloc(cap);
    if (!buf) return NULL;
    bool in_str = false;
    for (size_t i = 0; i < len;) {
        char ch = text[i];
        if (in_str) {
            buf[o++] = ch;
            i++;
            if (ch == '\\' && i < len)
                buf[o++] = text[i++];
            else if (ch == '"')
                in_str = false;
            continue;
        }
        if (ch == '"') {
            in_str = true;
            buf[o++] = text[i++];
            continue;
        }
        if ((ch >= '0' && ch <= '9') || ch == '-') {
            size_t b = i, digits = 0;
            if (text[i] == '-') buf[o++] = text[i++];
            while (i < len && text[i] >= '0' && text[i] <= '9') {
                buf[o++] = text[i++];
                digits++;
            }
            bool is_int = !(i < len && (text[i] == '.' || text[i] == 'e' || text[i] == 'E'));
            if (digits > 18 && is_int && o + 2 < cap) {
                buf[o++] = '.';
                buf[o++] = '0';
            }
            if (i == b) buf[o++] = text[i++];
            continue;
        }
        buf[o++] = text[i++];
    }
    j = json_loadb(buf, o, flags, err);
    free(buf);
    return j;
}

/* An integer value of key in [lo, hi]. */
static ct_status get_int(const json_t *v, const char *what, const char *key, int64_t lo,
                         int64_t hi, int64_t *out)
{
    if (!plain_int(v))
        return ct_error(CT_EFORMAT, "%s: \"%s\" must be an integer", what, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return ct_error(CT_EFORMAT, "%s: \"%s\" must be in [%lld, %lld], got %lld", what, key,
                        (long long)lo, (long long)hi, (long long)x);
    *out = (int64_t)x;
    return CT_OK;
}

/* A finite number > 0 (or >= 0 with zero_ok) that fits a float. */
static ct_status get_pos(const json_t *v, const char *what, const char *key, bool zero_ok,
                         float *out)
{
    if (!json_is_number(v)) return ct_error(CT_EFORMAT, "%s: \"%s\" must be a number", what, key);
    double x = json_number_value(v);
    if (!isfinite(x) || x > 3e38 || x < 0 || (!zero_ok && !((float)x > 0)))
        return ct_error(CT_EFORMAT, "%s: \"%s\" must be a finite number %s 0, got %g", what, key,
                        zero_ok ? ">=" : ">", x);
    *out = (float)x;
    return CT_OK;
}

/* ---- config.json ------------------------------------------------------------------------- */

static const struct {
    const char *arch, *model_type;
    ct_hf_arch id;
} ARCHS[] = {{"LlamaForCausalLM", "llama", CT_HF_LLAMA},
             {"Qwen2ForCausalLM", "qwen2", CT_HF_QWEN2},
             {"MistralForCausalLM", "mistral", CT_HF_MISTRAL}};

/* Keys accepted without effect on the maths. */
static const char *IGNORED[] = {
    "transformers_version", "use_cache",         "initializer_range",    "pad_token_id",
    "_name_or_path",        "pretraining_tp",    "output_attentions",
    "output_hidden_states", "return_dict",       "tokenizer_class",      "_attn_implementation",
    "sep_token_id",         "unk_token_id",      "decoder_start_token_id"};

/* "rope_scaling" (transformers 4) or "rope_parameters" (transformers 5, which also holds
 * "rope_theta", into *theta): the scaling type and its factors into c. */
static ct_status parse_rope(const json_t *rs, const char *what, const char *name, ct_gpt_config *c,
                            float *theta, bool *theta_set)
{
    bool params = !strcmp(name, "rope_parameters");
    if (json_is_null(rs)) return CT_OK;
    if (!json_is_object(rs))
        return ct_error(CT_EFORMAT, "%s: \"%s\" must be an object or null", what, name);
    const json_t *t = json_object_get(rs, "rope_type");
    if (!t) t = json_object_get(rs, "type");
    const char *kind = json_is_string(t) ? json_string_value(t) : NULL;
    if (!kind && !(params && !t))
        return ct_error(CT_EFORMAT, "%s: \"%s\" needs a string \"rope_type\" (or \"type\")", what,
                        name);
    if (!kind) kind = "default"; /* rope_parameters without a type: the default RoPE */
    bool dflt = !strcmp(kind, "default");
    if (dflt && !params) return CT_OK;
    if (dflt)
        c->rope_scaling = CT_ROPE_SCALING_NONE;
    else if (!strcmp(kind, "linear"))
        c->rope_scaling = CT_ROPE_SCALING_LINEAR;
    else if (!strcmp(kind, "llama3"))
        c->rope_scaling = CT_ROPE_SCALING_LLAMA3;
    else
        return ct_error(CT_EUNSUPPORTED,
                        "%s: \"%s\" type \"%s\" is not supported (default, linear, llama3)", what,
                        name, kind);
    bool llama3 = c->rope_scaling == CT_ROPE_SCALING_LLAMA3;
    bool seen[4] = {false, false, false, false};
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)rs, key, v)
    {
        char full[96];
        snprintf(full, sizeof full, "%s.%s", name, key);
        if (!strcmp(key, "rope_type") || !strcmp(key, "type")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), kind))
                return ct_error(CT_EFORMAT, "%s: \"%s\" has two different types", what, name);
        } else if (params && !strcmp(key, "rope_theta")) {
            CT_TRY(get_pos(v, what, full, false, theta));
            *theta_set = true;
        } else if (params && !strcmp(key, "partial_rotary_factor")) {
            if (!json_is_number(v) || json_number_value(v) != 1)
                return ct_error(CT_EUNSUPPORTED, "%s: \"%s\" must be 1", what, full);
        } else if (!dflt && !strcmp(key, "factor")) {
            CT_TRY(get_pos(v, what, full, false, &c->rope_factor));
            seen[0] = true;
        } else if (llama3 && !strcmp(key, "low_freq_factor")) {
            CT_TRY(get_pos(v, what, full, false, &c->rope_low_freq_factor));
            seen[1] = true;
        } else if (llama3 && !strcmp(key, "high_freq_factor")) {
            CT_TRY(get_pos(v, what, full, false, &c->rope_high_freq_factor));
            seen[2] = true;
        } else if (llama3 && !strcmp(key, "original_max_position_embeddings")) {
            CT_TRY(get_int(v, what, full, 1, 1 << 30, &c->rope_original_context));
            seen[3] = true;
        } else {
            return ct_error(CT_EFORMAT, "%s: unknown key \"%s\" for rope type \"%s\"", what, full,
                            kind);
        }
    }
    static const char *need[] = {"factor", "low_freq_factor", "high_freq_factor",
                                 "original_max_position_embeddings"};
    for (int i = 0; i < (dflt ? 0 : llama3 ? 4 : 1); i++)
        if (!seen[i])
            return ct_error(CT_EFORMAT, "%s: \"%s.%s\" is missing", what, name, need[i]);
    if (llama3 && !(c->rope_high_freq_factor > c->rope_low_freq_factor))
        return ct_error(CT_EFORMAT, "%s: \"%s.high_freq_factor\" must exceed low_freq_factor",
                        what, name);
    return CT_OK;
}

static ct_status parse_rope_scaling(const json_t *rs, const char *what, ct_gpt_config *c)
{
    float theta = 0;
    bool set = false;
    return parse_rope(rs, what, "rope_scaling", c, &theta, &set);
}

/* Do two configurations scale RoPE the same way? */
static bool same_scaling(const ct_gpt_config *a, const ct_gpt_config *b)
{
    return a->rope_scaling == b->rope_scaling &&
           (a->rope_scaling == CT_ROPE_SCALING_NONE ||
            (a->rope_factor == b->rope_factor &&
             (a->rope_scaling != CT_ROPE_SCALING_LLAMA3 ||
              (a->rope_low_freq_factor == b->rope_low_freq_factor &&
               a->rope_high_freq_factor == b->rope_high_freq_factor &&
               a->rope_original_context == b->rope_original_context))));
}

/* bos / eos: an integer, null, or (eos) a non-empty list of integers (the first is kept). */
static ct_status get_token(const json_t *v, const char *what, const char *key, int32_t *out)
{
    if (json_is_null(v)) return CT_OK;
    if (json_is_array(v)) {
        if (json_array_size(v) == 0)
            return ct_error(CT_EFORMAT, "%s: \"%s\" must not be an empty list", what, key);
        for (size_t i = 0; i < json_array_size(v); i++)
            if (!json_is_integer(json_array_get(v, i)))
                return ct_error(CT_EFORMAT, "%s: \"%s\" must hold integers", what, key);
        v = json_array_get(v, 0);
    }
    int64_t x = 0;
    CT_TRY(get_int(v, what, key, 0, INT32_MAX, &x));
    *out = (int32_t)x;
    return CT_OK;
}

/* The attention window of config.json as transformers 5.25 applies it, in ctorch's terms.
 * transformers' "sliding_window" = S lets the query at position q see the keys kv with
 * q - S < kv <= q (masking_utils.sliding_window_overlay AND causal): S keys, itself included.
 * ctorch's window W lets it see q - W <= kv <= q: W + 1 keys. So W = S - 1; S = 1 (each token
 * sees itself alone) has no ctorch window (W = 0 is full causal attention). Which layers:
 * MistralForCausalLM windows every layer when sliding_window is an integer (layer_types play no
 * part in its maths); Qwen2ForCausalLM only with use_sliding_window true (else sliding_window is
 * dropped), and then the layers layer_types calls "sliding_attention", or, without layer_types,
 * layers max_window_layers (default 28) and up. ctorch has one window for every layer, so all
 * layers must be windowed or none. */
static ct_status parse_window(ct_hf_arch arch, int64_t n_layer, const json_t *sliding,
                              bool use_sliding, const json_t *max_window,
                              const json_t *layer_types, const char *what, int64_t *window)
{
    *window = 0;
    bool on = sliding && (arch == CT_HF_MISTRAL || (arch == CT_HF_QWEN2 && use_sliding));
    long long S = sliding ? (long long)json_integer_value(sliding) : 0;
    int64_t nwin = 0; /* layers transformers windows */
    if (layer_types) { /* transformers 5: one attention kind per layer */
        if (!json_is_array(layer_types) || (int64_t)json_array_size(layer_types) != n_layer)
            return ct_error(CT_EFORMAT,
                            "%s: \"layer_types\" must be a list of %lld strings (one per layer)",
                            what, (long long)n_layer);
        for (size_t i = 0; i < json_array_size(layer_types); i++) {
            const json_t *e = json_array_get(layer_types, i);
            const char *k = json_is_string(e) ? json_string_value(e) : NULL;
            bool win = k && !strcmp(k, "sliding_attention");
            if (!win && !(k && !strcmp(k, "full_attention")))
                return ct_error(CT_EUNSUPPORTED,
                                "%s: \"layer_types\" entry %zu is %s: only \"full_attention\" and "
                                "\"sliding_attention\" layers are supported",
                                what, i, k ? k : "not a string");
            if (win && arch == CT_HF_LLAMA)
                return ct_error(CT_EUNSUPPORTED,
                                "%s: \"layer_types\" entry %zu is sliding_attention: "
                                "LlamaForCausalLM has no sliding window (only \"full_attention\" "
                                "layers)",
                                what, i);
            nwin += win;
        }
    }
    if (arch == CT_HF_MISTRAL && layer_types && nwin != (on ? n_layer : 0))
        return ct_error(CT_EUNSUPPORTED,
                        "%s: \"layer_types\" has %lld \"sliding_attention\" layers of %lld, but "
                        "MistralForCausalLM applies \"sliding_window\" (%s) to every layer: "
                        "layer_types must say %s for each (per-layer windows are not supported)",
                        what, (long long)nwin, (long long)n_layer, on ? "an integer" : "null",
                        on ? "\"sliding_attention\"" : "\"full_attention\"");
    if (arch == CT_HF_QWEN2 && !on && nwin)
        return ct_error(CT_EFORMAT,
                        "%s: \"layer_types\" has \"sliding_attention\" layers, but there is no "
                        "window (\"use_sliding_window\" is %s, \"sliding_window\" %s): "
                        "transformers cannot run it either",
                        what, use_sliding ? "true" : "false or absent",
                        sliding ? "an integer" : "null or absent");
    if (arch == CT_HF_QWEN2 && on && !layer_types) {
        int64_t mwl = 28; /* Qwen2Config's default */
        if (max_window) {
            if (!plain_int(max_window))
                return ct_error(CT_EFORMAT,
                                "%s: \"max_window_layers\" must be an integer (with "
                                "\"use_sliding_window\" true, the first windowed layer)",
                                what);
            mwl = (int64_t)json_integer_value(max_window);
        }
        nwin = mwl <= 0 ? n_layer : mwl >= n_layer ? 0 : n_layer - mwl;
    }
    if (arch == CT_HF_MISTRAL && on) nwin = n_layer;
    if (!on || nwin == 0) return CT_OK;
    if (nwin != n_layer)
        return ct_error(CT_EUNSUPPORTED,
                        "%s: \"use_sliding_window\" true with \"sliding_window\" = %lld windows %lld "
                        "of the %lld layers (%s): ctorch applies one window to every layer, so all "
                        "layers or none can be windowed (\"max_window_layers\": 0 windows all)",
                        what, S, (long long)nwin, (long long)n_layer,
                        layer_types ? "\"layer_types\"" : "layers from \"max_window_layers\" on");
    if (S < 1)
        return ct_error(CT_EFORMAT,
                        "%s: \"sliding_window\" must be >= 1 (the keys a token sees, itself "
                        "included) or null, got %lld",
                        what, S);
    if (S == 1)
        return ct_error(CT_EUNSUPPORTED,
                        "%s: \"sliding_window\" = 1 (each token sees itself alone) is not "
                        "supported: ctorch's window is sliding_window - 1 earlier tokens, and "
                        "its window 0 means full causal attention",
                        what);
    *window = (int64_t)(S - 1);
    return CT_OK;
}

ct_status ct_hf_config_parse(const char *text, size_t len, ct_gpt_config *c, ct_hf_info *info)
{
    const char *what = "config.json";
    if (!text || !c || !info)
        return ct_error(CT_EINVAL, "ct_hf_config_parse: arguments must not be NULL");
    json_error_t err;
    json_t *j = hf_json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!j) return ct_error(CT_EFORMAT, "%s: not JSON (line %d: %s)", what, err.line, err.text);
    ct_status s = CT_OK;
    *c = ct_gpt_config_default();
    c->window = 0;
    c->init_std = 0;
    c->norm_eps = 1e-6f; /* LlamaConfig's and Qwen2Config's default */
    c->tied = false;
    c->rope_base = 10000.0f;
    info->arch = 0;
    info->dtype = CT_DTYPE_F32;
    info->bos_token = info->eos_token = -1;
    int64_t kv = -1, hd = 0;
    bool have[6] = {false};
    bool sliding_set = false, use_sliding = false, theta_top = false, scaling_set = false;
    const json_t *rope_params = NULL, *layer_types = NULL, *sliding = NULL, *max_window = NULL;
    const char *arch = NULL, *mtype = NULL;
    const char *unknown = NULL; /* the first unknown key: reported once the architecture is known */
    const char *key;
    json_t *v;
    if (!json_is_object(j)) {
        s = ct_error(CT_EFORMAT, "%s: must be a JSON object", what);
        goto done;
    }
    json_object_foreach(j, key, v)
    {
        bool ignored = false;
        for (size_t i = 0; i < sizeof IGNORED / sizeof IGNORED[0]; i++)
            ignored = ignored || !strcmp(key, IGNORED[i]);
        if (ignored) continue;
        if (!strcmp(key, "architectures")) {
            if (!json_is_array(v) || json_array_size(v) != 1 ||
                !json_is_string(json_array_get(v, 0))) {
                s = ct_error(CT_EFORMAT, "%s: \"architectures\" must be a list of one string", what);
                goto done;
            }
            arch = json_string_value(json_array_get(v, 0));
        } else if (!strcmp(key, "model_type")) {
            if (!json_is_string(v)) {
                s = ct_error(CT_EFORMAT, "%s: \"model_type\" must be a string", what);
                goto done;
            }
            mtype = json_string_value(v);
        } else if (!strcmp(key, "hidden_size")) {
            if ((s = get_int(v, what, key, 2, 1 << 16, &c->d_model))) goto done;
            have[0] = true;
        } else if (!strcmp(key, "intermediate_size")) {
            if ((s = get_int(v, what, key, 1, 1 << 20, &c->d_ff))) goto done;
            have[1] = true;
        } else if (!strcmp(key, "num_hidden_layers")) {
            if ((s = get_int(v, what, key, 1, 1024, &c->n_layer))) goto done;
            have[2] = true;
        } else if (!strcmp(key, "num_attention_heads")) {
            if ((s = get_int(v, what, key, 1, 1024, &c->n_head))) goto done;
            have[3] = true;
        } else if (!strcmp(key, "vocab_size")) {
            if ((s = get_int(v, what, key, 2, INT32_MAX, &c->vocab_size))) goto done;
            have[4] = true;
        } else if (!strcmp(key, "max_position_embeddings")) {
            if ((s = get_int(v, what, key, 1, 1 << 20, &c->context))) goto done;
            have[5] = true;
        } else if (!strcmp(key, "num_key_value_heads")) {
            if (!json_is_null(v) && (s = get_int(v, what, key, 1, 1024, &kv))) goto done;
        } else if (!strcmp(key, "head_dim")) {
            if (!json_is_null(v) && (s = get_int(v, what, key, 2, 4096, &hd))) goto done;
            if (hd % 2) {
                s = ct_error(CT_EFORMAT, "%s: \"head_dim\" must be even (RoPE rotates pairs), got %lld",
                             what, (long long)hd);
                goto done;
            }
        } else if (!strcmp(key, "rms_norm_eps")) {
            if ((s = get_pos(v, what, key, false, &c->norm_eps))) goto done;
        } else if (!strcmp(key, "rope_theta")) {
            if ((s = get_pos(v, what, key, false, &c->rope_base))) goto done;
            theta_top = true;
        } else if (!strcmp(key, "rope_scaling")) {
            if ((s = parse_rope_scaling(v, what, c))) goto done;
            scaling_set = !json_is_null(v);
        } else if (!strcmp(key, "rope_parameters")) {
            rope_params = v;
        } else if (!strcmp(key, "layer_types")) {
            layer_types = v;
        } else if (!strcmp(key, "tie_word_embeddings")) {
            if (!json_is_boolean(v)) {
                s = ct_error(CT_EFORMAT, "%s: \"%s\" must be true or false", what, key);
                goto done;
            }
            c->tied = json_is_true(v);
        } else if (!strcmp(key, "attention_bias")) {
            if (!json_is_boolean(v)) {
                s = ct_error(CT_EFORMAT, "%s: \"%s\" must be true or false", what, key);
                goto done;
            }
            c->qkv_bias = c->o_bias = json_is_true(v);
        } else if (!strcmp(key, "torch_dtype") || !strcmp(key, "dtype")) {
            const char *d = json_is_string(v) ? json_string_value(v) : "";
            if (!strcmp(d, "float32") || !strcmp(d, "auto"))
                info->dtype = CT_DTYPE_F32;
            else if (!strcmp(d, "float16"))
                info->dtype = CT_DTYPE_F16;
            else if (!strcmp(d, "bfloat16"))
                info->dtype = CT_DTYPE_BF16;
            else if (!json_is_null(v)) {
                s = ct_error(CT_EFORMAT,
                             "%s: \"%s\" must be \"float32\", \"float16\" or \"bfloat16\"", what,
                             key);
                goto done;
            }
        } else if (!strcmp(key, "bos_token_id")) {
            if ((s = get_token(v, what, key, &info->bos_token))) goto done;
        } else if (!strcmp(key, "eos_token_id")) {
            if ((s = get_token(v, what, key, &info->eos_token))) goto done;
        } else if (!strcmp(key, "hidden_act")) {
            if (!json_is_string(v) || strcmp(json_string_value(v), "silu")) {
                s = ct_error(CT_EUNSUPPORTED, "%s: \"hidden_act\" must be \"silu\"", what);
                goto done;
            }
        } else if (!strcmp(key, "use_sliding_window")) {
            if (!json_is_boolean(v)) {
                s = ct_error(CT_EFORMAT, "%s: \"%s\" must be true or false", what, key);
                goto done;
            }
            use_sliding = json_is_true(v);
        } else if (!strcmp(key, "max_window_layers")) {
            max_window = v;
        } else if (!strcmp(key, "mlp_bias")) {
            if (!json_is_false(v)) {
                s = ct_error(CT_EUNSUPPORTED, "%s: \"%s\" must be false", what, key);
                goto done;
            }
        } else if (!strcmp(key, "attention_dropout")) {
            if (!json_is_number(v) || json_number_value(v) != 0) {
                s = ct_error(CT_EUNSUPPORTED, "%s: \"attention_dropout\" must be 0", what);
                goto done;
            }
        } else if (!strcmp(key, "partial_rotary_factor")) {
            if (!json_is_number(v) || json_number_value(v) != 1) {
                s = ct_error(CT_EUNSUPPORTED, "%s: \"partial_rotary_factor\" must be 1", what);
                goto done;
            }
        } else if (!strcmp(key, "sliding_window")) {
            sliding_set = true;
            sliding = json_is_null(v) ? NULL : v;
            if (sliding && !plain_int(v)) {
                s = ct_error(CT_EFORMAT, "%s: \"sliding_window\" must be an integer or null", what);
                goto done;
            }
        } else if (!unknown) {
            unknown = key;
        }
    }
    if (!arch && !mtype) {
        s = ct_error(CT_EFORMAT, "%s: \"architectures\" (or \"model_type\") is missing", what);
        goto done;
    }
    for (size_t i = 0; i < sizeof ARCHS / sizeof ARCHS[0]; i++)
        if ((arch && !strcmp(arch, ARCHS[i].arch)) || (!arch && !strcmp(mtype, ARCHS[i].model_type)))
            info->arch = ARCHS[i].id;
    if (!info->arch) {
        s = ct_error(CT_EUNSUPPORTED,
                     "%s: architecture \"%s\" is not supported (LlamaForCausalLM, "
                     "Qwen2ForCausalLM, MistralForCausalLM)",
                     what, arch ? arch : mtype);
        goto done;
    }
    if (mtype && strcmp(mtype, ARCHS[info->arch - 1].model_type)) {
        s = ct_error(CT_EFORMAT, "%s: \"model_type\" \"%s\" does not match architecture \"%s\"",
                     what, mtype, ARCHS[info->arch - 1].arch);
        goto done;
    }
    if (unknown) {
        s = ct_error(CT_EFORMAT, "%s: unknown key \"%s\"", what, unknown);
        goto done;
    }
    static const char *req[] = {"hidden_size",         "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "vocab_size",        "max_position_embeddings"};
    for (int i = 0; i < 6; i++)
        if (!have[i]) {
            s = ct_error(CT_EFORMAT, "%s: \"%s\" is missing", what, req[i]);
            goto done;
        }
    if (info->arch == CT_HF_QWEN2) {
        if (json_object_get(j, "attention_bias")) {
            s = ct_error(CT_EFORMAT, "%s: unknown key \"attention_bias\" for Qwen2", what);
            goto done;
        }
        c->qkv_bias = true; /* Qwen2: q/k/v biases, none on o_proj */
        c->o_bias = false;
    } else if (sliding_set && info->arch == CT_HF_LLAMA) {
        s = ct_error(CT_EFORMAT, "%s: unknown key \"sliding_window\" for Llama", what);
        goto done;
    }
    if (json_object_get(j, "use_sliding_window") && info->arch != CT_HF_QWEN2) {
        s = ct_error(CT_EFORMAT, "%s: unknown key \"use_sliding_window\"", what);
        goto done;
    }
    if ((s = parse_window(info->arch, c->n_layer, sliding, use_sliding, max_window, layer_types,
                          what, &c->window)))
        goto done;
    if (rope_params && !json_is_null(rope_params)) { /* transformers 5 */
        ct_gpt_config r = *c;
        r.rope_scaling = CT_ROPE_SCALING_NONE;
        float theta = c->rope_base;
        bool theta_set = false;
        if ((s = parse_rope(rope_params, what, "rope_parameters", &r, &theta, &theta_set)))
            goto done;
        if (scaling_set && !same_scaling(&r, c)) {
            s = ct_error(CT_EFORMAT, "%s: \"rope_scaling\" and \"rope_parameters\" disagree",
                         what);
            goto done;
        }
        if (theta_set && theta_top && theta != c->rope_base) {
            s = ct_error(CT_EFORMAT,
                         "%s: \"rope_theta\" = %g and \"rope_parameters.rope_theta\" = %g disagree",
                         what, (double)c->rope_base, (double)theta);
            goto done;
        }
        c->rope_scaling = r.rope_scaling;
        c->rope_factor = r.rope_factor;
        c->rope_low_freq_factor = r.rope_low_freq_factor;
        c->rope_high_freq_factor = r.rope_high_freq_factor;
        c->rope_original_context = r.rope_original_context;
        c->rope_base = theta;
    }
    c->n_kv_head = kv > 0 ? kv : c->n_head;
    if (c->n_head % c->n_kv_head) {
        s = ct_error(CT_EFORMAT,
                     "%s: \"num_key_value_heads\" = %lld must divide \"num_attention_heads\" = %lld",
                     what, (long long)c->n_kv_head, (long long)c->n_head);
        goto done;
    }
    if (!hd) {
        if (c->d_model % c->n_head || (c->d_model / c->n_head) % 2) {
            s = ct_error(CT_EFORMAT,
                         "%s: without \"head_dim\", \"hidden_size\" = %lld must be an even "
                         "multiple of \"num_attention_heads\" = %lld",
                         what, (long long)c->d_model, (long long)c->n_head);
            goto done;
        }
        hd = c->d_model / c->n_head;
    }
    c->head_dim = hd;
    if (c->rope_scaling == CT_ROPE_SCALING_NONE) {
        c->rope_factor = 1.0f;
        c->rope_low_freq_factor = 1.0f;
        c->rope_high_freq_factor = 4.0f;
        c->rope_original_context = 8192;
    } else if (c->rope_scaling == CT_ROPE_SCALING_LINEAR) {
        c->rope_low_freq_factor = 1.0f;
        c->rope_high_freq_factor = 4.0f;
        c->rope_original_context = 8192;
    }
    if ((s = ct_gpt_config_check(c))) s = ct_error_wrap(s, "%s", what);
done:
    json_decref(j);
    return s;
}

/* ---- tensor names ------------------------------------------------------------------------- */

/* Per-layer tensors: ctorch suffix (after "layers.N.") and HF suffix (after "model.layers.N."). */
static const char *const LAYER_NAMES[][2] = {
    {"attention.wq.weight", "self_attn.q_proj.weight"},
    {"attention.wk.weight", "self_attn.k_proj.weight"},
    {"attention.wv.weight", "self_attn.v_proj.weight"},
    {"attention.wo.weight", "self_attn.o_proj.weight"},
    {"attention.wq.bias", "self_attn.q_proj.bias"},
    {"attention.wk.bias", "self_attn.k_proj.bias"},
    {"attention.wv.bias", "self_attn.v_proj.bias"},
    {"attention.wo.bias", "self_attn.o_proj.bias"},
    {"attention_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"feed_forward.w_down.weight", "mlp.down_proj.weight"},
    {"feed_forward.w_gate_up.weight", "mlp.gate_proj.weight"}, /* part 0 */
};

ct_status ct_hf_tensor_name(const char *name, int part, char *buf, size_t n, int *parts)
{
    if (!name || !buf || n == 0)
        return ct_error(CT_EINVAL, "ct_hf_tensor_name: arguments must not be NULL");
    static const char *const top[][2] = {{"tok_embeddings.weight", "model.embed_tokens.weight"},
                                         {"output.weight", "lm_head.weight"},
                                         {"norm.weight", "model.norm.weight"}};
    const char *hf = NULL;
    long long layer = -1;
    int np = 1;
    for (int i = 0; i < 3; i++)
        if (!strcmp(name, top[i][0])) hf = top[i][1];
    if (!hf && !strncmp(name, "layers.", 7) && name[7] >= '0' && name[7] <= '9' &&
        !(name[7] == '0' && name[8] != '.')) {
        char *end;
        errno = 0;
        layer = strtoll(name + 7, &end, 10);
        if (errno == 0 && *end == '.' && layer < 1024)
            for (size_t i = 0; i < sizeof LAYER_NAMES / sizeof LAYER_NAMES[0]; i++)
                if (!strcmp(end + 1, LAYER_NAMES[i][0])) {
                    hf = LAYER_NAMES[i][1];
                    if (strstr(hf, "gate_proj")) np = 2;
                }
    }
    if (!hf) return ct_error(CT_EINVAL, "ct_hf_tensor_name: '%s' is not a ctorch model tensor", name);
    if (part < 0 || part >= np)
        return ct_error(CT_EINVAL, "ct_hf_tensor_name: '%s' has %d part(s), not part %d", name, np,
                        part);
    if (parts) *parts = np;
    int w;
    if (layer < 0)
        w = snprintf(buf, n, "%s", hf);
    else
        w = snprintf(buf, n, "model.layers.%lld.%s", layer, part ? "mlp.up_proj.weight" : hf);
    if (w < 0 || (size_t)w >= n)
        return ct_error(CT_EINVAL, "ct_hf_tensor_name: buffer of %zu bytes is too small", n);
    return CT_OK;
}

/* ---- the index ------------------------------------------------------------------------------ */

void hf_index_free(hf_index *x)
{
    if (!x) return;
    for (size_t i = 0; i < x->n && x->names; i++)
        ct_free(x->names[i]);
    for (int i = 0; i < x->nshards && x->files; i++)
        ct_free(x->files[i]);
    ct_free(x->names);
    ct_free(x->shard);
    ct_free(x->files);
    memset(x, 0, sizeof *x);
}

static ct_status dup_str(const char *s, char **out)
{
    size_t n = strlen(s) + 1;
    CT_TRY(ct_alloc((void **)out, n));
    memcpy(*out, s, n);
    return CT_OK;
}

/* NULL when f is a shard name the index may give (a *.safetensors file of the same folder),
 * else which rule it breaks (why, cap bytes, holds the text). */
static const char *bad_file_name(const char *f, char *why, size_t cap)
{
    size_t n = strlen(f);
    if (n < 13 || strcmp(f + n - 12, ".safetensors")) return "it does not end in .safetensors";
    if (n > 255) return "it is longer than 255 bytes";
    if (f[0] == '.') return "it starts with '.'";
    for (size_t i = 0; i < n; i++) {
        if (f[i] == '/' || f[i] == '\\') {
            snprintf(why, cap, "it holds '%c' at byte %zu (a path, not a name)", f[i], i);
            return why;
        }
        if ((unsigned char)f[i] < 0x20 || f[i] == 0x7f) {
            snprintf(why, cap, "it holds the control character 0x%02x at byte %zu",
                     (unsigned char)f[i], i);
            return why;
        }
    }
    return NULL;
}

ct_status hf_index_parse(const char *text, size_t len, const char *what, hf_index *x)
{
    memset(x, 0, sizeof *x);
    json_error_t err;
    json_t *j = hf_json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!j) return ct_error(CT_EFORMAT, "%s: not JSON (line %d: %s)", what, err.line, err.text);
    ct_status s = CT_OK;
    const char *key;
    json_t *v, *wm = NULL;
    ct_strmap files = {0}; /* shard file name -> its number */
    if (!json_is_object(j)) {
        s = ct_error(CT_EFORMAT, "%s: must be a JSON object", what);
        goto done;
    }
    json_object_foreach(j, key, v)
    {
        if (!strcmp(key, "metadata")) {
            if (!json_is_object(v)) {
                s = ct_error(CT_EFORMAT, "%s: \"metadata\" must be an object", what);
                goto done;
            }
        } else if (!strcmp(key, "weight_map")) {
            wm = v;
        } else {
            s = ct_error(CT_EFORMAT, "%s: unknown key \"%s\"", what, key);
            goto done;
        }
    }
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        s = ct_error(CT_EFORMAT, "%s: \"weight_map\" must be a non-empty object", what);
        goto done;
    }
    size_t n = json_object_size(wm);
    if ((s = ct_calloc((void **)&x->names, n * sizeof(char *))) ||
        (s = ct_calloc((void **)&x->shard, n * sizeof(int))) ||
        (s = ct_calloc((void **)&x->files, HF_MAX_SHARDS * sizeof(char *))) ||
        (s = ct_strmap_init(&files, 64)))
        goto done;
    json_object_foreach(wm, key, v)
    {
        char why[96];
        const char *bad = !json_is_string(v) ? "it is not a string"
                                              : bad_file_name(json_string_value(v), why, sizeof why);
        if (bad) {
            s = ct_error(CT_EFORMAT,
                         "%s: \"weight_map\" entry \"%.200s\" names no shard file: %s (a shard "
                         "is a *.safetensors file in the same folder: no '/', no leading '.', no "
                         "control characters); fix the index",
                         what, key, bad);
            goto done;
        }
        const char *f = json_string_value(v);
        size_t k; /* the shard's number: looked up, not searched (entries x shards was slow) */
        if (!ct_strmap_get(&files, f, strlen(f), &k)) {
            if (x->nshards == HF_MAX_SHARDS) {
                s = ct_error(CT_EFORMAT, "%s: more than %d shard files", what, HF_MAX_SHARDS);
                goto done;
            }
            k = (size_t)x->nshards;
            if ((s = dup_str(f, &x->files[k])) ||
                (s = ct_strmap_put(&files, x->files[k], strlen(x->files[k]), k, NULL, NULL)))
                goto done;
            x->nshards++;
        }
        if ((s = dup_str(key, &x->names[x->n]))) goto done;
        x->shard[x->n++] = (int)k;
    }
done:
    ct_strmap_free(&files);
    json_decref(j);
    if (s) hf_index_free(x);
    return s;
}

/* ---- opening a directory ------------------------------------------------------------------ */

/* What a weight is, for the mapped views. */
enum {
    K_EMB, K_OUT, K_NORM, K_Q, K_K, K_V, K_O, K_BQ, K_BK, K_BV, K_BO, K_N1, K_N2, K_DOWN, K_GATE,
    K_UP
};

typedef struct hf_entry {
    char hf[112];     /* HF name */
    char ct[96];      /* ctorch name */
    int kind;         /* K_* */
    int64_t layer;    /* -1 for the top-level tensors */
    int64_t rows, cols; /* expected shape (cols 0: 1-D) */
    int64_t row0;     /* first row inside the ctorch tensor (up_proj: F) */
    int file;         /* shard number */
    size_t idx;       /* tensor index in that file */
} hf_entry;

struct ct_hf_model {
    char *dir;
    ct_gpt_config cfg;
    ct_hf_info info;
    json_t *config; /* config.json as read, for saving */
    int nfiles;
    char **names;   /* shard file names (model.safetensors alone: 1) */
    ct_tensor_file **files;
    bool sharded;
    hf_entry *e;
    int ne;
    int lm_head_file; /* a tied model's lm_head.weight: file and index, -1 when absent */
    size_t lm_head_idx;
};

static void add_entry(ct_hf_model *h, int kind, int64_t layer, int64_t rows, int64_t cols)
{
    static const char *const top_ct[] = {"tok_embeddings.weight", "output.weight", "norm.weight"};
    static const int layer_row[] = {-1, -1, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 11};
    hf_entry *e = &h->e[h->ne++];
    memset(e, 0, sizeof *e);
    e->kind = kind;
    e->layer = layer;
    e->rows = rows;
    e->cols = cols;
    if (layer < 0)
        snprintf(e->ct, sizeof e->ct, "%s", top_ct[kind]);
    else
        snprintf(e->ct, sizeof e->ct, "layers.%lld.%s", (long long)layer,
                 LAYER_NAMES[layer_row[kind]][0]);
    ct_hf_tensor_name(e->ct, kind == K_UP, e->hf, sizeof e->hf, NULL);
    e->row0 = kind == K_UP ? h->cfg.d_ff : 0;
}

static ct_status expected_entries(ct_hf_model *h)
{
    const ct_gpt_config *c = &h->cfg;
    int64_t C = c->d_model, E = ct_gpt_head_dim(c), HE = c->n_head * E, KE = c->n_kv_head * E,
            F = c->d_ff, V = c->vocab_size;
    CT_TRY(ct_calloc((void **)&h->e, (size_t)(3 + 16 * c->n_layer) * sizeof(hf_entry)));
    add_entry(h, K_EMB, -1, V, C);
    if (!c->tied) add_entry(h, K_OUT, -1, V, C);
    for (int64_t l = 0; l < c->n_layer; l++) {
        add_entry(h, K_Q, l, HE, C);
        add_entry(h, K_K, l, KE, C);
        add_entry(h, K_V, l, KE, C);
        add_entry(h, K_O, l, C, HE);
        if (c->qkv_bias) {
            add_entry(h, K_BQ, l, HE, 0);
            add_entry(h, K_BK, l, KE, 0);
            add_entry(h, K_BV, l, KE, 0);
        }
        if (c->o_bias) add_entry(h, K_BO, l, C, 0);
        add_entry(h, K_N1, l, C, 0);
        add_entry(h, K_N2, l, C, 0);
        add_entry(h, K_GATE, l, F, C);
        add_entry(h, K_UP, l, F, C);
        add_entry(h, K_DOWN, l, C, F);
    }
    add_entry(h, K_NORM, -1, C, 0);
    return CT_OK;
}

static bool ignorable(const char *name)
{
    const char *suf = ".self_attn.rotary_emb.inv_freq";
    size_t n = strlen(name), m = strlen(suf);
    return !strncmp(name, "model.layers.", 13) && n > m && !strcmp(name + n - m, suf);
}

static ct_status check_shape(const ct_hf_model *h, const hf_entry *e, const ct_tensor_info *in)
{
    bool ok = in->ndim == (e->cols ? 2 : 1) && in->shape[0] == e->rows &&
              (!e->cols || in->shape[1] == e->cols);
    if (!ok) {
        char got[64] = "[";
        for (int d = 0; d < in->ndim && d < 4; d++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", d ? ", " : "",
                     (long long)in->shape[d]);
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s]", in->ndim > 4 ? ", ..." : "");
        if (e->cols)
            return ct_error(CT_EFORMAT, "%s: tensor '%s' has shape %s, config.json gives [%lld, %lld]",
                            h->dir, e->hf, got, (long long)e->rows, (long long)e->cols);
        return ct_error(CT_EFORMAT, "%s: tensor '%s' has shape %s, config.json gives [%lld]",
                        h->dir, e->hf, got, (long long)e->rows);
    }
    if (in->st_dtype != CT_ST_F32 && in->st_dtype != CT_ST_F16 && in->st_dtype != CT_ST_BF16)
        return ct_error(CT_EFORMAT, "%s: tensor '%s' has dtype %s (F32, F16 or BF16 expected)",
                        h->dir, e->hf, ct_st_dtype_name(in->st_dtype));
    return CT_OK;
}

void ct_hf_close(ct_hf_model *h)
{
    if (!h) return;
    for (int i = 0; i < h->nfiles; i++) {
        ct_tensor_file_close(h->files ? h->files[i] : NULL);
        if (h->names) ct_free(h->names[i]);
    }
    ct_free(h->files);
    ct_free(h->names);
    ct_free(h->e);
    json_decref(h->config);
    ct_free(h->dir);
    ct_free(h);
}

static ct_status open_files(ct_hf_model *h, hf_index *ix)
{
    char *single;
    CT_TRY(hf_join(h->dir, "model.safetensors", &single));
    struct stat st;
    bool one = stat(single, &st) == 0;
    ct_free(single);
    int n = 1;
    if (!one) {
        char *ipath, *text;
        size_t len;
        CT_TRY(hf_join(h->dir, "model.safetensors.index.json", &ipath));
        /* The index lists the configuration's tensors (and at most a rotary buffer a layer and
         * lm_head): 1 KiB an entry is ten times a real index's, so text beyond that bound is
         * refused before it is parsed (a 66 MB index for a small model took 1 GB in the JSON
         * tree). */
        size_t bound = ((size_t)64 << 10) + ((size_t)h->ne + (size_t)h->cfg.n_layer + 1) * 1024;
        if (bound > HF_INDEX_MAX) bound = HF_INDEX_MAX;
        if (stat(ipath, &st) == 0 && S_ISREG(st.st_mode) && (uint64_t)st.st_size > bound) {
            ct_status e = ct_error(CT_EFORMAT,
                                   "%s: model.safetensors.index.json has %lld bytes, more than "
                                   "the %zu an index of this configuration's %d tensors can need "
                                   "(1 KiB a tensor and 64 KiB)",
                                   h->dir, (long long)st.st_size, bound, h->ne);
            ct_free(ipath);
            return e;
        }
        ct_status s = stat(ipath, &st) == 0 ? hf_read_text(ipath, bound, &text, &len)
                                            : ct_error(CT_EIO,
                                                       "%s: neither model.safetensors nor "
                                                       "model.safetensors.index.json is there",
                                                       h->dir);
        ct_free(ipath);
        CT_TRY(s);
        s = hf_index_parse(text, len, "model.safetensors.index.json", ix);
        ct_free(text);
        if (s) return ct_error_wrap(s, "%s", h->dir);
        n = ix->nshards;
        h->sharded = true;
    }
    CT_TRY(ct_calloc((void **)&h->files, (size_t)n * sizeof *h->files));
    CT_TRY(ct_calloc((void **)&h->names, (size_t)n * sizeof *h->names));
    ct_load_options lo = ct_load_options_default();
    lo.format = CT_FORMAT_SAFETENSORS;
    for (int i = 0; i < n; i++) {
        h->nfiles = i + 1;
        CT_TRY(dup_str(one ? "model.safetensors" : ix->files[i], &h->names[i]));
        char *p;
        CT_TRY(hf_join(h->dir, h->names[i], &p));
        ct_status s = ct_load(p, &lo, &h->files[i]);
        ct_free(p);
        if (s) return ct_error_wrap(s, "%s/%s", h->dir, h->names[i]);
    }
    return CT_OK;
}

ct_status ct_hf_open(const char *dir, ct_hf_model **out)
{
    if (!dir || !out) return ct_error(CT_EINVAL, "ct_hf_open: arguments must not be NULL");
    *out = NULL;
    ct_hf_model *h;
    CT_TRY(ct_calloc((void **)&h, sizeof *h));
    h->lm_head_file = -1;
    hf_index ix;
    memset(&ix, 0, sizeof ix);
    ct_strmap listed = {0}; /* the index's tensor names -> entry */
    bool **used = NULL;
    char *cpath = NULL, *text = NULL;
    size_t len;
    ct_status s;
    if ((s = dup_str(dir, &h->dir)) || (s = hf_join(dir, "config.json", &cpath)) ||
        (s = hf_read_text(cpath, HF_CONFIG_MAX, &text, &len)))
        goto fail;
    if ((s = ct_hf_config_parse(text, len, &h->cfg, &h->info))) {
        s = ct_error_wrap(s, "%s", dir);
        goto fail;
    }
    h->config = hf_json_loadb(text, len, 0, NULL);
    if (!h->config) {
        s = ct_error(CT_ENOMEM, "ct_hf_open: out of memory");
        goto fail;
    }
    if ((s = expected_entries(h)) || (s = open_files(h, &ix))) goto fail;
    /* every file's tensors, marked as each expected one is found */
    if ((s = ct_calloc((void **)&used, (size_t)h->nfiles * sizeof *used))) goto fail;
    for (int i = 0; i < h->nfiles; i++) {
        size_t n = ct_tensor_file_count(h->files[i]);
        if ((s = ct_calloc((void **)&used[i], (n ? n : 1) * sizeof(bool)))) goto fail;
    }
    /* the index's names looked up through a map (a search per tensor was quadratic) */
    if (h->sharded) {
        if ((s = ct_strmap_init(&listed, ix.n))) goto fail;
        for (size_t i = 0; i < ix.n; i++)
            if ((s = ct_strmap_put(&listed, ix.names[i], strlen(ix.names[i]), i, NULL, NULL)))
                goto fail;
    }
    for (int k = 0; k < h->ne; k++) {
        hf_entry *e = &h->e[k];
        int f = 0;
        if (h->sharded) {
            size_t i;
            f = ct_strmap_get(&listed, e->hf, strlen(e->hf), &i) ? ix.shard[i] : -1;
            if (f < 0) {
                s = ct_error(CT_EFORMAT, "%s: tensor '%s' is missing from the index", dir, e->hf);
                goto fail;
            }
        }
        if (ct_tensor_file_find(h->files[f], e->hf, &e->idx) != CT_OK) {
            s = ct_error(CT_EFORMAT, "%s: tensor '%s' is missing%s%s", dir, e->hf,
                         h->sharded ? " from " : "", h->sharded ? h->names[f] : "");
            goto fail;
        }
        e->file = f;
        used[f][e->idx] = true;
        ct_tensor_info in;
        if ((s = ct_tensor_file_info(h->files[f], e->idx, &in)) || (s = check_shape(h, e, &in)))
            goto fail;
    }
    /* anything else: the ignorable buffers, a tied model's lm_head, or refused by name */
    for (int f = 0; f < h->nfiles; f++)
        for (size_t i = 0; i < ct_tensor_file_count(h->files[f]); i++) {
            if (used[f][i]) continue;
            ct_tensor_info in;
            if ((s = ct_tensor_file_info(h->files[f], i, &in))) goto fail;
            if (ignorable(in.name)) continue;
            if (h->cfg.tied && !strcmp(in.name, "lm_head.weight") && h->lm_head_file < 0) {
                hf_entry e0 = h->e[0];
                snprintf(e0.hf, sizeof e0.hf, "lm_head.weight");
                if ((s = check_shape(h, &e0, &in))) goto fail;
                h->lm_head_file = f;
                h->lm_head_idx = i;
                continue;
            }
            s = ct_error(CT_EFORMAT, "%s/%s: unknown tensor '%s' (not a %s tensor of this config)",
                         dir, h->names[f], in.name, ARCHS[h->info.arch - 1].arch);
            goto fail;
        }
    /* the index names nothing that is not where it says */
    for (size_t i = 0; i < ix.n; i++) {
        size_t idx;
        if (ct_tensor_file_find(h->files[ix.shard[i]], ix.names[i], &idx) != CT_OK) {
            s = ct_error(CT_EFORMAT, "%s: the index puts tensor '%s' in %s, which lacks it", dir,
                         ix.names[i], ix.files[ix.shard[i]]);
            goto fail;
        }
    }
    if (h->sharded)
        for (int f = 0; f < h->nfiles; f++)
            for (size_t i = 0; i < ct_tensor_file_count(h->files[f]); i++) {
                ct_tensor_info in;
                if ((s = ct_tensor_file_info(h->files[f], i, &in))) goto fail;
                size_t q;
                if (!ct_strmap_get(&listed, in.name, strlen(in.name), &q) || ix.shard[q] != f) {
                    s = ct_error(CT_EFORMAT, "%s/%s: tensor '%s' is not in the index under this file",
                                 dir, h->names[f], in.name);
                    goto fail;
                }
            }
    for (int i = 0; i < h->nfiles; i++)
        ct_free(used[i]);
    ct_free(used);
    ct_strmap_free(&listed);
    hf_index_free(&ix);
    ct_free(cpath);
    ct_free(text);
    *out = h;
    return CT_OK;
fail:
    for (int i = 0; used && i < h->nfiles; i++)
        ct_free(used[i]);
    ct_free(used);
    ct_strmap_free(&listed);
    hf_index_free(&ix);
    ct_free(cpath);
    ct_free(text);
    ct_hf_close(h);
    return s;
}

const ct_gpt_config *ct_hf_get_config(const ct_hf_model *h)
{
    return &h->cfg;
}

const ct_hf_info *ct_hf_get_info(const ct_hf_model *h)
{
    return &h->info;
}

int ct_hf_num_shards(const ct_hf_model *h)
{
    return h->nfiles;
}

/* ---- loading -------------------------------------------------------------------------------- */

static ct_status same_config(const ct_hf_model *h, const ct_gpt *m, const char *fn)
{
    char *a = NULL, *b = NULL;
    ct_status s = ct_gpt_config_to_json(&h->cfg, &a);
    if (s == CT_OK) s = ct_gpt_config_to_json(&m->cfg, &b);
    if (s == CT_OK && strcmp(a, b))
        s = ct_error(CT_EINVAL, "%s: the model's configuration %s is not the directory's %s", fn, b,
                     a);
    ct_free(a);
    ct_free(b);
    return s;
}

/* The model tensor of an entry: its index in the model's table. */
static int model_tensor(const ct_gpt *m, const char *ct)
{
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, ct)) return i;
    return -1;
}

/* A tied model's lm_head.weight must be the embedding, element for element. */
static ct_status check_tied_head(const ct_hf_model *h)
{
    if (h->lm_head_file < 0) return CT_OK;
    ct_tensor_info a, b;
    CT_TRY(ct_tensor_file_info(h->files[h->e[0].file], h->e[0].idx, &a));
    CT_TRY(ct_tensor_file_info(h->files[h->lm_head_file], h->lm_head_idx, &b));
    if (a.st_dtype != b.st_dtype || memcmp(a.data, b.data, (size_t)a.nbytes))
        return ct_error(CT_EFORMAT,
                        "%s: tie_word_embeddings is true but lm_head.weight differs from "
                        "model.embed_tokens.weight",
                        h->dir);
    return CT_OK;
}

/* Copy entry e into the model's own buffer (converted to f32). */
static ct_status copy_entry(const ct_hf_model *h, const hf_entry *e, ct_gpt *m)
{
    int t = model_tensor(m, e->ct);
    if (t < 0) return ct_error(CT_EINTERNAL, "hf: model tensor '%s' not found", e->ct);
    const gpt_tensor *gt = &m->tensors[t];
    int64_t cols = gt->ndim == 2 ? gt->shape[1] : 1;
    int64_t shape[2] = {e->rows, e->cols};
    ct_tensor dst;
    CT_TRY(ct_tensor_wrap(&dst, m->params + gt->offset + e->row0 * cols, CT_DTYPE_F32,
                          e->cols ? 2 : 1, shape, NULL));
    ct_status s = ct_tensor_file_read_into(h->files[e->file], e->idx, &dst);
    if (s) return ct_error_wrap(s, "%s: tensor '%s'", h->dir, e->hf);
    return CT_OK;
}

ct_status ct_hf_load_params(const ct_hf_model *h, ct_gpt *m)
{
    if (!h || !m) return ct_error(CT_EINVAL, "ct_hf_load_params: arguments must not be NULL");
    if (m->mapped)
        return ct_error(CT_EINVAL, "ct_hf_load_params: the model's weights are mapped from a file");
    CT_TRY(same_config(h, m, "ct_hf_load_params"));
    CT_TRY(check_tied_head(h));
    for (int k = 0; k < h->ne; k++)
        CT_TRY(copy_entry(h, &h->e[k], m));
    return CT_OK;
}

/* The model's view pointer of an entry's weight. */
static float **view_slot(ct_gpt *m, const hf_entry *e)
{
    if (e->kind == K_EMB) return &m->w.emb;
    if (e->kind == K_OUT) return &m->w.out;
    if (e->kind == K_NORM) return &m->w.norm;
    gpt_layer *L = &m->w.layer[e->layer];
    switch (e->kind) {
    case K_Q: return &L->wq;
    case K_K: return &L->wk;
    case K_V: return &L->wv;
    case K_O: return &L->wo;
    case K_BQ: return &L->bq;
    case K_BK: return &L->bk;
    case K_BV: return &L->bv;
    case K_BO: return &L->bo;
    case K_N1: return &L->norm1;
    case K_N2: return &L->norm2;
    case K_DOWN: return &L->wdown;
    case K_GATE: return &L->wgu;
    default: return &L->wup;
    }
}

/* The half-precision view of an entry's matrix (NULL for the vectors). */
static gpt_half *half_slot(ct_gpt *m, const hf_entry *e)
{
    if (e->kind == K_EMB) return &m->w.hemb;
    if (e->kind == K_OUT) return &m->w.hout;
    if (e->layer < 0) return NULL;
    gpt_layer *L = &m->w.layer[e->layer];
    switch (e->kind) {
    case K_Q: return &L->hq;
    case K_K: return &L->hk;
    case K_V: return &L->hv;
    case K_O: return &L->ho;
    case K_GATE: return &L->hgu;
    case K_UP: return &L->hup;
    case K_DOWN: return &L->hdown;
    default: return NULL;
    }
}

/* How a mapped model reads an entry: an f32 view, a bf16 / f16 view (matrices only), or a
 * copy converted to f32 (the vectors in half precision, and anything misaligned). */
enum { MAP_F32, MAP_HALF, MAP_COPY };

static int map_how(const hf_entry *e, const ct_tensor_info *in)
{
    uintptr_t a = (uintptr_t)in->data;
    if (in->st_dtype == CT_ST_F32 && a % sizeof(float) == 0) return MAP_F32;
    if (e->cols && (in->st_dtype == CT_ST_BF16 || in->st_dtype == CT_ST_F16) &&
        a % sizeof(uint16_t) == 0)
        return MAP_HALF;
    return MAP_COPY;
}

static int64_t entry_numel(const hf_entry *e)
{
    return e->rows * (e->cols ? e->cols : 1);
}

/* Point m's views at the files (m with parameter arrays: copies go there; without: into
 * m->own, allocated here for exactly what is copied). */
static ct_status map_into(const ct_hf_model *h, ct_gpt *m, const char *fn, int *mapped)
{
    if (m->mapped) return ct_error(CT_EINVAL, "%s: the model's weights are already mapped", fn);
    CT_TRY(same_config(h, m, fn));
    CT_TRY(check_tied_head(h));
    if (!m->params) {
        size_t copied = 0;
        for (int k = 0; k < h->ne; k++) {
            ct_tensor_info in;
            CT_TRY(ct_tensor_file_info(h->files[h->e[k].file], h->e[k].idx, &in));
            if (map_how(&h->e[k], &in) == MAP_COPY) copied += (size_t)entry_numel(&h->e[k]);
        }
        CT_TRY(ct_alloc((void **)&m->own, copied * sizeof(float)));
        m->own_bytes = copied * sizeof(float);
    }
    int n = 0;
    size_t off = 0;
    for (int k = 0; k < h->ne; k++) {
        const hf_entry *e = &h->e[k];
        ct_tensor_info in;
        CT_TRY(ct_tensor_file_info(h->files[e->file], e->idx, &in));
        float **slot = view_slot(m, e);
        gpt_half *hs = half_slot(m, e);
        if (hs) *hs = (gpt_half){NULL, CT_DTYPE_F32};
        int how = map_how(e, &in);
        if (how == MAP_F32) {
            *slot = (float *)(uintptr_t)in.data; /* read-only: the model never writes weights */
            n++;
        } else if (how == MAP_HALF) {
            *slot = NULL; /* the forward reads the half view */
            *hs = (gpt_half){(const uint16_t *)in.data,
                             in.st_dtype == CT_ST_BF16 ? CT_DTYPE_BF16 : CT_DTYPE_F16};
            n++;
        } else if (m->params) {
            CT_TRY(copy_entry(h, e, m));
            /* the own buffer: point back at it (gate and up keep their own halves) */
            int t = model_tensor(m, e->ct);
            int64_t cols = m->tensors[t].ndim == 2 ? m->tensors[t].shape[1] : 1;
            *slot = m->params + m->tensors[t].offset + e->row0 * cols;
        } else {
            int64_t shape[2] = {e->rows, e->cols};
            ct_tensor dst;
            CT_TRY(ct_tensor_wrap(&dst, m->own + off, CT_DTYPE_F32, e->cols ? 2 : 1, shape, NULL));
            ct_status s = ct_tensor_file_read_into(h->files[e->file], e->idx, &dst);
            if (s) return ct_error_wrap(s, "%s: tensor '%s'", h->dir, e->hf);
            *slot = m->own + off;
            off += (size_t)entry_numel(e);
        }
    }
    if (m->cfg.tied) {
        m->w.out = m->w.emb;
        m->w.hout = m->w.hemb;
    }
    m->mapped = true;
    if (mapped) *mapped = n;
    return CT_OK;
}

ct_status ct_hf_map_params(const ct_hf_model *h, ct_gpt *m, int *mapped)
{
    if (!h || !m) return ct_error(CT_EINVAL, "ct_hf_map_params: arguments must not be NULL");
    if (!m->params)
        return ct_error(CT_EINVAL, "ct_hf_map_params: the model holds no parameters (sharded)");
    return map_into(h, m, "ct_hf_map_params", mapped);
}

ct_status ct_hf_map_model(const ct_hf_model *h, const ct_gpt_options *opt, ct_gpt **out,
                          int *mapped)
{
    if (!h || !out) return ct_error(CT_EINVAL, "ct_hf_map_model: arguments must not be NULL");
    *out = NULL;
    ct_gpt *m;
    CT_TRY(gpt_create(&h->cfg, opt, false, &m));
    ct_status s = map_into(h, m, "ct_hf_map_model", mapped);
    if (s) {
        ct_gpt_free(m);
        return s;
    }
    *out = m;
    return CT_OK;
}

/* ---- saving ----------------------------------------------------------------------------------- */

ct_hf_save_options ct_hf_save_options_default(void)
{
    ct_hf_save_options o = {-1, 0};
    return o;
}

/* A float as the shortest decimal that reads back as the same f32. */
static json_t *real_f32(float f)
{
    char buf[32];
    for (int p = 6; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)f);
        if ((float)strtod(buf, NULL) == f) break;
    }
    return json_real(strtod(buf, NULL));
}

/* Set key to a float unless the value there already reads as the same f32. */
static void set_f32(json_t *j, const char *key, float f)
{
    json_t *v = json_object_get(j, key);
    if (json_is_number(v) && (float)json_number_value(v) == f) return;
    json_object_set_new(j, key, real_f32(f));
}

static ct_status config_json(const ct_gpt *m, const ct_hf_model *like, ct_hf_arch arch,
                             ct_dtype dt, char **text)
{
    const ct_gpt_config *c = &m->cfg;
    json_t *j = like ? json_deep_copy(like->config) : json_object();
    if (!j) return ct_error(CT_ENOMEM, "ct_hf_save: out of memory");
    if (!like) {
        json_object_set_new(j, "architectures", json_pack("[s]", ARCHS[arch - 1].arch));
        json_object_set_new(j, "model_type", json_string(ARCHS[arch - 1].model_type));
        json_object_set_new(j, "hidden_act", json_string("silu"));
    }
    json_object_set_new(j, "hidden_size", json_integer(c->d_model));
    json_object_set_new(j, "intermediate_size", json_integer(c->d_ff));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->n_layer));
    json_object_set_new(j, "num_attention_heads", json_integer(c->n_head));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->n_kv_head));
    /* head_dim where the source has it or it is not hidden_size / num_attention_heads */
    if (json_object_get(j, "head_dim") || ct_gpt_head_dim(c) * c->n_head != c->d_model || !like)
        json_object_set_new(j, "head_dim", json_integer(ct_gpt_head_dim(c)));
    set_f32(j, "rms_norm_eps", c->norm_eps);
    json_object_set_new(j, "max_position_embeddings", json_integer(c->context));
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tied));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    if (arch != CT_HF_QWEN2 && (json_object_get(j, "attention_bias") || c->qkv_bias || !like))
        json_object_set_new(j, "attention_bias", json_boolean(c->qkv_bias));
    /* the window as transformers reads it (parse_window): sliding_window = window + 1 on every
     * layer. Mistral's is always written (MistralConfig's default is 4096, not null); Qwen2's
     * layers are all windowed (max_window_layers 0, layer_types) or, without a window, the
     * source's keys stay (they parsed to no window) */
    if (arch == CT_HF_MISTRAL)
        json_object_set_new(j, "sliding_window",
                            c->window ? json_integer(c->window + 1) : json_null());
    if (arch == CT_HF_QWEN2 && c->window) {
        json_object_set_new(j, "use_sliding_window", json_true());
        json_object_set_new(j, "sliding_window", json_integer(c->window + 1));
        json_object_set_new(j, "max_window_layers", json_integer(0));
    }
    if (json_object_get(j, "layer_types") || (arch == CT_HF_QWEN2 && c->window)) {
        json_t *lt = json_array();
        for (int64_t i = 0; lt && i < c->n_layer; i++)
            json_array_append_new(lt, json_string(c->window ? "sliding_attention" : "full_attention"));
        json_object_set_new(j, "layer_types", lt);
    }
    /* the dtype under the source's key: "dtype" (transformers 5) or "torch_dtype" */
    bool new_keys = json_object_get(j, "dtype") && !json_object_get(j, "torch_dtype");
    json_object_del(j, new_keys ? "torch_dtype" : "dtype");
    json_object_set_new(j, new_keys ? "dtype" : "torch_dtype",
                        json_string(dt == CT_DTYPE_BF16  ? "bfloat16"
                                    : dt == CT_DTYPE_F16 ? "float16"
                                                         : "float32"));
    /* RoPE: transformers 5's "rope_parameters" (rope_theta inside) when the source has it, else
     * "rope_theta" and "rope_scaling", which every transformers version reads; the source's
     * object is kept when it says the same */
    json_t *rp = json_object_get(j, "rope_parameters");
    bool params = json_is_object(rp);
    const char *rkey = params ? "rope_parameters" : "rope_scaling";
    json_t *rs = json_object_get(j, rkey);
    bool keep = false;
    if (json_is_object(rs) && (params || c->rope_scaling != CT_ROPE_SCALING_NONE)) {
        ct_gpt_config t = *c;
        t.rope_scaling = CT_ROPE_SCALING_NONE;
        float theta = 0;
        bool theta_set = false;
        keep = parse_rope(rs, "config.json", rkey, &t, &theta, &theta_set) == CT_OK &&
               same_scaling(&t, c);
    }
    if (!keep) {
        json_t *r = params ? json_object() : json_null();
        if (params) json_object_set_new(r, "rope_type", json_string("default"));
        if (c->rope_scaling != CT_ROPE_SCALING_NONE) {
            if (!params) r = json_object();
            json_object_set_new(r, "rope_type", json_string(c->rope_scaling == CT_ROPE_SCALING_LINEAR
                                                                ? "linear"
                                                                : "llama3"));
            json_object_set_new(r, "factor", real_f32(c->rope_factor));
        }
        if (c->rope_scaling == CT_ROPE_SCALING_LLAMA3) {
            json_object_set_new(r, "low_freq_factor", real_f32(c->rope_low_freq_factor));
            json_object_set_new(r, "high_freq_factor", real_f32(c->rope_high_freq_factor));
            json_object_set_new(r, "original_max_position_embeddings",
                                json_integer(c->rope_original_context));
        }
        json_object_set_new(j, rkey, r);
        rs = r;
    }
    if (params) {
        set_f32(rs, "rope_theta", c->rope_base);
        if (json_object_get(j, "rope_theta")) set_f32(j, "rope_theta", c->rope_base);
        if (json_is_object(json_object_get(j, "rope_scaling"))) json_object_del(j, "rope_scaling");
    } else {
        set_f32(j, "rope_theta", c->rope_base);
    }
    char *s = json_dumps(j, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    json_decref(j);
    if (!s) return ct_error(CT_ENOMEM, "ct_hf_save: out of memory");
    size_t n = strlen(s);
    ct_status st = ct_alloc((void **)text, n + 2);
    if (st == CT_OK) {
        memcpy(*text, s, n);
        (*text)[n] = '\n';
        (*text)[n + 1] = '\0';
    }
    free(s);
    return st;
}

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

ct_status ct_hf_save(ct_gpt *m, const ct_hf_model *like, const char *dir,
                     const ct_hf_save_options *opt)
{
    const char *fn = "ct_hf_save";
    if (!m || !dir) return ct_error(CT_EINVAL, "%s: m and dir must not be NULL", fn);
    ct_hf_save_options o = opt ? *opt : ct_hf_save_options_default();
    ct_dtype dt = o.dtype >= 0 ? (ct_dtype)o.dtype : like ? like->info.dtype : CT_DTYPE_F32;
    if (dt != CT_DTYPE_F32 && dt != CT_DTYPE_F16 && dt != CT_DTYPE_BF16)
        return ct_error(CT_EINVAL, "%s: dtype must be f32, f16 or bf16", fn);
    ct_hf_arch arch = like ? like->info.arch : o.arch;
    /* by default: Qwen2 for q/k/v biases alone; else Mistral for a sliding window, Llama without */
    if (!arch)
        arch = m->cfg.qkv_bias && !m->cfg.o_bias ? CT_HF_QWEN2
               : m->cfg.window                   ? CT_HF_MISTRAL
                                                 : CT_HF_LLAMA;
    if (arch < CT_HF_LLAMA || arch > CT_HF_MISTRAL)
        return ct_error(CT_EINVAL, "%s: arch %d is not a ct_hf_arch", fn, (int)arch);
    if (arch == CT_HF_QWEN2 ? (!m->cfg.qkv_bias || m->cfg.o_bias)
                            : m->cfg.qkv_bias != m->cfg.o_bias)
        return ct_error(CT_EINVAL,
                        "%s: %s cannot hold biases on %s (q/k/v bias %d, o bias %d)", fn,
                        ARCHS[arch - 1].arch, arch == CT_HF_QWEN2 ? "q/k/v only" : "all of q/k/v/o",
                        (int)m->cfg.qkv_bias, (int)m->cfg.o_bias);
    if (arch == CT_HF_MISTRAL && m->cfg.qkv_bias)
        return ct_error(CT_EINVAL, "%s: MistralForCausalLM has no attention biases", fn);
    /* what the Hugging Face Llama family cannot express, by setting */
    if (m->cfg.window && arch == CT_HF_LLAMA)
        return ct_error(CT_EINVAL,
                        "%s: the model's \"window\" = %lld (a causal sliding window) has no place "
                        "in LlamaForCausalLM: save it as MistralForCausalLM (no biases) or "
                        "Qwen2ForCausalLM (q/k/v biases)",
                        fn, (long long)m->cfg.window);
    if (m->cfg.window == INT64_MAX)
        return ct_error(CT_EINVAL, "%s: the model's \"window\" = %lld has no sliding_window "
                        "(window + 1)", fn, (long long)m->cfg.window);
    if (m->cfg.score_mod[0] || m->cfg.mask_mod[0])
        return ct_error(CT_EINVAL,
                        "%s: the model's compiled \"%s\" (%s) has no Hugging Face "
                        "Llama / Qwen2 / Mistral layout",
                        fn, m->cfg.score_mod[0] ? "score_mod" : "mask_mod",
                        m->cfg.score_mod[0] ? m->cfg.score_mod : m->cfg.mask_mod);
    if (like) CT_TRY(same_config(like, m, fn));
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return ct_error(CT_EIO, "%s: cannot create '%s': %s", fn, dir, strerror(errno));

    /* the entries, in the source's shards when it had them */
    ct_hf_model tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.cfg = m->cfg;
    ct_status s = expected_entries(&tmp);
    ct_save_entry *ent = NULL;
    ct_tensor *ts = NULL;
    uint16_t *half = NULL;
    float *wide = NULL;
    char *text = NULL, *path = NULL;
    const char **order = NULL;
    size_t total = 0;
    if (s) goto done;
    int nf = like && like->sharded ? like->nfiles : 1;
    /* the other layout must not be left beside this one: the reader would take it */
    {
        const char *other = nf > 1 ? "model.safetensors" : "model.safetensors.index.json";
        struct stat st;
        if ((s = hf_join(dir, other, &path))) goto done;
        if (stat(path, &st) == 0) {
            s = ct_error(CT_EINVAL, "%s: '%s' already holds %s (another layout): remove it first", fn,
                         dir, other);
            goto done;
        }
        ct_free(path);
        path = NULL;
    }
    size_t esz = ct_dtype_size(dt);
    if ((s = ct_calloc((void **)&ent, (size_t)tmp.ne * sizeof *ent)) ||
        (s = ct_calloc((void **)&ts, (size_t)tmp.ne * sizeof *ts)))
        goto done;
    for (int k = 0; k < tmp.ne; k++) {
        tmp.e[k].file = 0;
        if (nf > 1)
            for (int q = 0; q < like->ne; q++)
                if (!strcmp(like->e[q].hf, tmp.e[k].hf)) tmp.e[k].file = like->e[q].file;
        int64_t n = tmp.e[k].rows * (tmp.e[k].cols ? tmp.e[k].cols : 1);
        total += (size_t)n;
    }
    /* a mapped model's bf16 / f16 matrices: written as they are in that dtype, else widened */
    size_t nwide = 0;
    for (int k = 0; k < tmp.ne; k++) {
        const gpt_half *hp = half_slot(m, &tmp.e[k]);
        if (hp && hp->p && dt == CT_DTYPE_F32) nwide += (size_t)entry_numel(&tmp.e[k]);
    }
    if (dt != CT_DTYPE_F32 && (s = ct_alloc((void **)&half, total * sizeof(uint16_t)))) goto done;
    if (nwide && (s = ct_alloc((void **)&wide, nwide * sizeof(float)))) goto done;
    size_t off = 0, woff = 0, bytes_all = 0;
    for (int k = 0; k < tmp.ne; k++) {
        hf_entry *e = &tmp.e[k];
        const float *src = *view_slot(m, e);
        const gpt_half *hp = half_slot(m, e);
        gpt_half hv = hp ? *hp : (gpt_half){NULL, CT_DTYPE_F32};
        int64_t n = e->rows * (e->cols ? e->cols : 1), shape[2] = {e->rows, e->cols};
        if (hv.p && hv.dt == dt) {
            s = ct_tensor_wrap(&ts[k], (void *)(uintptr_t)hv.p, dt, 2, shape, NULL);
        } else if (hv.p) {
            float buf[1024];
            uint16_t *dst16 = dt == CT_DTYPE_F32 ? NULL : half + off;
            float *dst32 = dt == CT_DTYPE_F32 ? wide + woff : NULL;
            for (int64_t i = 0; i < n; i += 1024) {
                size_t c = (size_t)(n - i < 1024 ? n - i : 1024);
                float *w = dst32 ? dst32 + i : buf;
                if (hv.dt == CT_DTYPE_BF16)
                    ct_convert_bf16_to_f32(w, hv.p + i, c);
                else
                    ct_convert_f16_to_f32(w, hv.p + i, c);
                if (dt == CT_DTYPE_BF16) ct_convert_f32_to_bf16(dst16 + i, w, c);
                if (dt == CT_DTYPE_F16) ct_convert_f32_to_f16(dst16 + i, w, c);
            }
            s = ct_tensor_wrap(&ts[k], dst32 ? (void *)dst32 : (void *)dst16, dt, 2, shape, NULL);
            if (dst32)
                woff += (size_t)n;
            else
                off += (size_t)n;
        } else if (dt == CT_DTYPE_F32) {
            s = ct_tensor_wrap(&ts[k], (void *)(uintptr_t)src, CT_DTYPE_F32, e->cols ? 2 : 1, shape,
                               NULL);
        } else {
            if (dt == CT_DTYPE_BF16)
                ct_convert_f32_to_bf16(half + off, src, (size_t)n);
            else
                ct_convert_f32_to_f16(half + off, src, (size_t)n);
            s = ct_tensor_wrap(&ts[k], half + off, dt, e->cols ? 2 : 1, shape, NULL);
            off += (size_t)n;
        }
        if (s) goto done;
        ent[k].name = e->hf;
        ent[k].tensor = &ts[k];
        bytes_all += (size_t)n * esz;
    }
    static const char *mk[] = {"format"}, *mv[] = {"pt"};
    ct_save_options so = ct_save_options_default();
    ct_save_entry *part = NULL;
    if ((s = ct_alloc((void **)&part, (size_t)tmp.ne * sizeof *part))) goto done;
    for (int f = 0; f < nf && s == CT_OK; f++) {
        size_t np = 0;
        for (int k = 0; k < tmp.ne; k++)
            if (tmp.e[k].file == f) part[np++] = ent[k];
        if ((s = hf_join(dir, nf > 1 ? like->names[f] : "model.safetensors", &path))) break;
        s = ct_save_safetensors_entries(path, part, np, mk, mv, 1, &so);
        ct_free(path);
        path = NULL;
    }
    ct_free(part);
    if (s) goto done;
    if (nf > 1) { /* the index: names sorted, as transformers writes it */
        if ((s = ct_alloc((void **)&order, (size_t)tmp.ne * sizeof *order))) goto done;
        for (int k = 0; k < tmp.ne; k++)
            order[k] = tmp.e[k].hf;
        qsort(order, (size_t)tmp.ne, sizeof *order, cmp_names);
        json_t *wm = json_object(), *ix = json_object();
        for (int k = 0; k < tmp.ne; k++)
            for (int q = 0; q < tmp.ne; q++)
                if (order[k] == tmp.e[q].hf)
                    json_object_set_new(wm, order[k], json_string(like->names[tmp.e[q].file]));
        /* the metadata transformers 5 writes */
        json_object_set_new(ix, "metadata",
                            json_pack("{s:I, s:I}", "total_parameters", (json_int_t)total,
                                      "total_size", (json_int_t)bytes_all));
        json_object_set_new(ix, "weight_map", wm);
        char *js = json_dumps(ix, JSON_INDENT(2));
        json_decref(ix);
        if (!js) {
            s = ct_error(CT_ENOMEM, "%s: out of memory", fn);
            goto done;
        }
        if ((s = hf_join(dir, "model.safetensors.index.json", &path)) == CT_OK)
            s = hf_write_atomic(path, js, strlen(js));
        free(js);
        ct_free(path);
        path = NULL;
        if (s) goto done;
    }
    if ((s = config_json(m, like, arch, dt, &text))) goto done;
    if ((s = hf_join(dir, "config.json", &path))) goto done;
    s = hf_write_atomic(path, text, strlen(text));
done:
    ct_free(order);
    ct_free(path);
    ct_free(text);
    ct_free(half);
    ct_free(wide);
    ct_free(ts);
    ct_free(ent);
    ct_free(tmp.e);
    return s;
}
