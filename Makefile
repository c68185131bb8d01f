# Thin wrapper over CMake. The two commands a new user needs:
#   make demo   install deps (if missing), build, train the quickstart recipe
#   make test   install deps (if missing), build, run every test
BUILD_DIR ?= build
# make bench: a CPU-only fdtrain beside a CUDA build (start-up figures).
CPU_BUILD_DIR ?= build-cpu
JOBS ?= $(shell nproc)
MPIRUN ?= mpirun --oversubscribe
# mpirun refuses root unless told; CI and containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT ?= 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ?= 1

.PHONY: all deps configure build test demo lora-demo lora-llama-demo qlora-demo sft-demo dpo-demo bench clean format gpu-bundle docs fuzz test-asan test-asan-ci test-tsan chaos multihost-test

all: build

deps:
	@./scripts/install_deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=Release

configure: $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: deps
	$(MAKE) build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)

# The progress line is forced on when make's stderr is a terminal: under mpirun
# a rank's stderr is a pipe.
PROGRESS := $(shell [ -t 2 ] && echo --progress)

demo: deps
	$(MAKE) build
	$(MPIRUN) --bind-to none -n 2 $(BUILD_DIR)/bin/fdtrain train recipes/quickstart.yaml \
	  --run-dir runs/quickstart --overwrite $(PROGRESS)

# LoRA: pre-train the base (2 ranks), export it, fine-tune adapters on another
# corpus with ZeRO-2, bf16 and checkpointed blocks on 8 ranks, export the adapter (PEFT).
lora-demo: deps
	$(MAKE) build
	$(MPIRUN) --bind-to none -n 2 $(BUILD_DIR)/bin/fdtrain train recipes/pretrain_base.yaml \
	  --run-dir runs/pretrain_base --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/pretrain_base --out runs/pretrain_base/model.safetensors --overwrite
	$(MPIRUN) --bind-to none -n 8 $(BUILD_DIR)/bin/fdtrain train recipes/lora_zero2.yaml \
	  --run-dir runs/lora_zero2 --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/lora_zero2 --lora-adapter runs/lora_zero2/adapter --overwrite

# The same on a Llama-shaped base: pre-train it, export it as a Hugging Face
# model directory, LoRA on every linear layer from that directory (ZeRO-2, bf16,
# checkpointed blocks, 8 ranks), export the PEFT adapter and the merged model,
# and evaluate the merged directory against the run.
lora-llama-demo: deps
	$(MAKE) build
	$(MPIRUN) --bind-to none -n 2 $(BUILD_DIR)/bin/fdtrain train recipes/pretrain_llama.yaml \
	  --run-dir runs/pretrain_llama --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/pretrain_llama --hf-dir runs/pretrain_llama/hf --overwrite
	$(MPIRUN) --bind-to none -n 8 $(BUILD_DIR)/bin/fdtrain train recipes/lora_llama_zero2.yaml \
	  --run-dir runs/lora_llama_zero2 --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/lora_llama_zero2 --lora-adapter runs/lora_llama_zero2/adapter --overwrite
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/lora_llama_zero2 --merge-lora --hf-dir runs/lora_llama_zero2/merged --dtype fp32 --overwrite
	$(BUILD_DIR)/bin/fdtrain eval runs/lora_llama_zero2 --data /usr/share/games/fortunes/zippy --windows 16
	$(BUILD_DIR)/bin/fdtrain eval runs/lora_llama_zero2/merged --data /usr/share/games/fortunes/zippy --seq-len 128 --windows 16

# QLoRA: the same Llama-shaped base, its block linears in 4 bits (NF4, double quantization),
# LoRA on every linear layer (ZeRO-2, bf16, 8 ranks); exports the PEFT adapter, the base as a
# transformers 4-bit directory and the merged model (the base dequantized, bf16), and evaluates
# the run and the merged directory.
qlora-demo: deps
	$(MAKE) build
	$(MPIRUN) --bind-to none -n 2 $(BUILD_DIR)/bin/fdtrain train recipes/pretrain_llama.yaml \
	  --run-dir runs/pretrain_llama --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/pretrain_llama --hf-dir runs/pretrain_llama/hf --overwrite
	$(MPIRUN) --bind-to none -n 8 $(BUILD_DIR)/bin/fdtrain train recipes/qlora_llama_zero2.yaml \
	  --run-dir runs/qlora_llama_zero2 --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/qlora_llama_zero2 --lora-adapter runs/qlora_llama_zero2/adapter --overwrite
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/qlora_llama_zero2 --quantized --hf-dir runs/qlora_llama_zero2/base-4bit --overwrite
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/qlora_llama_zero2 --merge-lora --hf-dir runs/qlora_llama_zero2/merged --overwrite
	$(BUILD_DIR)/bin/fdtrain eval runs/qlora_llama_zero2 --data /usr/share/games/fortunes/zippy --windows 16
	$(BUILD_DIR)/bin/fdtrain eval runs/qlora_llama_zero2/merged --data /usr/share/games/fortunes/zippy --seq-len 128 --windows 16

# Chat fine-tuning: a Llama-shaped base pre-trained with the chatml-bytes tokenizer
# (recipes/tokenizers/chatml-bytes), exported as a Hugging Face directory, then LoRA SFT on
# packed conversations about Debian commands (8 ranks, ZeRO-2, bf16, loss on the answers),
# and one question answered with the chat template.
sft-demo: deps
	$(MAKE) build
	$(MPIRUN) --bind-to none -n 2 $(BUILD_DIR)/bin/fdtrain train recipes/pretrain_chat_base.yaml \
	  --run-dir runs/pretrain_chat_base --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/pretrain_chat_base --hf-dir runs/pretrain_chat_base/hf --overwrite
	$(BUILD_DIR)/bin/fdtrain data preview recipes/sft_chat_lora.yaml --n 1
	$(MPIRUN) --bind-to none -n 8 $(BUILD_DIR)/bin/fdtrain train recipes/sft_chat_lora.yaml \
	  --run-dir runs/sft_chat_lora --overwrite $(PROGRESS)
	$(BUILD_DIR)/bin/fdtrain generate runs/sft_chat_lora --chat --temperature 0 --max-tokens 80 \
	  --prompt "What does the ls command do?"

# Preference training after the chat SFT run (make sft-demo first): its adapters merged into a
# base directory, then DPO with new LoRA adapters, the reference being that base (adapters off).
dpo-demo: deps
	$(MAKE) build
	@test -f runs/sft_chat_lora/summary.json || $(MAKE) sft-demo
	$(BUILD_DIR)/bin/fdtrain ckpt export runs/sft_chat_lora --merge-lora --hf-dir runs/sft_chat_lora/merged --overwrite
	$(BUILD_DIR)/bin/fdtrain data preview recipes/dpo_lora.yaml --n 1
	$(MPIRUN) --bind-to none -n 8 $(BUILD_DIR)/bin/fdtrain train recipes/dpo_lora.yaml \
	  --run-dir runs/dpo_lora --overwrite $(PROGRESS)

bench:
	@./scripts/install_deps.sh --bench
	$(MAKE) build
	./bench/run_bench.sh $(BUILD_DIR) $(BENCH_CONFIGS)
	./bench/tokenizer_bench.sh $(BUILD_DIR)
	./bench/tokenize_file_bench.sh $(BUILD_DIR)
	@# Start-up of a CUDA build for a CPU job against a CPU-only build (issue 42): the second build is
	@# fdtrain alone, in $(CPU_BUILD_DIR), made only when $(BUILD_DIR) has the CUDA backend.
	@if grep -qaF libcublasLt.so $(BUILD_DIR)/bin/fdtrain; then \
	  cmake -S . -B $(CPU_BUILD_DIR) -DCMAKE_BUILD_TYPE=Release -DFDTRAIN_CUDA=OFF >/dev/null && \
	  cmake --build $(CPU_BUILD_DIR) -j $(JOBS) --target fdtrain >/dev/null && \
	  ./bench/startup_bench.sh $(BUILD_DIR) $(CPU_BUILD_DIR); \
	else echo "start-up bench skipped: $(BUILD_DIR) has no CUDA backend"; fi
	./bench/offload_memory.sh $(BUILD_DIR)
	./bench/pipeline_bench.sh $(BUILD_DIR)
	./bench/qlora_bench.sh $(BUILD_DIR)
	./bench/tensor_parallel_bench.sh $(BUILD_DIR)
	./bench/zeropp_bench.sh $(BUILD_DIR)
	./bench/checkpoint_bench.sh $(BUILD_DIR)
	./bench/packing_bench.sh $(BUILD_DIR)

# docs/RECIPES.md, the reference of every recipe key, from `fdtrain schema --markdown`.
docs: build
	./scripts/gen_recipes_doc.sh $(BUILD_DIR)

# Reliability (bench/RELIABILITY.md). Each in its own build directory:
#   make fuzz FUZZ_SECONDS=N   libFuzzer + ASan + UBSan (clang), every target N seconds
#   make test-asan             the ctest suite under ASan + UBSan
#   make test-asan-ci          the part of it CI runs (.ci/run): the readers of untrusted input
#   make test-tsan             the ctest suite under ThreadSanitizer
#   make chaos [TRIALS=N]      kill or stop a random rank of a multi-rank run, N times
#   make multihost-test        fdtrain across simulated hosts (network namespaces; root)
FUZZ_SECONDS ?= 60
TRIALS ?= 20
fuzz:
	@./scripts/install_deps.sh --fuzz
	cmake -S . -B build-fuzz -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFDTRAIN_CUDA=OFF -DFDTRAIN_FUZZ=ON
	cmake --build build-fuzz --target fuzzers -j $(JOBS)
	./tests/fuzz/run.sh build-fuzz $(FUZZ_SECONDS)

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFDTRAIN_CUDA=OFF -DFDTRAIN_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	./tests/sanitizers/ctest.sh build-asan address -j $(JOBS)

# Every reader of untrusted input (the fuzz targets' code over their corpora and
# regression inputs) and the unit tests of the modules those readers are made of.
ASAN_CI_TARGETS = recipe_fuzz_replay token_file_fuzz_replay tokenizer_fuzz_replay jinja_fuzz_replay safetensors_fuzz_replay \
  peft_fuzz_replay shard_fuzz_replay hf_config_fuzz_replay hf_index_fuzz_replay sft_records_fuzz_replay \
  tokenizer_config_fuzz_replay chat_messages_fuzz_replay bnb4bit_fuzz_replay base_tests tensor_tests text_tests jinja_tests \
  data_tests config_tests ckpt_tests
# CI's budget: ASan without UBSan (half the compile time), and without the chat-template and
# long-document suites, which re-run tokenizer logic over the real vocabularies for a minute
# each (their readers are in the fuzz replays and HfReference); make test-asan runs it all.
test-asan-ci: deps
	cmake -S . -B build-asan-ci -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFDTRAIN_CUDA=OFF -DFDTRAIN_SANITIZE=address -DFDTRAIN_UBSAN=OFF
	cmake --build build-asan-ci -j $(JOBS) --target $(ASAN_CI_TARGETS)
	./tests/sanitizers/ctest.sh build-asan-ci address -j $(JOBS) -L '^(fuzz|base|tensor|text|jinja|data|config|ckpt)$$' \
	  -E '^(ChatTemplate|Files/LongDocument)\.'

test-tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFDTRAIN_CUDA=OFF -DFDTRAIN_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS)
	./tests/sanitizers/ctest.sh build-tsan thread -j $(JOBS)

chaos: deps
	$(MAKE) build
	./tests/chaos/run.sh $(TRIALS) $(BUILD_DIR)/bin/fdtrain

# fdtrain across simulated hosts (network namespaces on a bridge; root): tests/multihost/.
# make test runs it too where the machine allows it, else reports it skipped with the reason.
multihost-test: deps
	$(MAKE) build
	./tests/multihost/multihost_test.sh $(BUILD_DIR)/bin/fdtrain

format:
	find apps lib tests bench $$(ls -d kernels 2>/dev/null) \( -name '*.h' -o -name '*.cc' -o -name '*.cu' \) | xargs clang-format -i

clean:
	rm -rf $(BUILD_DIR) $(GPU_BUNDLE_BUILD) $(CPU_BUILD_DIR)

# A folder that runs the GPU device check on a machine with only the NVIDIA
# driver and CUDA libraries: scp it there and run ./device_check.sh.
# Built in build-gpu-bundle for a portable CPU baseline (x86-64-v3: AVX2, FMA), not for this
# machine's CPU, which the GPU host's may not match.
GPU_BUNDLE_BUILD ?= build-gpu-bundle
gpu-bundle: deps
	cmake -S . -B $(GPU_BUNDLE_BUILD) -DCMAKE_BUILD_TYPE=Release -DFDTRAIN_CUDA=ON -DFDTRAIN_MARCH=x86-64-v3
	cmake --build $(GPU_BUNDLE_BUILD) -j $(JOBS) --target fdtrain gpu_tests probe_fastmath_reciprocal
	./scripts/gpu_bundle.sh $(GPU_BUNDLE_BUILD) $(GPU_BUNDLE_BUILD)/gpu-bundle
