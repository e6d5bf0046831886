"""sluice.Reader against the real servers: coverage, epochs, resume."""
import collections

import pytest

import sluice


def test_reader_reads_every_sample_once_per_epoch(cluster):
    cluster.create_job("plain", world_size=1, epochs=2)
    seen = collections.Counter()
    events = []
    with sluice.Reader(cluster.address, "plain", progress_interval=0.1) as reader:
        while True:
            e = reader.next_event(timeout=60)
            if e.kind == "done":
                break
            if e.kind == "sample":
                s = e.sample
                assert s.key == f"s{s.shard_index}_{s.index}"
                assert s["cls"] == str(s.index).encode()   # raw bytes without decode
                assert s["bin"] == bytes([s.shard_index, s.index % 256]) * 50
                seen[(e.epoch, s.shard_index, s.index)] += 1
            else:
                events.append((e.kind, e.epoch))
    assert events == [("epoch_begin", 0), ("epoch_end", 0), ("epoch_begin", 1), ("epoch_end", 1)]
    assert len(seen) == 2 * cluster.total
    assert set(seen.values()) == {1}


def test_decoded_fields_are_typed(cluster):
    cluster.create_job("typed", world_size=1, epochs=1)
    with sluice.Reader(cluster.address, "typed", decode=True) as reader:
        samples = list(reader)
    assert len(samples) == cluster.total
    for s in samples:
        assert s["cls"] == s.index          # cls -> int
        d = s.as_dict()
        assert d["__key__"] == s.key and d["__index__"] == s.index
        assert d["__shard__"].endswith(f"shard-{s.shard_index:03d}.tar")


def test_unknown_job_is_a_final_error(cluster):
    with sluice.Reader(cluster.address, "nope") as reader:
        with pytest.raises(sluice.ReaderError) as err:
            reader.next_event(timeout=30)
    assert err.value.code.name == "NOT_FOUND"
    assert "nope" in err.value.message


def test_cursor_resume_continues_after_the_checkpoint(cluster):
    cluster.create_job("resume", world_size=1, epochs=1, max_samples_per_lease=5)
    first, cursor = [], None
    with sluice.Reader(cluster.address, "resume") as reader:
        for s in reader:
            first.append((s.shard_index, s.index))
            if len(first) == 40:
                cursor = reader.cursor()
            if len(first) == 55:
                break  # 15 samples seen after the checkpoint are lost with the run
    assert list(cursor.consumed_per_rank) == [40]
    with sluice.Reader(cluster.address, "resume", resume_from=cursor,
                       resume_attempt="restart-1") as reader:
        rest = [(s.shard_index, s.index) for s in reader]
    assert len(first[:40]) + len(rest) == cluster.total
    assert sorted(first[:40] + rest) == sorted(
        (s, i) for s in range(6) for i in range(17))


def test_barrier_waits_for_everyone_and_names_the_missing(cluster):
    import threading
    results = {}

    def arrive(i):
        results[i] = sluice.barrier("py-ready", participants=3, id=f"rank-{i}",
                                    coordinator=cluster.address, timeout=30)
    threads = [threading.Thread(target=arrive, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == {i: ["rank-0", "rank-1", "rank-2"] for i in range(3)}
    with pytest.raises(sluice.BarrierTimeout) as err:
        sluice.barrier("py-alone", participants=2, id="rank-0", coordinator=cluster.address,
                       timeout=0.5)
    assert err.value.arrived == ["rank-0"]
    assert err.value.missing == ["rank-1"]
