"""Data: readers (IDX, CIFAR-10 batches, IMAGES.mat), the real offline sources, the
UFLDL patch sampler, deterministic splits and an optional HDF5 cache.

Data flows one way: reader/source -> split -> shard per rank (aepar.parallel) -> model.
"""
from aepar.data.cache import cached_array, resolve_cache_dir
from aepar.data.cifar import Cifar10, find_cifar10, load_cifar10, read_cifar10_batch
from aepar.data.idx import read_idx, read_idx_pair, write_idx
from aepar.data.imagesmat import read_images_mat
from aepar.data.patches import normalize_patches, sample_patches
from aepar.data.sources import (DIGIT_SOURCES, IMAGE_SOURCES, Digits, Images, load_digits, load_images,
                                natural_images, whiten)
from aepar.data.splits import split_indices

__all__ = ["read_idx", "write_idx", "read_idx_pair", "read_cifar10_batch", "load_cifar10", "find_cifar10",
           "Cifar10", "read_images_mat", "sample_patches", "normalize_patches", "split_indices",
           "load_images", "Images", "load_digits", "Digits", "natural_images", "whiten",
           "DIGIT_SOURCES", "IMAGE_SOURCES",
           "cached_array", "resolve_cache_dir"]
