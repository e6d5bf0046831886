"""sluice._wire against the generated protobuf classes: every field kind,
edge values, field orders protobuf allows, unknown fields, malformed input."""
import numpy as np
import pytest

from sluice import _wire
from sluice._fetch import _DTYPES
from sluice.v1 import dataserver_pb2 as pb


def reference(batch):
    """What the generated classes say, in _wire's shape."""
    out = []
    for s in batch.samples:
        fields = {}
        for f in s.fields:
            which = f.WhichOneof("value")
            if which == "tensor":
                a = np.frombuffer(f.tensor.data, dtype=_DTYPES.get(f.tensor.dtype, np.uint8))
                fields[f.name] = a.reshape(tuple(f.tensor.shape)) if len(f.tensor.shape) else a
            elif which == "int_value":
                fields[f.name] = f.int_value
            elif which == "text":
                fields[f.name] = f.text
            else:
                fields[f.name] = f.raw
        out.append((s.key, s.index, s.skipped, s.skip_reason, fields, s.piece))
    return out


def assert_same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g[:4] == w[:4]
        assert g[5] == w[5]
        assert sorted(g[4]) == sorted(w[4])
        for name, value in w[4].items():
            if isinstance(value, np.ndarray):
                assert g[4][name].dtype == value.dtype
                assert g[4][name].shape == value.shape
                assert g[4][name].tobytes() == value.tobytes()
                assert not g[4][name].flags.writeable
            else:
                assert type(g[4][name]) is type(value)
                assert g[4][name] == value


def every_kind():
    b = pb.SampleBatch()
    s = b.samples.add(key="a/b/x.y", index=0)
    s.fields.add(name="jpg", raw=bytes(range(256)) * 300)
    s.fields.add(name="cls", int_value=7)
    s.fields.add(name="neg", int_value=-(2**63))
    s.fields.add(name="big", int_value=2**63 - 1)
    s.fields.add(name="txt", text="héllo ✓")
    s.fields.add(name="empty.bin", raw=b"")
    t = s.fields.add(name="png").tensor
    t.dtype, t.data = pb.DTYPE_UINT8, bytes(range(24))
    t.shape.extend([2, 4, 3])
    t = s.fields.add(name="npy").tensor
    t.dtype, t.data = pb.DTYPE_FLOAT32, np.arange(6, dtype=np.float32).tobytes()
    t.shape.extend([3, 2])
    t = s.fields.add(name="flat.npy").tensor  # no shape: 1-D
    t.dtype, t.data = pb.DTYPE_INT64, np.array([-1, 5], dtype=np.int64).tobytes()
    t = s.fields.add(name="scalar.npy").tensor  # 0 elements
    t.dtype = pb.DTYPE_FLOAT64
    b.samples.add(key="k2", index=2**40, skipped=True, skip_reason="corrupt jpg: bad header")
    b.samples.add(key="k3", index=5, piece=1023)  # a shuffle window's piece
    b.samples.add()  # all defaults
    return b


def test_every_field_kind_matches_protobuf():
    b = every_kind()
    assert_same(_wire.sample_batch(b.SerializeToString(), _DTYPES), reference(b))


def test_empty_batch():
    assert _wire.sample_batch(b"", _DTYPES) == []


def test_unknown_fields_are_skipped():
    b = every_kind()
    # Fields of every wire type under unknown numbers, at the batch and the
    # sample level:
    # a newer server's additions must not break an older client.
    unknown = bytes([11 << 3 | 0, 0x96, 0x01,  # varint
                     12 << 3 | 1]) + bytes(8) + \
        bytes([13 << 3 | 2, 3]) + b"xyz" + bytes([14 << 3 | 5]) + bytes(4)
    inner = pb.Sample(key="u", index=3)
    inner.fields.add(name="cls", int_value=1)
    data = b.SerializeToString() + unknown + \
        bytes([1 << 3 | 2, len(inner.SerializeToString()) + len(unknown)]) + \
        inner.SerializeToString() + unknown
    want = pb.SampleBatch()
    want.ParseFromString(data)
    assert_same(_wire.sample_batch(data, _DTYPES), reference(want))


def test_unpacked_shape_and_repeated_fields_are_accepted():
    # Protobuf parsers accept unpacked repeated scalars and, for a singular
    # field given twice, keep the last value.
    t = pb.Tensor(dtype=pb.DTYPE_UINT8, data=bytes(6))
    body = bytes([1 << 3 | 0, pb.DTYPE_UINT8, 2 << 3 | 0, 2, 2 << 3 | 0, 3,
                  3 << 3 | 2, 6]) + bytes(6)
    assert pb.Tensor.FromString(body).shape == [2, 3]
    field = bytes([1 << 3 | 2, 1]) + b"t" + bytes([3 << 3 | 2, len(body)]) + body
    sample = bytes([2 << 3 | 0, 1, 2 << 3 | 0, 9, 3 << 3 | 2, len(field)]) + field
    data = bytes([1 << 3 | 2, len(sample)]) + sample
    want = pb.SampleBatch.FromString(data)
    assert want.samples[0].index == 9
    assert_same(_wire.sample_batch(data, _DTYPES), reference(want))
    assert t.data == bytes(6)


@pytest.mark.parametrize("cut", [1, 3, 5, 100, 1000])  # 2 would drop the last, empty sample whole
def test_truncated_batches_are_wire_errors(cut):
    data = every_kind().SerializeToString()
    with pytest.raises(_wire.WireError):
        _wire.sample_batch(data[:-cut], _DTYPES)


def test_bad_input_is_a_wire_error_not_a_crash():
    with pytest.raises(_wire.WireError, match="wire type"):
        _wire.sample_batch(bytes([1 << 3 | 7]), _DTYPES)
    with pytest.raises(_wire.WireError, match="varint"):
        _wire.sample_batch(bytes([8]) + b"\xff" * 11, _DTYPES)
    key = bytes([1 << 3 | 2, 2]) + b"\xff\xfe"  # not UTF-8
    with pytest.raises(_wire.WireError, match="UTF-8"):
        _wire.sample_batch(bytes([1 << 3 | 2, len(key)]) + key, _DTYPES)
    t = pb.Tensor(dtype=pb.DTYPE_FLOAT32, data=bytes(6))  # 6 bytes of float32
    f = pb.Field(name="x", tensor=t).SerializeToString()
    s = bytes([3 << 3 | 2, len(f)]) + f
    with pytest.raises(_wire.WireError, match="whole number"):
        _wire.sample_batch(bytes([1 << 3 | 2, len(s)]) + s, _DTYPES)


def test_tensors_are_views_of_the_received_bytes():
    b = every_kind().SerializeToString()
    fields = _wire.sample_batch(b, _DTYPES)[0][4]
    assert fields["png"].base is not None
    assert np.shares_memory(fields["png"], np.frombuffer(b, dtype=np.uint8))
