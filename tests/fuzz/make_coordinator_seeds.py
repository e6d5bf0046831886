#!/usr/bin/python3
"""Seed inputs for coordinator_fuzzer (see its header for the record
format): a small job, two sessions that say Hello, take leases, report
progress and complete, time passing, a deletion, an audit. Protobuf is written by
hand (field tags and varints) so the seeds need no generated code.

    make_coordinator_seeds.py DIR
"""
import os
import struct
import sys


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number, value):
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    if isinstance(value, str):
        value = value.encode()
    return varint(number << 3 | 2) + varint(len(value)) + value


def record(op, body=b""):
    return bytes([op]) + struct.pack("<H", len(body)) + body


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    shard = field(1, "/d/a.tar") + field(2, 25)
    spec = (field(1, "j") + field(2, field(1, shard)) + field(6, 2) + field(7, 2) +
            field(8, 2) + field(10, 5))
    hello = lambda rank, who, workers: field(1, field(1, "j") + field(2, rank) + field(4, who) +
                                             field(7, workers))
    want = field(2, field(1, 2))
    progress = field(4, field(1, "j/e0/f1") + field(2, 1) + field(3, 2))
    complete = field(5, field(1, "j/e0/f1") + field(2, 1))
    seeds = {
        "job-and-sessions": [record(0, spec), record(1), record(2, hello(0, "t0", 0)),
                             record(2, want), record(1 + 8), record(2 + 8, hello(1, "t1", 0)),
                             record(2 + 8, want), record(2, progress), record(2, complete),
                             record(4, b"\0" * 30), record(6, b"j"), record(3), record(5, b"j")],
        "workers": [record(0, spec), record(1), record(2, hello(0, "w0", 2)), record(2, want),
                    record(1 + 8), record(2 + 8, hello(0, "w1", 2)), record(2 + 8, want),
                    record(4, b"\0" * 50)],
        "registration": [record(7, field(1, "h:1") + field(2, 1)), record(0, spec),
                         record(6, b"")],
        # An AuditRequest of rank 1 from position 3, with replay leases, once
        # a session has completed a unit.
        "audit": [record(0, spec), record(1), record(2, hello(0, "t0", 0)), record(2, want),
                  record(2, complete),
                  record(6, field(1, "j") + field(3, 1) + field(5, 3) + field(6, 4) +
                         field(7, 1))],
    }
    for name, records in seeds.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(b"".join(records))


if __name__ == "__main__":
    main()
