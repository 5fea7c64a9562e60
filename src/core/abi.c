/* Layouts of the public structs as this library was compiled (ct_abi_struct_layout): the
 * Python binding checks its ctypes mirrors against them at import, so a header change that
 * the binding missed fails loudly instead of corrupting memory. The fields listed are those a
 * binding mirrors; a struct's sizeof covers the rest. */
#include "core/internal.h"
#include "ctorch/ctorch.h"

#include <stddef.h>
#include <string.h>

typedef struct abi_field {
    const char *name;
    size_t offset, size;
} abi_field;

typedef struct abi_struct {
    const char *name;
    size_t size;
    const abi_field *fields;
    int nfields;
} abi_struct;

#define F(S, f) {#f, offsetof(S, f), sizeof(((S *)0)->f)}
#define STRUCT(S, ...)                                                                           \
    {#S, sizeof(S), (const abi_field[]){__VA_ARGS__},                                            \
     (int)(sizeof((const abi_field[]){__VA_ARGS__}) / sizeof(abi_field))}

/* clang-format off */
static const abi_struct structs[] = {
    STRUCT(ct_device_options,
        F(ct_device_options, kind),
        F(ct_device_options, index),
        F(ct_device_options, memory_limit)),
    STRUCT(ct_memory_stats_t,
        F(ct_memory_stats_t, current_bytes),
        F(ct_memory_stats_t, peak_bytes),
        F(ct_memory_stats_t, alloc_count),
        F(ct_memory_stats_t, free_count),
        F(ct_memory_stats_t, limit_bytes)),
    STRUCT(ct_tensor,
        F(ct_tensor, data),
        F(ct_tensor, dtype),
        F(ct_tensor, ndim),
        F(ct_tensor, shape),
        F(ct_tensor, strides),
        F(ct_tensor, owns),
        F(ct_tensor, buffer)),
    STRUCT(ct_tensor_info,
        F(ct_tensor_info, name),
        F(ct_tensor_info, st_dtype),
        F(ct_tensor_info, has_dtype),
        F(ct_tensor_info, dtype),
        F(ct_tensor_info, ndim),
        F(ct_tensor_info, shape),
        F(ct_tensor_info, numel),
        F(ct_tensor_info, nbytes),
        F(ct_tensor_info, data_begin),
        F(ct_tensor_info, data_end),
        F(ct_tensor_info, file_offset),
        F(ct_tensor_info, data),
        F(ct_tensor_info, strides),
        F(ct_tensor_info, storage),
        F(ct_tensor_info, storage_offset)),
    STRUCT(ct_storage_info,
        F(ct_storage_info, key),
        F(ct_storage_info, st_dtype),
        F(ct_storage_info, nbytes),
        F(ct_storage_info, file_offset),
        F(ct_storage_info, data)),
    STRUCT(ct_tensor_file_summary,
        F(ct_tensor_file_summary, format),
        F(ct_tensor_file_summary, file_bytes),
        F(ct_tensor_file_summary, header_bytes),
        F(ct_tensor_file_summary, data_offset),
        F(ct_tensor_file_summary, data_bytes),
        F(ct_tensor_file_summary, total_elements),
        F(ct_tensor_file_summary, tensors),
        F(ct_tensor_file_summary, metadata),
        F(ct_tensor_file_summary, storages)),
    STRUCT(ct_load_options,
        F(ct_load_options, format),
        F(ct_load_options, populate)),
    STRUCT(ct_save_options,
        F(ct_save_options, sync),
        F(ct_save_options, anonymous_temp)),
    STRUCT(ct_save_entry,
        F(ct_save_entry, name),
        F(ct_save_entry, tensor),
        F(ct_save_entry, st_dtype),
        F(ct_save_entry, ndim),
        F(ct_save_entry, shape),
        F(ct_save_entry, data)),
    STRUCT(ct_gpt_config,
        F(ct_gpt_config, vocab_size),
        F(ct_gpt_config, context),
        F(ct_gpt_config, n_layer),
        F(ct_gpt_config, d_model),
        F(ct_gpt_config, n_head),
        F(ct_gpt_config, n_kv_head),
        F(ct_gpt_config, d_ff),
        F(ct_gpt_config, rope_base),
        F(ct_gpt_config, window),
        F(ct_gpt_config, tied),
        F(ct_gpt_config, norm_eps),
        F(ct_gpt_config, init_std),
        F(ct_gpt_config, head_dim),
        F(ct_gpt_config, qkv_bias),
        F(ct_gpt_config, o_bias),
        F(ct_gpt_config, rope_scaling),
        F(ct_gpt_config, rope_factor),
        F(ct_gpt_config, rope_low_freq_factor),
        F(ct_gpt_config, rope_high_freq_factor),
        F(ct_gpt_config, rope_original_context),
        F(ct_gpt_config, score_mod),
        F(ct_gpt_config, mask_mod)),
    STRUCT(ct_gpt_options,
        F(ct_gpt_options, batch),
        F(ct_gpt_options, seq),
        F(ct_gpt_options, fused_head),
        F(ct_gpt_options, dense_attention),
        F(ct_gpt_options, eos_token),
        F(ct_gpt_options, z_loss),
        F(ct_gpt_options, label_smoothing),
        F(ct_gpt_options, lce_scratch_bytes),
        F(ct_gpt_options, dtype),
        F(ct_gpt_options, device)),
    STRUCT(ct_hf_info,
        F(ct_hf_info, arch),
        F(ct_hf_info, dtype),
        F(ct_hf_info, bos_token),
        F(ct_hf_info, eos_token)),
    STRUCT(ct_hf_save_options,
        F(ct_hf_save_options, dtype),
        F(ct_hf_save_options, arch)),
    STRUCT(ct_lora_options,
        F(ct_lora_options, rank),
        F(ct_lora_options, alpha),
        F(ct_lora_options, targets)),
    STRUCT(ct_sample_options,
        F(ct_sample_options, temperature),
        F(ct_sample_options, top_k),
        F(ct_sample_options, top_p)),
    STRUCT(ct_generate_options,
        F(ct_generate_options, max_new_tokens),
        F(ct_generate_options, sample),
        F(ct_generate_options, seed),
        F(ct_generate_options, eos_token),
        F(ct_generate_options, no_cache),
        F(ct_generate_options, on_step),
        F(ct_generate_options, ctx)),
    STRUCT(ct_generate_stats,
        F(ct_generate_stats, prompt_tokens),
        F(ct_generate_stats, new_tokens),
        F(ct_generate_stats, prompt_seconds),
        F(ct_generate_stats, decode_seconds)),
    STRUCT(ct_jit_binding,
        F(ct_jit_binding, name),
        F(ct_jit_binding, dtype),
        F(ct_jit_binding, ndim),
        F(ct_jit_binding, shape),
        F(ct_jit_binding, data),
        F(ct_jit_binding, requires_grad)),
    STRUCT(ct_jit_stats,
        F(ct_jit_stats, table_hits),
        F(ct_jit_stats, cache_hits),
        F(ct_jit_stats, compiles),
        F(ct_jit_stats, rebuilt),
        F(ct_jit_stats, processes)),
    STRUCT(ct_attn_tile,
        F(ct_attn_tile, b),
        F(ct_attn_tile, h),
        F(ct_attn_tile, q0),
        F(ct_attn_tile, nq),
        F(ct_attn_tile, kv0),
        F(ct_attn_tile, nkv),
        F(ct_attn_tile, q_stride),
        F(ct_attn_tile, kv_stride)),
    STRUCT(ct_mask_mod,
        F(ct_mask_mod, tile),
        F(ct_mask_mod, block),
        F(ct_mask_mod, ctx),
        F(ct_mask_mod, destroy),
        F(ct_mask_mod, uses_b),
        F(ct_mask_mod, uses_h)),
    STRUCT(ct_score_mod,
        F(ct_score_mod, fwd),
        F(ct_score_mod, grad),
        F(ct_score_mod, ctx),
        F(ct_score_mod, destroy),
        F(ct_score_mod, param_grad),
        F(ct_score_mod, param_len)),
    STRUCT(ct_block_mask,
        F(ct_block_mask, B),
        F(ct_block_mask, H),
        F(ct_block_mask, q_len),
        F(ct_block_mask, kv_len),
        F(ct_block_mask, block_size),
        F(ct_block_mask, num_q_blocks),
        F(ct_block_mask, num_kv_blocks),
        F(ct_block_mask, mask_mod),
        F(ct_block_mask, kv_ptr),
        F(ct_block_mask, full_kv_ptr),
        F(ct_block_mask, kv_idx),
        F(ct_block_mask, full_kv_idx),
        F(ct_block_mask, q_ptr),
        F(ct_block_mask, full_q_ptr),
        F(ct_block_mask, q_idx),
        F(ct_block_mask, full_q_idx),
        F(ct_block_mask, tiles),
        F(ct_block_mask, q_tile),
        F(ct_block_mask, bytes)),
    STRUCT(ct_block_mask_options,
        F(ct_block_mask_options, block_size),
        F(ct_block_mask_options, store_partial)),
    STRUCT(ct_flex_options,
        F(ct_flex_options, scale),
        F(ct_flex_options, score_mod),
        F(ct_flex_options, grad_scratch_bytes)),
    STRUCT(ct_sdpa_options,
        F(ct_sdpa_options, scale),
        F(ct_sdpa_options, is_causal),
        F(ct_sdpa_options, attn_mask)),
    STRUCT(ct_ce_options,
        F(ct_ce_options, ignore_index),
        F(ct_ce_options, reduction),
        F(ct_ce_options, label_smoothing),
        F(ct_ce_options, class_weight),
        F(ct_ce_options, z_loss),
        F(ct_ce_options, softcap),
        F(ct_ce_options, scratch_bytes)),
    STRUCT(ct_ce_outputs,
        F(ct_ce_outputs, loss),
        F(ct_ce_outputs, z_loss),
        F(ct_ce_outputs, lse)),
    STRUCT(ct_lce_inputs,
        F(ct_lce_inputs, h),
        F(ct_lce_inputs, weight),
        F(ct_lce_inputs, bias),
        F(ct_lce_inputs, dtype),
        F(ct_lce_inputs, target),
        F(ct_lce_inputs, target_dtype),
        F(ct_lce_inputs, N),
        F(ct_lce_inputs, D),
        F(ct_lce_inputs, V)),
    STRUCT(ct_lce_grads,
        F(ct_lce_grads, dh),
        F(ct_lce_grads, dweight),
        F(ct_lce_grads, dbias),
        F(ct_lce_grads, accumulate)),
};
/* clang-format on */

static const abi_struct *find(const char *fn, const char *name)
{
    if (!name) {
        ct_error(CT_EINVAL, "%s: name must not be NULL", fn);
        return NULL;
    }
    for (size_t i = 0; i < sizeof structs / sizeof structs[0]; i++)
        if (!strcmp(structs[i].name, name)) return &structs[i];
    ct_error(CT_EINVAL, "%s: '%.200s' is not a struct whose layout this library exports", fn, name);
    return NULL;
}

ct_status ct_abi_struct_layout(const char *name, size_t *size, int *nfields)
{
    const char *fn = "ct_abi_struct_layout";
    if (!size || !nfields) return ct_error(CT_EINVAL, "%s: size and nfields must not be NULL", fn);
    const abi_struct *s = find(fn, name);
    if (!s) return CT_EINVAL;
    *size = s->size;
    *nfields = s->nfields;
    return CT_OK;
}

ct_status ct_abi_struct_field(const char *name, int i, const char **field, size_t *offset,
                              size_t *size)
{
    const char *fn = "ct_abi_struct_field";
    if (!field || !offset || !size)
        return ct_error(CT_EINVAL, "%s: field, offset and size must not be NULL", fn);
    const abi_struct *s = find(fn, name);
    if (!s) return CT_EINVAL;
    if (i < 0 || i >= s->nfields)
        return ct_error(CT_EINVAL, "%s: field %d of %s is not in [0, %d)", fn, i, name, s->nfields);
    *field = s->fields[i].name;
    *offset = s->fields[i].offset;
    *size = s->fields[i].size;
    return CT_OK;
}
