"""aepar.tasks.combine's codes under mpirun: the ranks share the encoding, every rank ends
with all the codes, the same bits as one process encoding everything itself."""
import aepar  # noqa: F401  (threads before numpy)
import numpy as np

from aepar import backend
from aepar.comm import world
from aepar.models.cae import ConvAutoencoder
from aepar.rows import CHUNK
from aepar.tasks.combine import _codes

comm = world()
be = backend.select("cpu", "numba", "float32")
model = ConvAutoencoder(be, (1, 8, 8), filters=(2, 3), seed=3)
rng = np.random.default_rng(7)
# parts of more and fewer rows than a chunk, one empty: chunks of one part split over ranks
rows = [rng.random((n, 64), dtype=np.float32) for n in (2 * CHUNK + 5, 300, 0, CHUNK)]
codes = _codes(be, comm, model, rows)
alone = [np.concatenate([model.encode(x[lo:lo + CHUNK]) for lo in range(0, len(x), CHUNK)] or
                        [np.empty((0, model.code_size), np.float32)]) for x in rows]
for i, (got, want) in enumerate(zip(codes, alone)):
    assert got.shape == want.shape and np.array_equal(got, want), (comm.rank, i)
print(f"codes ok rank {comm.rank} of {comm.size}", flush=True)
