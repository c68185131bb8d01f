/* fd.h: fdtrain's distributed layer for C (C11): the process group,
 * collectives on tm_tensors, ZeRO stages 0-3 for a tm_adamw, and activation
 * checkpointing. Includes tm.h (tensors, ops, AdamW; its ownership and error
 * rules apply here too).
 *
 * Use (every rank runs the same program, e.g. under mpirun):
 *   fd_init(&argc, &argv);
 *   ... create parameters (same initial values on every rank) ...
 *   tm_adamw* adam = tm_adamw_create(params, n, lr, 0.9f, 0.999f, 1e-8f, 0.0f);
 *   fd_zero_optimizer* zero = fd_zero_wrap(adam, 2);
 *   for each step: forward on this rank's batch; tm_backward(loss); fd_zero_step(zero);
 *   fd_zero_free(zero); tm_adamw_free(adam); fd_finalize();
 *
 * Collectives follow the usual contract: every rank calls the same collectives
 * in the same order with matching shapes, dtypes and roots; a mismatch is
 * detected only where a rank can see it locally (a rank that cannot complete
 * a collective its peers entered ends the job through the communicator's
 * timeout). Argument errors are reported before any communication.
 */
#ifndef FDTRAIN_FD_H_
#define FDTRAIN_FD_H_

#include "tm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef tm_status fd_status; /* FD functions return the TM_* codes */

typedef struct fd_zero_optimizer fd_zero_optimizer;

/* The last error message of the calling thread: the same as tm_last_error(). */
TM_API const char* fd_last_error(void);

/* Joins the process group: MPI when launched by an MPI launcher with more than
 * one rank (or FDTRAIN_FORCE_MPI=1), otherwise a world of one. argc/argv may
 * be NULL. Call once, before any other fd_* function. */
TM_API fd_status fd_init(int* argc, char*** argv);
/* Leaves the process group (MPI_Finalize). Free every fd_zero_optimizer
 * first. After it no fd_* function may be called. */
TM_API fd_status fd_finalize(void);
/* This process's rank in [0, world) and the world size; -1 before fd_init. */
TM_API int fd_rank(void);
TM_API int fd_world_size(void);

/* In place: t becomes the elementwise sum of t over all ranks (float or i32;
 * 16-bit sums are computed in fp32 and rounded once). */
TM_API fd_status fd_all_reduce(tm_tensor* t);
/* Every rank's t gets root's t (root in [0, world)); any dtype. */
TM_API fd_status fd_broadcast(tm_tensor* t, int root);
/* recv (numel = world * numel(send), same dtype, any shape) gets every rank's
 * send concatenated in rank order: rank r's at element offset r * numel(send). */
TM_API fd_status fd_all_gather(const tm_tensor* send, tm_tensor* recv);
/* send has numel = world * numel(recv) (same dtype, any shapes): rank r's recv
 * gets the elementwise sum over ranks of elements [r*n, (r+1)*n) of send,
 * n = numel(recv). Float dtypes or i32. */
TM_API fd_status fd_reduce_scatter(const tm_tensor* send, tm_tensor* recv);

/* Puts opt under ZeRO stage 0-3 (0: replicated; 1: optimizer state sharded;
 * 2: + gradients sharded; 3: + parameters sharded, gathered for use) over
 * exactly opt's parameters, on all ranks (collective). Call before opt's first
 * step; from then on use fd_zero_step, not tm_adamw_step. The parameters stay
 * readable and usable in ops on every rank between steps at every stage (stage
 * 3 keeps them gathered; its saving is in optimizer state and gradients).
 * The wrapper borrows opt, which must outlive it. NULL on error; the caller
 * owns the result and frees it with fd_zero_free. */
TM_API fd_zero_optimizer* fd_zero_wrap(tm_adamw* opt, int stage);
/* One step (collective): sums the gradients of the parameters over ranks
 * (reduce-scatter) and averages them (divides by the world size), updates
 * with opt's AdamW settings and learning rate (no gradient clipping), gathers
 * the new parameters to every rank, and zeros the gradients for the next
 * backward. At a fixed world size stages 0-3 give bitwise identical weights. */
TM_API fd_status fd_zero_step(fd_zero_optimizer* z);
/* Global L2 norm of the averaged gradients at the last fd_zero_step (-1 before any). */
TM_API double fd_zero_last_grad_norm(const fd_zero_optimizer* z);
/* Frees z (NULL is ignored). opt's parameters keep their current values;
 * opt can neither be stepped (tm_adamw_step) nor wrapped again. */
TM_API void fd_zero_free(fd_zero_optimizer* z);

/* Activation checkpointing: returns fn(input) (a new tensor, caller frees)
 * without keeping fn's intermediate activations; backward calls fn again on
 * input to recompute them (so fn must compute the same values every call and
 * may read other tensors, e.g. parameters, that stay unchanged until
 * backward). fn borrows its argument (must not free it), frees what it
 * creates except its result, and returns a new tensor that this function
 * takes over (or NULL with the error set, which fails the call, or the
 * backward that recomputes). NULL on error. */
TM_API tm_tensor* fd_checkpoint(tm_tensor* (*fn)(tm_tensor*), tm_tensor* input);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FDTRAIN_FD_H_ */
