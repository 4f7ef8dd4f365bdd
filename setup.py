"""aepar: parallel autoencoder pre-training with hand-written kernels and explicit MPI.

The metadata (name, version, dependencies, extras, the `aepar` command) is in pyproject.toml.
"""
from setuptools import setup

setup(
    # kernels/ lives at the top of the repo (the users' layout) and is reached as aepar.kernels
    # through the link aepar/kernels -> ../kernels, from a checkout and in an install alike (a
    # top-level name `kernels` would collide with an existing PyPI package).
    packages=["aepar", "aepar.data", "aepar.models", "aepar.parallel", "aepar.schemes", "aepar.tasks",
              "aepar.report",
              "aepar.kernels", "aepar.kernels.ref", "aepar.kernels.nb", "aepar.kernels.cp"],
    package_data={"aepar.kernels.cp": ["*.cu"]},
)
