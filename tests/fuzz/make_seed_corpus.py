#!/usr/bin/python3
"""Writes a small seed corpus for tar_reader_fuzzer: a flag byte + a tar."""
import io
import os
import sys
import tarfile

out = sys.argv[1]
os.makedirs(out, exist_ok=True)


def tar_bytes(members, fmt=tarfile.PAX_FORMAT):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


seeds = {
    "plain": tar_bytes([("a.cls", b"1"), ("a.txt", b"hi"), ("b.cls", b"2")]),
    "gnu_long": tar_bytes([("d" * 120 + "/x.bin", b"xyz"), ("y.json", b"{}")], tarfile.GNU_FORMAT),
    "pax_long": tar_bytes([("p" * 150 + ".npy", b"\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }" + b" " * 45 + b"\n" + b"abcd")]),
}
# The decoders directly (flag byte 1 JPEG, 2 PNG, 3 npy; +4 resizes and
# crops), so the fuzzer starts inside each format, 16-bit PNG included.
decoder_seeds = {}
try:
    import numpy as np
    from PIL import Image

    def image_bytes(image, fmt):
        buf = io.BytesIO()
        (image if isinstance(image, Image.Image) else Image.fromarray(image)).save(buf, format=fmt)
        return buf.getvalue()

    rgb = (np.arange(8 * 6 * 3) * 37 % 256).astype(np.uint8).reshape(6, 8, 3)
    depth = (np.arange(5 * 4) * 3001 % 65536).astype(np.uint16).reshape(4, 5)
    npy = io.BytesIO()
    np.save(npy, depth)
    decoder_seeds = {
        "jpeg": b"\x01" + image_bytes(rgb, "JPEG"),
        "jpeg_cmyk": b"\x05" + image_bytes(Image.fromarray(rgb).convert("CMYK"), "JPEG"),
        "png8": b"\x02" + image_bytes(rgb, "PNG"),
        "png16": b"\x02" + image_bytes(depth, "PNG"),
        "png16_resized": b"\x06" + image_bytes(depth, "PNG"),
        "npy": b"\x03" + npy.getvalue(),
    }
except ImportError:  # the tar seeds alone still work
    pass

for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(b"\x00" + data)
for name, data in decoder_seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
