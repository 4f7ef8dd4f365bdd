"""A scaling model of every scheme, fitted on this machine and validated on measured points.

    python -m bench.scaling_model                 # measure (MPI at np 2, compute, fresh aepar.sparse and
                                                   # aepar.pretrain runs), fit, validate, predict 1-1024
                                                   # ranks, write bench/results/scaling_model*
    python -m bench.scaling_model --reuse         # the same from the measurements already written
    mpirun -np 2 python -m bench.scaling_model measure-mpi --out FILE.csv   # what the first step runs
    python -m bench.scaling_model measure-compute --out FILE.csv
    python -m bench.scaling_model measure-contention --out FILE.csv  # one copy per core against one alone
    python -m bench.scaling_model measure-sparse --out FILE.csv   # aepar.sparse at np 1 and 2
    python -m bench.scaling_model measure-stacked --out FILE.csv  # aepar.pretrain points, here and now

Modules: :mod:`.model` (pure: links, compute record, schemes; the planner's schedules),
:mod:`.measure` (what is measured here and how it is read back), :mod:`.validate` (the model
at every measured point), :mod:`.report` (predictions, scaling_model.md and .png), and
``__main__`` (the command line).

Three layers, each a place where the figures can be wrong:

1. **Communication**, measured under mpirun -np 2 through aepar.comm (the wrappers the
   schemes call: ``Comm.bcast/reduce/allreduce/send/recv`` and the fixed-tree sums of
   aepar.parallel.blocks.TreeSum) for 8 B .. 64 MB, fitted per operation to Hockney's
   t = alpha + n / beta (least squares on the *relative* error, so that 8 B and 64 MB weigh
   alike; both parameters kept >= 0). np 2 is the only honest count on 2 cores. And the
   sums as a training loop issues them (each step a fixed compute, then the sum), over the
   same op alone, with each rank's wait for the slower one: what a step's sum costs in a
   run beyond the collective timed alone (validation only).
2. **Compute**, measured in one process with one thread: the sparse autoencoder's
   evaluation (partials of every block of 128 patches + the root's assembly and L-BFGS-B
   step), and per layer of the stacked networks one block's gradient at 1..1024 rows
   (RBM CD-1 / autoencoder layer, the gather of the rows included), the fused one-block
   RBM step, 8 blocks in one training step as a rank of several takes it (the factored
   sum the code does) and as one process alone does (one kernel call a step), the optimiser
   step, the transform and reconstruction per row, and the memory rates of the adds and
   copies the sums do. And how ranks sharing the machine slow each other: the same work in
   one process per core at once against one alone (measure-contention), applied to this
   machine's points and, at the ranks per node, to the predictions. A rank's threads gain
   what a second thread gained on the point's machine in bench.block_tax's layer-wise
   epochs (validation only; evenly split where not measured), and small steps stay on one
   thread as aepar keeps them.
3. **Schemes** composed from those (:mod:`.model`): per step or evaluation, compute of
   the busiest rank + the serial parts (root assembly and L-BFGS, every rank's optimiser
   step) + the collectives the scheme issues, with their message sizes; model-parallel
   and the pipelines through aepar.parallel.planner's schedules, fed these costs.

Collectives over P ranks (``ranks_per_node`` per node): the smaller of a binomial tree and
the bandwidth-optimal form (scatter or reduce-scatter + allgather: twice the tree's
latencies, 2(P-1)/P of the bytes) - what MPI libraries switch between by message size.
Inside a node the tree is ceil(log2) levels, each the operation as measured at np 2 (its
fastest trial per size, log-log between the sizes: one line misses the switches from eager
to rendezvous and from cache to memory), and the bandwidth-optimal form's bytes take
2(P-1)/P of what they took at np 2; across nodes the tree adds the profile's levels (alpha +
n/beta [+ n gamma for a sum]) and the bandwidth-optimal form moves its bytes at the
profile's beta. At P = 2 on one node that is the measured operation itself.
Point-to-point messages inside a node are the one-way Send/Recv as measured (what TreeSum and
the hand-overs do), not half a ping-pong.
aepar's fixed tree is not an MPI collective: it is simulated message by message along
TreeSum's own plan (every cross-rank node is TreeSum's own time, fitted at P = 2 from its
small sums, + one Send/Recv + an add; a sending rank is busy until delivery), then the
Bcast of the sum where the scheme needs it everywhere.
On another machine the collectives are these same points; where that machine's own link and
memory were measured (the 16-vCPU machine: its one-way send under mpirun -np 16, a triad with
1..16 processes at once) the part of each point beyond its latency moves at that link's speed
and slows as a tree level's copies share the memory (:func:`.model.relinked`); where its own
np 2 points were measured too (bench.gpu_node), those replace this machine's and only the
memory's slowdown is added; where a results folder holds a machine's own measure-mpi at np 2
with its step sums (bench/results/scaling_zen3), its points replace this machine's for that
machine's runs; elsewhere they are this machine's, faster or slower than that machine's own.

Not modelled (each makes the predictions optimistic): contention for memory on machines
where measure-contention did not run, network congestion and topology, OS noise and stragglers (the model's
slowest rank is the one with the most blocks, not the unluckiest), the cache footprint of
many blocks per rank and page faults of freshly allocated buffers, start-up, checkpoints and
test evaluations. aepar does not overlap communication with compute, and neither does the model.
"""
