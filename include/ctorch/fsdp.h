/*
 * ctorch/fsdp.h - training the GPT of model.h over N processes: FSDP2-style sharding
 * (fully_shard) and plain data parallel, on the communicators of comm.h.
 *
 * Parameter groups are made like fully_shard applied bottom-up: one group per transformer
 * block (every tensor named layers.{i}.*), and one root group with the embedding, the untied
 * head and the final norm. In CT_FSDP_FULL_SHARD mode every tensor of a group is split on
 * dim 0 into N chunks of ceil(rows / N) rows (the last ones padded with zero rows), and rank r
 * keeps chunk r of each tensor, concatenated: its shard of the group. A group's parameters are
 * gathered by ONE all-gather of the shards into a staging buffer and copied out (upcast when
 * the all-gather dtype is bf16) into a block buffer that the model's per-block forward and
 * backward read; its gradients, accumulated into an unsharded buffer, are packed by rank and
 * reduced by ONE reduce-scatter (f32) into the shard gradient. Parameters, gradients and the
 * AdamW moments exist only as shards: per rank about 1/N of the training state, plus the
 * gathered block buffers (prefetch depth + 1 blocks, and the root group while it is held).
 *
 * CT_FSDP_REPLICATE is plain data parallel: every rank holds all parameters (laid out by
 * group), and each group's gradients form one bucket, all-reduced (SUM, f32) as soon as the
 * group's backward has produced them, while the backward of the groups below goes on.
 *
 * Overlap: collectives run on the comm layer's async work. In the forward, block i+1's
 * all-gather (forward_prefetch blocks ahead) is in flight while block i computes; in the
 * backward, block i-1's all-gather and block i+1's reduce-scatter run while block i's backward
 * computes. With separate_reduce_scatter_comm (default) reduce-scatters run on a communicator
 * of their own (the analog of FSDPModule.set_separate_reduce_scatter_group), so they do not
 * queue behind all-gathers. The time the calling thread waits on collectives ("exposed") and
 * the total time collectives ran are measured per step (ct_fsdp_stats).
 *
 * Numerics: compute follows the model options' dtype (ct_gpt_options.dtype). f32: every
 * product in f32. bf16: each rank computes as the one-process bf16 model does, its GEMMs on
 * a bf16 copy (round to nearest even) of the weights it computes with: FSDP rounds each
 * gathered group into a copy held with the group's gathered buffers (per gathered block, never
 * a whole bf16 model), data parallel rounds its replica at every forward. Gradients, their
 * reductions, clipping, AdamW and its state stay f32. param_dtype bf16 is the all-gather dtype
 * alone (parameters are kept in f32 and rounded for the transfer, upcast after it). Reductions
 * run in a fixed order (the tcp backend's), so a run is bitwise reproducible for a given N and
 * backend, and agrees with the one-process run to rounding (the rows of a batch are split
 * across ranks, so sums are formed in another order; in bf16 such a difference can move a
 * value across a rounding boundary).
 */
#ifndef CTORCH_FSDP_H
#define CTORCH_FSDP_H

#include "ctorch/comm.h"
#include "ctorch/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/** How parameters live across ranks. */
typedef enum ct_fsdp_mode {
    CT_FSDP_FULL_SHARD = 0, /**< sharded parameters, gradients and optimizer state (FSDP) */
    CT_FSDP_REPLICATE = 1,  /**< replicated parameters, bucketed all_reduce (data parallel) */
} ct_fsdp_mode;

/** Options of a sharded model. */
typedef struct ct_fsdp_options {
    ct_fsdp_mode mode;          /**< default CT_FSDP_FULL_SHARD */
    bool reshard_after_forward; /**< blocks free their gathered parameters after their forward
                                     (and regather in the backward); default true */
    bool root_reshard_after_forward; /**< the same for the root group; default false (as FSDP2
                                          does for the root module) */
    const bool *group_reshard_after_forward; /**< NULL (default), or one flag per group
                                                  (ct_fsdp_num_groups; group 0 is the root,
                                                  group 1 + i block i), overriding both above;
                                                  read at creation */
    int forward_prefetch;  /**< all-gathers issued ahead in the forward, 0..8; default 1 */
    int backward_prefetch; /**< all-gathers issued ahead in the backward, 0..8; default 1 */
    ct_dtype param_dtype;  /**< all-gather dtype: CT_DTYPE_F32 (default) or CT_DTYPE_BF16
                                (FULL_SHARD only; the compute dtype is the model options') */
    ct_dtype reduce_dtype; /**< gradient reduction dtype: CT_DTYPE_F32 only (default) */
    double gradient_divide_factor; /**< reduced gradients are divided by it; 0 (default): the
                                        world size (gradients averaged, as FSDP2) */
    bool requires_gradient_sync;   /**< reduce gradients at the end of each backward; set it
                                        false (ct_fsdp_set_requires_gradient_sync) for the
                                        non-final micro-batches of an accumulation: gradients
                                        then accumulate unsharded; default true */
    bool separate_reduce_scatter_comm; /**< reduce-scatter / bucket all_reduce on a
                                            communicator of its own; default true */
    bool overlap; /**< default true; false waits for every collective as soon as it is
                       issued (no prefetch): the serialized baseline */
    double timeout_s; /**< per collective; <= 0 (default): the communicator's */
} ct_fsdp_options;

/** The defaults listed above. */
CT_API ct_fsdp_options ct_fsdp_options_default(void);

/** Parse "fsdp" / "dp" (CT_EINVAL otherwise) and name a mode. */
CT_API ct_status ct_fsdp_mode_from_name(const char *name, ct_fsdp_mode *out);
CT_API const char *ct_fsdp_mode_name(ct_fsdp_mode mode);

/** Measurements (since creation or the last ct_fsdp_reset_stats) and memory. */
typedef struct ct_fsdp_stats {
    double exposed_s;      /**< time the calling thread waited on collectives */
    double collective_s;   /**< total time the collectives ran (start to completion) */
    int64_t collectives;   /**< collectives issued */
    double bytes_sent;     /**< bytes this rank contributed to them */
    size_t state_bytes;    /**< parameters + gradients + AdamW moments held by this rank */
    size_t gathered_bytes; /**< gathered block buffers allocated now (parameters, staging) */
    size_t peak_gathered_bytes; /**< most gathered block buffers at once */
    size_t block_bytes;    /**< the largest group's gathered buffers (one block's worth) */
    int64_t block_computes; /**< transformer-block forwards and backwards run */
    int64_t block_computes_overlapped; /**< of those, the ones that started while a collective
                                            was issued and not yet waited for (another block's
                                            all-gather or a reduce-scatter / bucket all_reduce):
                                            0 without overlap */
} ct_fsdp_stats;

/** A model whose parameters live across the ranks of a communicator (opaque). */
typedef struct ct_fsdp ct_fsdp;

/** Create the sharded model on every rank of comm (collective: every rank calls it with the
 *  same configuration and options). comm is borrowed (it must outlive the model); the
 *  reduce-scatter communicator and a second all-gather one are split from it. Weights are
 *  zero: call ct_fsdp_init or load them. mopt->batch is the most rows a rank passes;
 *  mopt->dtype (f32 or bf16) is the compute dtype (see Numerics above). */
CT_API ct_status ct_fsdp_create(ct_comm *comm, const ct_gpt_config *cfg,
                                const ct_gpt_options *mopt, const ct_fsdp_options *opt,
                                ct_fsdp **out);
/** Free (waits for outstanding collectives). NULL is a no-op. */
CT_API void ct_fsdp_free(ct_fsdp *f);

/** Rank and world size of the model's communicator; its groups (root first). */
CT_API int ct_fsdp_rank(const ct_fsdp *f);
CT_API int ct_fsdp_world_size(const ct_fsdp *f);
CT_API int ct_fsdp_num_groups(const ct_fsdp *f);
CT_API const ct_fsdp_options *ct_fsdp_get_options(const ct_fsdp *f);

/** The weights ct_gpt_init(seed) gives, each rank keeping its shard (no communication). */
CT_API ct_status ct_fsdp_init(ct_fsdp *f, uint64_t seed);

/** Set every (shard) gradient to zero. */
CT_API void ct_fsdp_zero_grad(ct_fsdp *f);

/** Set requires_gradient_sync (see ct_fsdp_options). Pending unsynced gradients are reduced
 *  by the next backward that runs with it true. */
CT_API void ct_fsdp_set_requires_gradient_sync(ct_fsdp *f, bool sync);

/** Forward and backward of this rank's B rows of T + 1 tokens, as ct_gpt_forward_backward
 *  (collective). Each rank's d loss / d params is scaled by grad_scale, then (when syncing)
 *  summed over ranks and divided by gradient_divide_factor into the shard gradients, which
 *  ACCUMULATE. *loss (may be NULL): this rank's mean loss over its rows. B may be 0 (a rank
 *  without rows still takes part in the collectives). */
CT_API ct_status ct_fsdp_forward_backward(ct_fsdp *f, const int32_t *tokens, int64_t B, int64_t T,
                                          float grad_scale, float *loss);

/** Forward only: this rank's mean plain cross-entropy over its B rows (collective; B may be
 *  0, *loss is then 0). */
CT_API ct_status ct_fsdp_forward(ct_fsdp *f, const int32_t *tokens, int64_t B, int64_t T,
                                 float *loss);

/** Global gradient norm (collective): partial squared norms of the shards in double, summed
 *  by one all_reduce in rank order; clipped as ct_clip_grad_norm when max_norm > 0. */
CT_API ct_status ct_fsdp_clip_grad_norm(ct_fsdp *f, float max_norm, double *norm);

/** AdamW on the local shard (matrices decayed, norms not), step 1-based, as ct_adamw_step.
 *  Gathered copies of the parameters are dropped (the next forward gathers the new ones). */
CT_API ct_status ct_fsdp_adamw_step(ct_fsdp *f, int64_t step, const ct_adamw_options *opt);

/** Sum of v[0..n) over ranks in rank order, in place (collective, f64, on the model's world
 *  communicator). */
CT_API ct_status ct_fsdp_all_reduce_f64(ct_fsdp *f, double *v, int n);

/** Measurements so far; reset them. */
CT_API void ct_fsdp_get_stats(const ct_fsdp *f, ct_fsdp_stats *out);
CT_API void ct_fsdp_reset_stats(ct_fsdp *f);

/** Tensor i (0 .. ct_gpt num_tensors - 1, model.h order): its name and shape, the dim-0 rows
 *  [*row0, *row1) this rank holds (all of them when replicated; possibly none), and pointers
 *  to those rows of the parameter and of the two AdamW moments (any out pointer may be NULL).
 *  CT_EINVAL for a bad index. */
CT_API ct_status ct_fsdp_tensor(ct_fsdp *f, int i, const char **name, int *ndim, int64_t shape[2],
                                int64_t *row0, int64_t *row1, float **param, float **exp_avg,
                                float **exp_avg_sq);
CT_API int ct_fsdp_num_tensors(const ct_fsdp *f);

/* ---- distributed training ---------------------------------------------------------------- */

/** A training run over the ranks of a communicator: ct_trainer's data order, schedule,
 *  clipping and AdamW on a ct_fsdp model (opaque). `opt->batch` is the GLOBAL micro-batch:
 *  rank r of N takes rows [r B / N, (r + 1) B / N); B not divisible by N is CT_EINVAL (an
 *  elastic shrink may later leave an uneven split: loss and gradients are weighted by rows).
 *  Every row gets the one-process trainer's loss gradient, (1 / accum) / (B T), and the
 *  reductions only sum (the trainer's model has gradient_divide_factor 1, whatever fopt
 *  says). opt->dtype bf16 computes in bf16 (Numerics above), as ct_trainer does in one
 *  process; checkpoints record it and stay f32.
 *  Evaluation runs on all ranks (each its rows of every held-out batch) and is averaged. */
typedef struct ct_fsdp_trainer ct_fsdp_trainer;

/** Create on every rank (collective). comm, train and eval are borrowed. */
CT_API ct_status ct_fsdp_trainer_create(ct_comm *comm, const ct_gpt_config *cfg,
                                        const ct_train_options *opt,
                                        const ct_fsdp_options *fopt, const int32_t *train,
                                        int64_t n_train, const int32_t *eval, int64_t n_eval,
                                        ct_fsdp_trainer **out);
CT_API void ct_fsdp_trainer_free(ct_fsdp_trainer *t);
CT_API ct_fsdp *ct_fsdp_trainer_model(ct_fsdp_trainer *t);
CT_API int64_t ct_fsdp_trainer_step_count(const ct_fsdp_trainer *t);
/** One optimizer step (collective); info as ct_trainer_step (loss: the global mean). */
CT_API ct_status ct_fsdp_trainer_step(ct_fsdp_trainer *t, ct_train_step_info *info);
/** The held-out loss over all ranks (collective), as ct_trainer_evaluate. */
CT_API ct_status ct_fsdp_trainer_evaluate(ct_fsdp_trainer *t, float *loss);

/** Sharded checkpoint (collective): OUT/checkpoint-<step>/ gets one safetensors file per
 *  rank (model-<r>-of-<N>.safetensors: the rank's rows of every parameter and AdamW moment,
 *  under the names of ct_trainer_save), then rank 0 writes index.json
 *  {"format": "ctorch-sharded", "world_size": N, "step": s, "metadata": {...},
 *   "tensors": {name: {"shape", "dtype", "shards": [{"file", "begin", "end"}]}}} (dim-0
 *  ranges, padding excluded), then COMMITTED, then switches OUT/latest (a symbolic link to
 *  checkpoint-<step>) by rename. A crash before COMMITTED leaves the previous checkpoint and
 *  OUT/latest as they were. The metadata are ct_trainer_save's plus n_extra caller pairs. */
CT_API ct_status ct_fsdp_trainer_save(ct_fsdp_trainer *t, const char *out_dir, size_t n_extra,
                                      const char *const *keys, const char *const *values);

/** Restore from a single-file checkpoint (ct_trainer_save's) or a committed sharded
 *  directory written with any world size (collective): each rank reads only the rows it
 *  holds. Errors as ct_trainer_load; CT_EFORMAT for a directory without COMMITTED. */
CT_API ct_status ct_fsdp_trainer_load(ct_fsdp_trainer *t, const char *path);

/** Continue on a new communicator (after ct_comm_shrink; collective on it): the model is
 *  rebuilt for the new world size. Replicated: every survivor keeps the parameters and
 *  moments of the last completed step, and the interrupted step is redone. Sharded: the
 *  weights are then undefined: load the last committed checkpoint (ct_fsdp_trainer_load). */
CT_API ct_status ct_fsdp_trainer_rebuild(ct_fsdp_trainer *t, ct_comm *comm);

/* ---- sharded checkpoint files ------------------------------------------------------------ */

/** Resolve a checkpoint path: a committed sharded directory, a run folder holding `latest`,
 *  or a file. *dir true when it is sharded; the resolved path (ct_alloc'd) in *resolved. */
CT_API ct_status ct_sharded_checkpoint_resolve(const char *path, char **resolved, bool *dir);

/** One metadata value of a committed sharded checkpoint directory (ct_alloc'd copy in
 *  *value; CT_EFORMAT when the index lacks it). */
CT_API ct_status ct_sharded_checkpoint_metadata(const char *dir, const char *key, char **value);

/** Verify a sharded checkpoint directory: the index, and that every tensor's shards tile its
 *  rows [0, rows) in order and are in their files with those shapes (each file fully
 *  validated as safetensors). *summary (ct_alloc'd JSON: directory, world_size, step, tensors,
 *  elements, files, metadata) on success. */
CT_API ct_status ct_sharded_checkpoint_verify(const char *dir, char **summary);

/** The sharded form of ct_gpt_checkpoint_check, before anything the model's size is
 *  allocated: ct_sharded_checkpoint_verify (the shards hold every row the index lists), the
 *  index's "config" into *cfg, every parameter tensor that configuration has listed with its
 *  shape and a float dtype, and with trainer_state the moments, the "train" options (the
 *  trainer's rules and caps) and the trainer state ("step", "epoch", "data_pos" in
 *  [0, 2^63), "rng" not all zero). CT_EFORMAT names what breaks a rule. */
CT_API ct_status ct_sharded_checkpoint_check(const char *dir, bool trainer_state,
                                             ct_gpt_config *cfg);

/** Write the single-file checkpoint (format "ctorch-gpt", as ct_trainer_save) that a sharded
 *  directory holds: what `generate` and single-process `train --resume` take. */
CT_API ct_status ct_sharded_checkpoint_consolidate(const char *dir, const char *out_file);

#ifdef __cplusplus
}
#endif
#endif
