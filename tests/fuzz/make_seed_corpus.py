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
for name, data in seeds.items():
    with open(os.path.join(out, name), "wb") as f:
        f.write(b"\x00" + data)
