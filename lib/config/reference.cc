// The recipe reference. Each default here is the default of the matching
// field in recipe.h; tests/config/reference_test.cc checks them against the
// resolved recipe of a default Recipe, so the two cannot disagree silently.
#include "lib/config/reference.h"

#include <fmt/format.h>

#include <iterator>

namespace fd::config {

const std::vector<SectionDoc>& section_reference() {
  static const std::vector<SectionDoc> s = {
      {"model", "The network: a GPT-2 style decoder (Hugging Face GPT-2 names and layouts)."},
      {"data",
       "Training and validation data. Paths and globs are resolved from the working directory; a "
       "pattern that matches no file is an error."},
      {"batch", "Sequences per micro-batch, gradient accumulation and the global batch."},
      {"optimizer", "AdamW on fp32 (master) weights."},
      {"schedule", "The learning-rate schedule: linear warmup, then constant or cosine decay."},
      {"loss_scale",
       "Dynamic loss scaling for fp16, with DeepSpeed's names and meaning. Ignored unless "
       "precision is fp16."},
      {"zero", "ZeRO partitioning of model state over the ranks (docs/ZERO.md)."},
      {"dist", "Multi-rank behaviour."},
      {"parallel",
       "Pipeline and tensor parallelism composed with ZeRO data parallelism: the ranks form "
       "parallel.pipeline stages x D data-parallel replicas x parallel.tensor tensor-parallel "
       "ranks (D = ranks / (pipeline x tensor); rank = (stage * D + replica) * tensor + tp "
       "rank); each stage owns a contiguous run of transformer blocks, the embedding with the "
       "first, the final norm, head and loss with the last; each tensor-parallel group splits "
       "every layer's heads, MLP width and vocabulary (Megatron-LM). The pipeline's "
       "micro-batches are batch.accumulation's."},
      {"lora",
       "LoRA adapters. Absent or null: full fine-tuning; a map turns adapters on and trains only "
       "them."},
      {"objective",
       "Preference training on data.format preference pairs: DPO, SimPO or ORPO with current "
       "TRL's definitions and defaults (docs/OBJECTIVES.md). Absent or null: next-token loss."},
      {"activation_checkpointing",
       "Blocks whose activations are recomputed in backward instead of stored."},
      {"checkpoint", "Sharded checkpoints in RUN/checkpoints/step_XXXXXXXX/ (docs/FORMAT.md)."},
      {"logging",
       "Progress lines, metrics, validation, and the text sample generated after training."},
  };
  return s;
}

const std::vector<KeyDoc>& key_reference() {
  static const std::vector<KeyDoc> k = {
      // model
      {"model.arch", "string", "gpt2", "gpt2, llama, mistral, qwen2, qwen3",
       "model family: gpt2 (LayerNorm, learned positions, GELU MLP, tied head) or the Llama "
       "family (RMSNorm, RoPE, SwiGLU MLP; qwen2 adds q/k/v biases, qwen3 per-head q/k norm)"},
      {"model.n_layer", "int", "4", ">= 1", "transformer blocks"},
      {"model.n_head", "int", "4", ">= 1", "attention heads per block"},
      {"model.d_model", "int", "128", ">= 1, divisible by model.n_head", "embedding width"},
      {"model.vocab_size", "int", "256", ">= 1; >= 256 with data.format text", "token vocabulary"},
      {"model.max_seq_len", "int", "256", ">= 1, >= data.seq_len",
       "context length (rows of the position embedding)"},
      {"model.n_kv_head", "int", "model.n_head", ">= 1, divides model.n_head; not gpt2",
       "key/value heads (grouped-query attention; 1 = multi-query)"},
      {"model.head_dim", "int", "d_model / n_head", ">= 2, even; not gpt2",
       "width of each head (Qwen3 uses n_head * head_dim != d_model)"},
      {"model.d_ff", "int", "", ">= 1; required for the Llama family, not gpt2",
       "the MLP's inner width (intermediate_size)"},
      {"model.norm_eps", "float", "1e-5 (llama, mistral), 1e-6 (qwen2, qwen3)", "> 0; not gpt2",
       "RMSNorm epsilon (rms_norm_eps)"},
      {"model.rope_theta", "float", "10000 (llama, mistral), 1e6 (qwen2, qwen3)", "> 0; not gpt2",
       "RoPE base"},
      {"model.rope_scaling", "string", "none", "none, linear, llama3; not gpt2",
       "RoPE frequency scaling (rope_scaling.rope_type)"},
      {"model.rope_factor", "float", "1", "> 0", "linear and llama3 scaling: the factor"},
      {"model.rope_low_freq_factor", "float", "1", "> 0", "llama3 scaling: low_freq_factor"},
      {"model.rope_high_freq_factor", "float", "4", "> model.rope_low_freq_factor",
       "llama3 scaling: high_freq_factor"},
      {"model.rope_original_max_seq_len", "int", "0", ">= 1 with llama3",
       "llama3 scaling: original_max_position_embeddings"},
      {"model.tie_embeddings", "bool", "false", "not gpt2 (always tied)",
       "the output head reuses the embedding matrix (tie_word_embeddings)"},
      {"model.attention_bias", "bool", "false (qwen2: true)", "not gpt2; qwen2 always",
       "biases on the q, k, v and (llama, qwen3) o projections, as Hugging Face's "
       "attention_bias; qwen2 has q, k, v biases and none on o"},
      {"model.mlp_bias", "bool", "false", "llama only",
       "biases on the MLP's gate, up and down projections (mlp_bias)"},
      {"model.qk_norm", "bool", "false (qwen3: true)", "not gpt2; qwen3 always",
       "per-head RMSNorm of q and k before RoPE"},
      {"model.init_from", "string", "\"\"", "an existing file or directory",
       "start from these weights instead of a random init: a Hugging Face model directory "
       "(config.json + model.safetensors or shards; its config.json then decides the model "
       "section), an `fdtrain ckpt export` (.safetensors or .h5) or a Hugging Face GPT-2 "
       "model.safetensors; every parameter must be present with the model's shape. \"\" = "
       "random init"},
      {"model.quantize.type", "string", "nf4", "nf4, fp4",
       "QLoRA: the frozen base's transformer-block linears stored in 4 bits with bitsandbytes' "
       "blockwise quantization (bnb_4bit_quant_type; docs/QUANTIZATION.md), the adapters "
       "training over them. model.quantize absent or null: the base in the compute dtype. "
       "Needs a lora section; not with zero.offload_params. A "
       "bitsandbytes 4-bit model.init_from directory needs it, with its type and double_quant"},
      {"model.quantize.block_size", "int", "64", "32, 64, 128, 256, 512, 1024, 2048, 4096",
       "weights per absmax scale (bitsandbytes' blocksize); a 4-bit model.init_from "
       "directory's weights must have been saved with it"},
      {"model.quantize.double_quant", "bool", "true", "true, false",
       "the per-block absmax scales themselves quantized to 8 bits in blocks of 256 "
       "(bnb_4bit_use_double_quant)"},
      // data
      {"data.format", "string", "text", "text, tokens, chat, instruct, preference",
       "text: raw bytes, byte tokenizer (token = byte, vocab 256), or documents with "
       "data.tokenizer; tokens: llm.c / nanoGPT .bin token files; chat: conversations "
       "(.jsonl/.json records with messages [{role, content}] or ShareGPT conversations [{from, "
       "value}]) rendered with the chat template, loss on the assistant's answers; instruct: "
       "Alpaca records (instruction, optional input, output) as a user/assistant exchange; "
       "preference: TRL's preference pairs (prompt, chosen, rejected: strings, or message "
       "lists rendered with the chat template), split into prompt and completions as TRL's "
       "DPOTrainer does"},
      {"data.train", "path or list", "", "existing files",
       "training files: paths or globs, concatenated in order"},
      {"data.val", "path or list", "[]", "existing files",
       "validation files; when empty the last data.val_fraction of the training tokens is held "
       "out"},
      {"data.val_fraction", "number", "0.05", "[0, 0.5]",
       "share of the training tokens held out for validation when data.val is empty"},
      {"data.seq_len", "int", "128", "1 .. model.max_seq_len", "tokens per training sequence"},
      {"data.tokenizer", "path", "\"\"", "a directory with tokenizer.json",
       "with data.format text: a Hugging Face tokenizer; each file (each line's \"text\" of a "
       ".jsonl file) is one document, encoded with the tokenizer's BOS and EOS, as fdtrain "
       "tokenize writes it; \"\" = the byte tokenizer"},
      {"data.chat_template", "string", "\"\"", "\"\", chatml, llama3, alpaca, or a file",
       "chat, instruct and preference: the Jinja chat template; \"\" = data.tokenizer's own "
       "(tokenizer_config.json chat_template), rendered as Hugging Face's apply_chat_template"},
      {"data.template_vars", "map", "{}", "names to values",
       "chat, instruct and preference: variables for the chat template, as Hugging Face's "
       "apply_chat_template(**kwargs) passes them (Qwen 3's enable_thinking: false, Llama 3's "
       "date_string); a name the template never reads is a warning"},
      {"data.train_on_prompt", "bool", "false", "true, false",
       "chat and instruct: loss on every token, not only on the assistant's answers and their "
       "end-of-turn tokens"},
      {"data.packing", "bool", "false", "true, false",
       "chat, instruct, and text with data.tokenizer: several examples (documents) per row of "
       "seq_len tokens, attention and positions restarting at each; false: one example per row, "
       "padded; preference: several pairs per row (a pair never split)"},
      {"data.packing_order", "string", "best_fit", "best_fit, first_come",
       "with data.packing: which examples share a row; best_fit: best fit decreasing over "
       "windows of 8192 examples of a seeded shuffle (rows as full as the examples' lengths "
       "allow); first_come: that "
       "shuffle in order, an example that does not fit starting the next row"},
      {"data.truncation", "string", "error", "error, right, left",
       "an example longer than seq_len + 1 tokens: an error naming it, or keep its first "
       "(right) / last (left) seq_len + 1 tokens"},
      {"data.on_bad_record", "string", "error", "error, skip",
       "a record that breaks the format's rules: stop with FILE:LINE and the reason, or leave "
       "it out (counted in summary.json)"},
      {"data.max_length", "int", "0", "0, or 2 .. data.seq_len / 2 + 1",
       "preference: tokens per sequence (prompt + answer), the end cut; a pair whose prompt "
       "alone is this long is dropped (and counted); 0 = data.seq_len / 2 + 1"},
      {"data.messages_field", "string", "messages", "a JSON key",
       "chat: the record's message list (records with \"conversations\" are read as ShareGPT)"},
      {"data.instruction_field", "string", "instruction", "a JSON key",
       "instruct: the instruction"},
      {"data.input_field", "string", "input", "a JSON key",
       "instruct: the optional input (appended to the instruction after a blank line)"},
      {"data.output_field", "string", "output", "a JSON key", "instruct: the answer"},
      {"data.text_field", "string", "text", "a JSON key", "text: the document of a .jsonl record"},
      // batch
      {"batch.micro", "int", "8", ">= 1", "sequences per micro-batch per rank"},
      {"batch.accumulation", "int", "1", ">= 1", "micro-batches accumulated per optimizer step"},
      {"batch.global", "int", "0", ">= 0, a multiple of micro * accumulation",
       "total sequences per step over all ranks; 0 = micro * accumulation * ranks; when set it "
       "must equal that product at start-up"},
      // optimizer
      {"optimizer.name", "string", "adamw", "adamw", "the optimizer"},
      {"optimizer.lr", "number", "3e-4", "> 0", "peak learning rate"},
      {"optimizer.betas", "[number, number]", "[0.9, 0.999]", "each in [0, 1)",
       "Adam beta1, beta2"},
      {"optimizer.eps", "number", "1e-8", "> 0", "Adam epsilon"},
      {"optimizer.weight_decay", "number", "0.0", ">= 0",
       "decoupled weight decay (2-D weights only)"},
      {"optimizer.grad_clip", "number", "1.0", ">= 0",
       "clip the global gradient norm to this; 0 = off"},
      // schedule
      {"schedule.name", "string", "constant", "constant, cosine",
       "lr after warmup: constant, or cosine decay to schedule.min_lr at the last step"},
      {"schedule.warmup_steps", "int", "0", ">= 0",
       "linear warmup from 0 to optimizer.lr; more than steps is a warning (lr never peaks)"},
      {"schedule.min_lr", "number", "0.0", ">= 0; <= optimizer.lr with cosine",
       "final lr of the cosine schedule"},
      // precision
      {"precision", "string", "fp32", "fp32, bf16, fp16",
       "compute dtype of parameters, gradients and activations; bf16 and fp16 keep fp32 master "
       "weights and Adam moments; fp16 uses loss_scale"},
      // loss_scale
      {"loss_scale.loss_scale", "number", "0.0", ">= 0", "fixed loss scale; 0 = dynamic"},
      {"loss_scale.initial_scale_power", "int", "16", "0 .. 126", "dynamic: start at 2^power"},
      {"loss_scale.loss_scale_window", "int", "1000", ">= 1",
       "dynamic: steps without overflow before the scale doubles"},
      {"loss_scale.hysteresis", "int", "2", ">= 1",
       "dynamic: overflows tolerated before the scale halves"},
      {"loss_scale.consecutive_hysteresis", "bool", "false", "",
       "dynamic: refill the hysteresis on every good step"},
      {"loss_scale.min_loss_scale", "number", "1.0", "> 0",
       "dynamic: the scale never drops below this"},
      // zero
      {"zero.stage", "int", "0", "0 .. 3",
       "0 replicates everything, 1 partitions optimizer state, 2 also gradients, 3 also "
       "parameters"},
      {"zero.overlap_comm", "bool", "true", "",
       "reduce each segment's gradient bucket asynchronously while backward continues; false "
       "reduces after backward"},
      {"zero.reduce_dtype", "string", "fp32", "fp32; or the precision (bf16, fp16)",
       "the dtype gradient sums are computed in (DeepSpeed's communication_data_type): fp32 "
       "widens 16-bit gradients to fp32, sums in fp32 and rounds once, so ZeRO stages stay "
       "bitwise identical; bf16/fp16 sums in that dtype, half the bytes on the wire, every "
       "partial sum rounded to 8 (bf16) or 11 (fp16) significant bits, the result depending "
       "on the world size and (NCCL) its algorithm (docs/ZERO.md, Reduction dtype)"},
      {"zero.reductions_in_flight", "int", "2", "1 .. 64",
       "with overlap_comm: gradient reductions left in flight while backward goes on; the "
       "oldest completes when one more is launched (stages 2-3 hold each one's gradient "
       "bucket until then; GPU runs order the completion on the device, without blocking "
       "the host)"},
      {"zero.offload_optimizer.device", "string", "none", "none, host, nvme",
       "where the fp32 master weights and Adam moments live (DeepSpeed's offload_optimizer): "
       "none keeps them with the run (in memory, or on the GPU); nvme keeps them in one file "
       "per rank under path and streams them through buffer_mib of buffers each step, so "
       "that resident memory for them is the buffers; host (GPU runs) keeps them in host "
       "memory and AdamW runs on the CPU, each segment's gradients coming down as backward "
       "reduces them and its parameters going up as soon as they are updated, through pinned "
       "buffers (on a GPU run nvme does the same with the state in the file)"},
      {"zero.offload_optimizer.path", "string", "\"\"", "an existing directory",
       "nvme: where each rank keeps its file (optimizer_rank_NNNNN.fdstate, removed when the run "
       "ends); a fast local disk"},
      {"zero.offload_optimizer.buffer_mib", "int", "64", "1 .. 1048576",
       "nvme: MiB of buffers per rank through which the state streams (three chunks: one "
       "being read, one being updated, one being written); host: sets the pieces the CPU "
       "update walks the state in (no buffers: the state is in memory)"},
      {"zero.offload_params.device", "string", "none", "none, nvme",
       "stage 3 with offload_optimizer nvme: each rank's parameter partition lives in the "
       "optimizer's file too (DeepSpeed's offload_param), rewritten by each step; a segment's "
       "partition is read for its all-gather, the next one read ahead, through two staging "
       "buffers of the largest partition"},
      {"zero.quantized_weights", "bool", "false", "stage 3, device cpu",
       "ZeRO++'s qwZ: parameters are all-gathered as int8 codes, blocks of 256 with an fp32 "
       "scale each (about half the bytes of bf16, a quarter of fp32), and computed with the "
       "decoded values; the fp32 master weights are untouched (docs/ZERO.md, ZeRO++)"},
      {"zero.hierarchical_partition", "bool", "false", "stage 3, device cpu",
       "ZeRO++'s hpZ: after each segment's forward gather a rank keeps 1/L of its parameters "
       "(L: the ranks on its host) in the compute dtype, and the backward gathers from those "
       "inside the host, none across hosts; costs 1/L of the model per rank (the estimate's "
       "hpZ row)"},
      {"zero.quantized_gradients", "string", "none", "none, int8, int4; stage 3, device cpu",
       "ZeRO++'s qgZ: the gradient reduce-scatter as a hierarchical all-to-all of int8 (blocks "
       "of 256) or int4 (blocks of 64) codes, decoded and summed in fp32 inside each host, "
       "then across hosts (DeepSpeed's scheme: no error feedback); none: the plain "
       "reduce-scatter"},
      // dist
      {"dist.timeout_s", "number", "600.0", "> 0",
       "a collective, MPI start-up or MPI shutdown that does not complete within this many "
       "seconds aborts the whole job, naming the rank and the operation; a rank stopped this "
       "long after it finished is killed so that the job ends"},
      {"dist.hierarchical", "bool", "false", "device cpu",
       "the data-parallel group's reduce-scatters, all-gathers and all-reduces run inside each "
       "host, then across hosts, then inside again: fewer bytes over the hosts' links "
       "(docs/ZERO.md, Hierarchical collectives); sums are grouped by host, so weights equal a "
       "one-host run's to rounding, not bit for bit; needs the same number of consecutive "
       "ranks on every host"},
      // parallel
      {"parallel.pipeline", "int", "1", ">= 1, <= model.n_layer, divides the ranks",
       "pipeline stages P; 1 = no pipeline. The ranks must be a multiple of P; ZeRO (stages "
       "0-2; stage 3 is refused) works across the D = ranks / P replicas of each stage, and "
       "only those D consume distinct data: the global batch is micro * accumulation * D"},
      {"parallel.tensor", "int", "1",
       ">= 1, divides model.n_head and the MLP width, divides or is divided by model.n_kv_head; "
       "pipeline x tensor divides the ranks",
       "tensor-parallel ranks T (Megatron-LM's layout): q/k/v, gate/up split by output "
       "features, o/down by input features, the embedding and the head by vocabulary rows "
       "(the loss never gathers the logits), norms whole; with fewer key/value heads than T "
       "every rank holds all of them. The T ranks of a group (consecutive ranks) read the same "
       "micro-batches: the global batch is micro * accumulation * ranks / (pipeline x T). "
       "ZeRO stages 0-3 work across the replicas holding the same slices; an objective "
       "(preference training) scores its log-probabilities vocabulary-parallel too. CPU only "
       "so far; with a pipeline each stage's layers split so (ZeRO-3 stays refused with a "
       "pipeline); not yet with model.quantize"},
      {"parallel.sequence_parallel", "bool", "false",
       "needs parallel.tensor > 1 dividing data.seq_len",
       "Megatron-LM's sequence parallelism: between the tensor-parallel regions (the norms, "
       "residual adds and the embedding's output) each of the T ranks holds 1/T of every "
       "sequence, so those activations take 1/T of the memory; each region's all-reduce "
       "becomes a reduce-scatter and an all-gather (the same bytes)"},
      {"parallel.sequence", "int", "1",
       ">= 1, divides data.seq_len and the query heads (per tensor-parallel rank); pipeline x "
       "sequence x tensor divides the ranks",
       "DeepSpeed-Ulysses sequence-parallel ranks S: they share each micro-batch, each computing "
       "seq_len / S positions of every sequence through every layer (activations ~1/S); around "
       "attention an all-to-all gives each the whole sequence for 1/S of the heads and another "
       "gives the positions back (key/value heads fewer than S: gathered whole). Positions and "
       "the causal mask are global, packed rows keep their documents. ZeRO works across the D x "
       "S ranks holding the same weights (with a pipeline: each stage's, sp rank u sending its "
       "slice of the hidden state to sp rank u of the next stage); an objective (preference "
       "training) sums each pair's log-probabilities over the S ranks. CPU only so far; not "
       "with sequence_parallel"},
      {"parallel.schedule", "string", "1f1b", "1f1b, gpipe",
       "the pipeline schedule over the step's M = batch.accumulation micro-batches: 1f1b "
       "alternates one forward and one backward after a warm-up, so stage s holds at most "
       "min(P - s, M) micro-batches' activations; gpipe runs all M forwards, then all M "
       "backwards, and holds all M. Both run the backwards in micro-batch order (gradients "
       "accumulate as without a pipeline) and idle (P-1)/(M+P-1) of a step"},
      {"parallel.partition", "string or list", "parameters",
       "parameters, uniform, or P ints >= 1 summing to model.n_layer",
       "how the blocks are split over the stages: parameters balances parameter counts (the "
       "embedding counts on the first stage, the final norm and an untied head on the last; "
       "the largest stage is made as small as possible), uniform gives every stage the same "
       "number of blocks (the remainder to the middle stages first), a list gives the blocks "
       "of each stage"},
      // lora
      {"lora.r", "int", "", ">= 1", "adapter rank"},
      {"lora.alpha", "number", "lora.r", "> 0", "scaling: the update is multiplied by alpha / r"},
      {"lora.dropout", "number", "0.0", "[0, 1)", "dropout on the adapter input"},
      {"lora.targets", "list", "[c_attn]",
       "non-empty; gpt2: each c_attn, c_proj, attn.c_proj, c_fc, mlp.c_proj, all-linear; Llama "
       "family: each q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, all-linear",
       "linear layers that get adapters (gpt2's c_proj = both projections); default [c_attn] "
       "for gpt2, [q_proj, v_proj] for the Llama family"},
      {"lora.layers", "all or list", "all", "block indices 0 .. model.n_layer-1",
       "blocks that get adapters"},
      {"lora.adapter", "string", "\"\"", "a PEFT adapter directory",
       "start the adapters from this directory (`fdtrain ckpt export --lora-adapter` or PEFT); "
       "\"\" = PEFT init (A Kaiming-uniform, B zero)"},
      // objective
      {"objective.name", "string", "", "dpo, simpo, orpo",
       "dpo: rewards relative to a reference model (DPOTrainer); simpo: reference-free, "
       "length-normalised, with a target margin (CPOTrainer, loss_type simpo); orpo: the chosen "
       "answer's NLL plus an odds-ratio term (ORPOTrainer). Needs data.format preference"},
      {"objective.loss_type", "string", "sigmoid", "sigmoid, ipo, hinge, robust",
       "dpo only: -log sigmoid(beta delta); IPO's squared per-token margin; hinge; robust "
       "(label-noise-corrected sigmoid, with label_smoothing)"},
      {"objective.beta", "number", "0.1", "> 0", "DPO's and SimPO's beta, ORPO's lambda"},
      {"objective.label_smoothing", "number", "0.0", "[0, 0.5)",
       "the assumed label-noise rate of dpo with loss_type robust and of simpo; current TRL "
       "ignores it elsewhere, so setting it elsewhere is refused"},
      {"objective.gamma", "number", "0.5", "any", "simpo only: the target reward margin"},
      {"objective.cpo_alpha", "number", "0.0", ">= 0",
       "simpo only: weight of an NLL term on the chosen answers (0 = pure SimPO)"},
      {"objective.reference", "string", "\"\"", "a Hugging Face model directory",
       "dpo only: the reference model, of the policy's architecture and vocabulary; \"\" = the "
       "initial weights (under LoRA: the base with the adapters off). Its log-probabilities are "
       "computed once per pair and kept in RUN/cache/"},
      // activation_checkpointing
      {"activation_checkpointing.layers", "none, all, list or map", "none",
       "none, all, block indices ([0, 2, 5]) or {every: k} (blocks 0, k, 2k, ...)",
       "blocks whose activations are recomputed in backward (the block keeps only its input; "
       "gradients are bitwise identical)"},
      // checkpoint
      {"checkpoint.every", "int", "0", ">= 0",
       "save a sharded checkpoint every N steps; 0 = only at the end (checkpoint.at_end)"},
      {"checkpoint.keep_last", "int", "3", ">= 1",
       "checkpoints kept on disk; older ones are deleted once a newer one is complete"},
      {"checkpoint.at_end", "bool", "true", "",
       "save after the last step, and when SIGTERM, SIGINT or SIGUSR1 stops the run"},
      {"checkpoint.async", "bool", "true", "",
       "save behind the step: with checkpoint.every > 0, a thread of each rank copies the "
       "state of the step boundary to memory beside the next step and writes it, committed once "
       "every rank's shard is on disk; false with zero.offload_optimizer.device: nvme"},
      // logging
      {"logging.every", "int", "10", ">= 1", "progress line and metrics every N steps"},
      {"logging.eval_every", "int", "0", ">= 0",
       "validation loss every N steps; 0 = only at the end"},
      {"logging.eval_batches", "int", "8", ">= 1", "micro-batches per validation pass"},
      {"logging.sample_tokens", "int", "200", ">= 0",
       "tokens of text generated at the end of training; 0 = none"},
      {"logging.sample_prompt", "string", "\"\"", "text; only with data.format text",
       "text the sample continues"},
      {"logging.sample_temperature", "number", "0.8", "> 0", "sampling temperature"},
      {"logging.sample_top_k", "int", "40", ">= 0", "sample among the k likeliest tokens; 0 = all"},
      // top level
      {"device", "string", "cpu", "cpu, cuda",
       "where to train: cpu (OpenBLAS + MPI) or cuda (kernels/, cuBLASLt, NCCL; one GPU per "
       "rank, chosen by the node-local rank)"},
      {"tf32", "bool", "true", "true, false",
       "fp32 GEMMs on a GPU use TF32 tensor cores (inputs rounded to 10-bit mantissas, fp32 "
       "accumulation; PyTorch's allow_tf32, Hugging Face's tf32); false: exact fp32. No effect "
       "on the CPU or with precision bf16/fp16"},
      {"threads", "int", "1", "1 .. 1024",
       "BLAS threads per rank, and the threads of the CPU AdamW (in memory or streamed from "
       "NVMe); more than the cores each rank has only slows it down"},
      {"seed", "int", "1337", ">= 0", "seeds initialisation, data order, dropout and sampling"},
      {"steps", "int", "", ">= 1", "optimizer steps to train"},
      {"max_loss", "float", "100", ">= 0",
       "a training loss above this ends the run as diverged (exit 1), as a non-finite one "
       "does; 0 = only non-finite. With an objective section it defaults to 0: a preference "
       "loss has its own scale (IPO's starts at (1 / (2 beta))^2)"},
  };
  return k;
}

namespace {

bool in_section(const KeyDoc& k, const std::string& section) {
  return k.path.size() > section.size() && k.path.compare(0, section.size(), section) == 0 &&
         k.path[section.size()] == '.';
}

bool is_top_level(const KeyDoc& k) { return k.path.find('.') == std::string::npos; }

// A Markdown table cell: '|' would end the cell.
std::string cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string code_or_dash(const std::string& s) {
  return s.empty() ? std::string("") : fmt::format("`{}`", cell(s));
}

// "  model.n_layer: int = 4  (>= 1)" and the meaning indented below.
void text_key(std::back_insert_iterator<std::string> out, const KeyDoc& k) {
  fmt::format_to(out, "  {}: {}{}{}\n      {}\n", k.path, k.type,
                 k.required() ? std::string(", required") : " = " + k.default_value,
                 k.allowed.empty() ? "" : fmt::format("  ({})", k.allowed), k.description);
}

void markdown_row(std::back_insert_iterator<std::string> out, const KeyDoc& k, size_t skip) {
  fmt::format_to(out, "| `{}` | {} | {} | {} | {} |\n", k.path.substr(skip), cell(k.type),
                 k.required() ? std::string("**required**") : code_or_dash(k.default_value),
                 cell(k.allowed), cell(k.description));
}

}  // namespace

std::string format_reference_text() {
  std::string s;
  auto out = std::back_inserter(s);
  fmt::format_to(out,
                 "Recipe keys (docs/RECIPE.md explains includes, overrides and errors).\n"
                 "Types: int, number (3e-4, 0.1, 2), bool (true/false, yes/no, on/off), string.\n");
  for (const SectionDoc& sec : section_reference()) {
    fmt::format_to(out, "\n{}: {}\n", sec.name, sec.description);
    for (const KeyDoc& k : key_reference())
      if (in_section(k, sec.name)) text_key(out, k);
  }
  fmt::format_to(out, "\ntop-level keys\n");
  for (const KeyDoc& k : key_reference())
    if (is_top_level(k)) text_key(out, k);
  return s;
}

std::string format_reference_markdown() {
  std::string s;
  auto out = std::back_inserter(s);
  fmt::format_to(out,
                 "# Recipe keys\n\n"
                 "<!-- Generated by scripts/gen_recipes_doc.sh from lib/config/reference.cc "
                 "(`fdtrain schema --markdown`); do not edit. -->\n\n"
                 "Every key a recipe may hold. How recipes are read (includes, overrides, "
                 "errors) is in [RECIPE.md](RECIPE.md); `fdtrain ls` lists the shipped "
                 "recipes.\n\n"
                 "Types: *int* is a whole number, *number* any number (`3e-4`, `0.1`, `2`), "
                 "*bool* is `true`/`false` (also `yes`/`no`, `on`/`off`), *string* any "
                 "scalar.\n");
  const char* header = "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const SectionDoc& sec : section_reference()) {
    fmt::format_to(out, "\n## `{}`\n\n{}\n\n{}", sec.name, sec.description, header);
    for (const KeyDoc& k : key_reference())
      if (in_section(k, sec.name)) markdown_row(out, k, sec.name.size() + 1);
  }
  fmt::format_to(out, "\n## Top-level keys\n\n{}", header);
  for (const KeyDoc& k : key_reference())
    if (is_top_level(k)) markdown_row(out, k, 0);
  return s;
}

}  // namespace fd::config
