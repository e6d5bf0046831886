"""Reads a serialized sluice.v1.SampleBatch without the protobuf runtime.

The Reader receives ReadSamples messages as bytes and walks their wire format
here, so a sample's payload is copied once (a raw field into its own bytes)
or not at all (a tensor becomes a numpy view of the received message),
where parsing with the generated classes copies it into the message and
again into every value read from it. Field numbers follow
protos/sluice/v1/dataserver.proto; tests/python/test_wire.py checks this
against the generated classes for every field kind.

Each sample comes back as (key, index, skipped, skip_reason, fields) with
fields a dict name -> value: raw -> bytes, tensor -> read-only numpy array
(dtype and shape from the message), int_value -> int, text -> str.
"""
import numpy as np


class WireError(ValueError):
    """The bytes are not a SampleBatch (truncated, or a wire type that does
    not match the schema)."""


_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5


def _varint(buf, pos):
    try:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
        result, shift = b & 0x7F, 7
        while True:
            pos += 1
            b = buf[pos]
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos + 1
            shift += 7
            if shift > 63:
                raise WireError(f"varint longer than 10 bytes at offset {pos}")
    except IndexError:
        raise WireError(f"truncated varint at offset {pos}") from None


def _int64(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _skip(buf, pos, end, wire_type):
    if wire_type == _VARINT:
        return _varint(buf, pos)[1]
    if wire_type == _I64:
        pos += 8
    elif wire_type == _LEN:
        n, pos = _varint(buf, pos)
        pos += n
    elif wire_type == _I32:
        pos += 4
    else:
        raise WireError(f"wire type {wire_type} at offset {pos}")
    if pos > end:
        raise WireError(f"field runs past its message at offset {pos}")
    return pos


def _length(buf, pos, end):
    n, pos = _varint(buf, pos)
    if pos + n > end:
        raise WireError(f"length {n} at offset {pos} runs past its message")
    return pos, pos + n


def _string(buf, pos, end):
    a, pos = _length(buf, pos, end)
    return buf[a:pos].decode("utf-8"), pos


def _tensor(buf, pos, end, dtypes):
    dtype, shape, data = 0, [], (pos, pos)
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 1 and wire_type == _VARINT:
            dtype, pos = _varint(buf, pos)
        elif number == 2 and wire_type == _LEN:  # packed
            a, pos = _length(buf, pos, end)
            while a < pos:
                v, a = _varint(buf, a)
                shape.append(_int64(v))
        elif number == 2 and wire_type == _VARINT:
            v, pos = _varint(buf, pos)
            shape.append(_int64(v))
        elif number == 3 and wire_type == _LEN:
            data = _length(buf, pos, end)
            pos = data[1]
        else:
            pos = _skip(buf, pos, end, wire_type)
    np_dtype = np.dtype(dtypes.get(dtype, np.uint8))
    a, b = data
    if (b - a) % np_dtype.itemsize:
        raise WireError(f"tensor of {b - a} bytes is not a whole number of {np_dtype}")
    arr = np.frombuffer(buf, dtype=np_dtype, count=(b - a) // np_dtype.itemsize, offset=a)
    return arr.reshape(shape) if shape else arr


def _field(buf, pos, end, dtypes):
    name, value = "", b""
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 1 and wire_type == _LEN:
            name, pos = _string(buf, pos, end)
        elif number == 2 and wire_type == _LEN:
            a, pos = _length(buf, pos, end)
            value = buf[a:pos]
        elif number == 3 and wire_type == _LEN:
            a, pos = _length(buf, pos, end)
            value = _tensor(buf, a, pos, dtypes)
        elif number == 4 and wire_type == _VARINT:
            v, pos = _varint(buf, pos)
            value = _int64(v)
        elif number == 5 and wire_type == _LEN:
            value, pos = _string(buf, pos, end)
        else:
            pos = _skip(buf, pos, end, wire_type)
    return name, value


def _sample(buf, pos, end, dtypes):
    key, index, skipped, reason, fields, piece = "", 0, False, "", {}, 0
    while pos < end:
        tag, pos = _varint(buf, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 1 and wire_type == _LEN:
            key, pos = _string(buf, pos, end)
        elif number == 2 and wire_type == _VARINT:
            v, pos = _varint(buf, pos)
            index = _int64(v)
        elif number == 3 and wire_type == _LEN:
            a, pos = _length(buf, pos, end)
            name, value = _field(buf, a, pos, dtypes)
            fields[name] = value
        elif number == 4 and wire_type == _VARINT:
            v, pos = _varint(buf, pos)
            skipped = v != 0
        elif number == 5 and wire_type == _LEN:
            reason, pos = _string(buf, pos, end)
        elif number == 6 and wire_type == _VARINT:
            piece, pos = _varint(buf, pos)
        else:
            pos = _skip(buf, pos, end, wire_type)
    return key, index, skipped, reason, fields, piece


def sample_batch(buf, dtypes):
    """The samples of a serialized SampleBatch (bytes), in order.
    `dtypes` maps DType numbers to numpy dtypes."""
    out = []
    pos, end = 0, len(buf)
    try:
        while pos < end:
            tag, pos = _varint(buf, pos)
            if tag == (1 << 3 | _LEN):
                a, pos = _length(buf, pos, end)
                out.append(_sample(buf, a, pos, dtypes))
            else:
                pos = _skip(buf, pos, end, tag & 7)
    except UnicodeDecodeError as e:
        raise WireError(f"a string field is not UTF-8: {e}") from None
    return out
