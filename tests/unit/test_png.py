"""aepar.report.png: the zlib-only grayscale PNG decodes back to the pixels it was given."""
import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from aepar.report.png import gray_png


def _decode(data: bytes):
    """Chunks of a PNG with their CRCs checked, then the 8-bit gray pixels and the text."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks = 8, []
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        assert crc == zlib.crc32(kind + body)
        chunks.append((kind, body))
        pos += 12 + length
    kinds = [k for k, _ in chunks]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND"
    w, h, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    assert (depth, colour, interlace) == (8, 0, 0)
    raw = zlib.decompress(b"".join(b for k, b in chunks if k == b"IDAT"))
    rows = np.frombuffer(raw, np.uint8).reshape(h, w + 1)
    assert np.all(rows[:, 0] == 0)  # filter "none" on every row
    text = {b.split(b"\0")[0]: b.split(b"\0", 1)[1] for k, b in chunks if k == b"tEXt"}
    return rows[:, 1:], text


@settings(max_examples=30, deadline=None)
@given(h=st.integers(1, 20), w=st.integers(1, 20), scale=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_pixels_round_trip_scaled_and_clipped(tmp_path_factory, h, w, scale, seed):
    image = np.random.default_rng(seed).uniform(-1.5, 1.5, (h, w))
    path = tmp_path_factory.mktemp("png") / "x.png"
    pixels, text = _decode(gray_png(image, path, lo=-1.0, hi=1.0, scale=scale).read_bytes())
    want = np.rint(np.clip((image + 1) / 2, 0, 1) * 255).astype(np.uint8)
    np.testing.assert_array_equal(pixels, np.kron(want, np.ones((scale, scale), np.uint8)))
    assert text == {}


def test_title_black_white_and_refusals(tmp_path):
    pixels, text = _decode(gray_png([[0.0, 2.0]], tmp_path / "t.png", lo=0.0, hi=2.0, title="25 features").read_bytes())
    assert pixels.tolist() == [[0, 255]] and text == {b"Title": b"25 features"}
    for bad in (dict(image=np.zeros(3)), dict(image=np.zeros((0, 2))), dict(hi=-1.0), dict(scale=0)):
        kw = dict(image=np.zeros((2, 2)), lo=0.0, hi=1.0, scale=1) | bad
        with pytest.raises(ValueError, match="gray_png needs"):
            gray_png(kw.pop("image"), tmp_path / "bad.png", **kw)
    assert not (tmp_path / "bad.png").exists()
