"""A grayscale PNG written with zlib alone, for images a run leaves behind on its hot path
(matplotlib's import costs more than the short runs themselves)."""
from __future__ import annotations

import struct
import zlib
from pathlib import Path

import numpy as np

__all__ = ["gray_png"]


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def gray_png(image, path, *, lo: float, hi: float, scale: int = 1, title: str | None = None) -> Path:
    """Write a 2-D array as an 8-bit grayscale PNG: ``lo`` black, ``hi`` white.

    Each pixel becomes a ``scale`` x ``scale`` block (nearest neighbour, no smoothing), and
    ``title`` is stored as the PNG's Title text.
    """
    a = np.asarray(image, dtype=np.float64)
    if a.ndim != 2 or a.size == 0:
        raise ValueError(f"gray_png needs a non-empty 2-D image, got shape {a.shape}")
    if not hi > lo or scale < 1:
        raise ValueError(f"gray_png needs hi > lo and scale >= 1, got {lo}, {hi}, {scale}")
    pixels = np.rint(np.clip((a - lo) / (hi - lo), 0.0, 1.0) * 255).astype(np.uint8)
    pixels = np.repeat(np.repeat(pixels, scale, axis=0), scale, axis=1)
    h, w = pixels.shape
    rows = np.hstack([np.zeros((h, 1), np.uint8), pixels])  # filter byte 0 before each row
    parts = [b"\x89PNG\r\n\x1a\n", _chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))]
    if title:
        parts.append(_chunk(b"tEXt", b"Title\0" + title.encode("latin-1", "replace")))
    parts += [_chunk(b"IDAT", zlib.compress(rows.tobytes(), 6)), _chunk(b"IEND", b"")]
    path = Path(path)
    path.write_bytes(b"".join(parts))
    return path
