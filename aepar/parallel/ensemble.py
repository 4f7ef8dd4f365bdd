"""Independent models over the ranks: groups by sub-communicator.

K models on P ranks in G groups (default G = min(K, P)):

- the ranks are cut into G contiguous groups of near-equal size (group g holds ranks
  ``block_bounds(P, G)[g] ..``), each with its own communicator;
- model m belongs to group m mod G: with K = P every rank trains one model alone, with
  K > P a rank trains several in turn, with K < P a group of ranks trains its model
  data-parallel (aepar.parallel.data_parallel, the fixed-tree sums: the same bits as one
  process).

Training goes in rounds: in round r every group trains epoch r of each of its models
that is still going. At the end of a round (:meth:`Ensemble.collect`) the group roots
send their models' states to rank 0 - the snapshots and checkpoints are written there -
and every rank learns whether a stop or a checkpoint was asked for anywhere: the round
ends are the ensemble's safe points.
"""
from __future__ import annotations

from dataclasses import dataclass

from aepar.rows import block_bounds

__all__ = ["Ensemble", "group_ranks", "models_of"]


def group_ranks(n_ranks: int, n_groups: int) -> list[range]:
    """The ranks of each group: contiguous, sizes differing by at most one."""
    b = block_bounds(n_ranks, n_groups)
    return [range(int(b[g]), int(b[g + 1])) for g in range(n_groups)]


def models_of(group: int, n_models: int, n_groups: int) -> list[int]:
    """The models of ``group``, in the order it trains them (model m: group m mod G)."""
    return list(range(group, n_models, n_groups))


@dataclass
class Ensemble:
    """This rank's place among ``n_models`` models on the ranks of ``comm``.

    Attributes
    ----------
    comm : aepar.comm.Comm
        Every rank of the job.
    n_models, n_groups : int
    group : int
        This rank's group.
    sub : aepar.comm.Comm
        The ranks of this group (data parallelism within it).
    """

    comm: object
    n_models: int
    n_groups: int
    group: int
    sub: object

    @classmethod
    def split(cls, comm, n_models: int, n_groups: int | None = None) -> "Ensemble":
        """Collective over ``comm``. ``n_groups`` defaults to min(n_models, comm.size); it
        must lie in [1, min(n_models, comm.size)] (callers check the user's value first)."""
        n_groups = min(n_models, comm.size) if n_groups is None else int(n_groups)
        if not 1 <= n_groups <= min(n_models, comm.size):
            raise ValueError(f"{n_groups} groups for {n_models} models on {comm.size} ranks")
        group = next(g for g, ranks in enumerate(group_ranks(comm.size, n_groups)) if comm.rank in ranks)
        return cls(comm, int(n_models), n_groups, group, comm.split(group, comm.rank))

    @property
    def mine(self) -> list[int]:
        """The models this rank's group trains, in the order it trains them."""
        return models_of(self.group, self.n_models, self.n_groups)

    @property
    def ranks_per_group(self) -> list[int]:
        return [len(r) for r in group_ranks(self.comm.size, self.n_groups)]

    def collect(self, states: dict, flag: float, error: str | None = None) -> tuple[dict | None, float, str | None]:
        """A round's end, collective over every rank.

        Parameters
        ----------
        states : dict
            model -> what rank 0 should have of it (on a group's root; others pass {}).
        flag : float
            This rank's guard flags (aepar.guard.Guard.flags).
        error : str, optional
            Why this rank's group cannot go on (e.g. its model diverged).

        Returns
        -------
        (merged, summed, error) : the states of every model (rank 0; None elsewhere), the
        flags summed over every rank (each rank's :meth:`Guard.decide` reads the same), and
        the first group's error, on every rank, so that all of them end together.
        """
        parts = self.comm.gather((states if self.sub.is_root else {}, float(flag), error))
        verdict = None
        merged = None
        if self.comm.is_root:
            merged = {}
            for states_part, _, _ in parts:
                merged.update(states_part)
            verdict = (sum(f for _, f, _ in parts), next((e for _, _, e in parts if e), None))
        summed, error = self.comm.bcast(verdict)
        return merged, summed, error
