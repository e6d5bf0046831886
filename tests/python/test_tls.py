"""The Python client over TLS: a coordinator and a data server that demand
client certificates, reached with PEM files (arguments or SLUICE_* variables)
from a plain Reader and from spawned DataLoader workers."""
import collections
import multiprocessing
import os
import subprocess

import grpc
import pytest
import torch  # noqa: F401  (DataLoader)
from torch.utils.data import DataLoader

import sluice
from sluice.torch import ShardLeaseDataset

from conftest import BIN, Cluster, Server, _wait_for, make_pki


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tls")
    pki = make_pki(str(tmp / "pki"))
    c = Cluster(tmp, shards=4, per_shard=10, pki=pki)
    yield c
    c.stop()


def tls_args(c):
    return dict(ca_cert=c.pki["ca.crt"], client_cert=c.pki["client.crt"],
                client_key=c.pki["client.key"])


def test_reader_reads_over_mutual_tls(tls_cluster):
    tls_cluster.create_job("tls-plain")
    with sluice.Reader(tls_cluster.address, "tls-plain", **tls_args(tls_cluster)) as reader:
        keys = collections.Counter(s.key for s in reader)
    assert len(keys) == tls_cluster.total and set(keys.values()) == {1}


def test_a_reader_without_certificates_is_told_the_coordinator_speaks_tls(tls_cluster):
    tls_cluster.create_job("tls-none")
    with pytest.raises(sluice.ReaderError) as e:
        with sluice.Reader(tls_cluster.address, "tls-none") as reader:
            reader.next_event()
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "TLS" in e.value.message


def test_dataset_len_asks_the_coordinator_over_the_readers_tls(tls_cluster, monkeypatch):
    # len() (what a progress bar asks first) used a plaintext channel, which
    # a TLS coordinator refuses.
    tls_cluster.create_job("tls-len", world_size=2)
    ds = ShardLeaseDataset(coordinator=tls_cluster.address, job="tls-len", **tls_args(tls_cluster))
    assert len(ds) == tls_cluster.total // 2
    monkeypatch.setenv("SLUICE_CA_CERT", tls_cluster.pki["ca.crt"])
    monkeypatch.setenv("SLUICE_CLIENT_CERT", tls_cluster.pki["client.crt"])
    monkeypatch.setenv("SLUICE_CLIENT_KEY", tls_cluster.pki["client.key"])
    assert len(ShardLeaseDataset(coordinator=tls_cluster.address, job="tls-len")) == \
        tls_cluster.total // 2


def test_spawned_dataloader_workers_get_tls_from_the_environment(tls_cluster, monkeypatch):
    tls_cluster.create_job("tls-loader")
    # Spawned workers inherit the environment; the dataset itself holds only
    # strings (grpc credentials objects would not pickle).
    monkeypatch.setenv("SLUICE_CA_CERT", tls_cluster.pki["ca.crt"])
    monkeypatch.setenv("SLUICE_CLIENT_CERT", tls_cluster.pki["client.crt"])
    monkeypatch.setenv("SLUICE_CLIENT_KEY", tls_cluster.pki["client.key"])
    ds = ShardLeaseDataset(coordinator=tls_cluster.address, job="tls-loader", decode=False)
    loader = DataLoader(ds, batch_size=None, num_workers=2,
                        multiprocessing_context=multiprocessing.get_context("spawn"))
    keys = collections.Counter(item["__key__"] for item in loader)
    assert len(keys) == tls_cluster.total and set(keys.values()) == {1}


def test_once_and_barrier_over_tls(tls_cluster):
    with sluice.once("tls-step", coordinator=tls_cluster.address, **tls_args(tls_cluster)) as step:
        assert step.should_run
    arrived = sluice.barrier("tls-barrier", participants=1, participant="only",
                             coordinator=tls_cluster.address, timeout=10, **tls_args(tls_cluster))
    assert list(arrived) == ["only"]


def test_incomplete_tls_settings_name_the_argument(tls_cluster):
    with pytest.raises(ValueError, match="client_key"):
        sluice.Reader(tls_cluster.address, "x", ca_cert=tls_cluster.pki["ca.crt"],
                      client_cert=tls_cluster.pki["client.crt"])
    with pytest.raises(ValueError, match="ca_cert"):
        sluice.Reader(tls_cluster.address, "x", ca_cert="/nonexistent/ca.pem")


def test_a_trainer_certificate_reads_but_cannot_administer(tls_cluster):
    # The coordinator names CN=client in --admin_identities; CN=trainer is
    # signed by the same CA, so it may train but not create or delete jobs.
    tls_cluster.create_job("tls-guarded")
    trainer = dict(ca_cert=tls_cluster.pki["ca.crt"], client_cert=tls_cluster.pki["trainer.crt"],
                   client_key=tls_cluster.pki["trainer.key"])
    with sluice.Reader(tls_cluster.address, "tls-guarded", **trainer) as reader:
        assert sum(1 for _ in reader) == tls_cluster.total
    ctl = [os.path.join(BIN, "sluicectl"), "--coordinator=" + tls_cluster.address,
           "--ca_cert=" + trainer["ca_cert"], "--client_cert=" + trainer["client_cert"],
           "--client_key=" + trainer["client_key"]]
    manifest = os.path.join(tls_cluster.tmp, "tls-guarded.json")
    for args in (["job", "create", "--name=tls-by-trainer", "--manifest=" + manifest],
                 ["job", "delete", "tls-guarded"]):
        out = subprocess.run(ctl[:1] + args + ctl[1:], capture_output=True, text=True)
        assert out.returncode == 1, out.stdout + out.stderr
        assert 'client certificate "trainer" is not an operator identity' in out.stderr
    out = subprocess.run(ctl[:1] + ["job", "list"] + ctl[1:], capture_output=True, text=True)
    assert out.returncode == 0 and "tls-guarded" in out.stdout, out.stdout + out.stderr


def test_a_trainer_certificate_cannot_register_a_data_server(tls_cluster):
    pki = tls_cluster.pki
    rogue = Server("sluice-dataserver", os.path.join(tls_cluster.tmp, "rogue"), [
        f"--roots={os.path.join(tls_cluster.tmp, 'shards')}",
        f"--coordinator={tls_cluster.address}", f"--tls_cert={pki['server.crt']}",
        f"--tls_key={pki['server.key']}", f"--coordinator_ca={pki['ca.crt']}",
        f"--coordinator_cert={pki['trainer.crt']}", f"--coordinator_key={pki['trainer.key']}"])
    try:
        log = os.path.join(tls_cluster.tmp, "rogue", "sluice-dataserver.log")
        _wait_for(lambda: "is not a data server identity" in open(log).read(), 30,
                  "the registration to be refused")
        assert "sluice_coordinator_data_servers 1\n" in tls_cluster.coordinator.metric_text()
    finally:
        rogue.stop()


def test_a_data_server_registering_in_plaintext_is_told_the_coordinator_speaks_tls(tls_cluster):
    plain = Server("sluice-dataserver", os.path.join(tls_cluster.tmp, "plain-register"), [
        f"--roots={os.path.join(tls_cluster.tmp, 'shards')}",
        f"--coordinator={tls_cluster.address}"])
    try:
        log = os.path.join(tls_cluster.tmp, "plain-register", "sluice-dataserver.log")
        _wait_for(lambda: f"coordinator {tls_cluster.address} speaks TLS, but this client "
                          "connects in plaintext" in open(log).read(), 30,
                  "the registration to name TLS")
        assert "(--coordinator_ca)" in open(log).read()
    finally:
        plain.stop()


@pytest.fixture(scope="module")
def tls_data_plain_coordinator(tmp_path_factory):
    """A plaintext coordinator and a data server that listens with TLS: a
    client must speak TLS to one and plaintext to the other, which no client
    setting does."""
    tmp = tmp_path_factory.mktemp("tls-data")
    pki = make_pki(str(tmp / "pki"))
    c = Cluster(tmp, shards=2, per_shard=5, data_servers=0)
    c.start_data_servers(1, [f"--tls_cert={pki['server.crt']}", f"--tls_key={pki['server.key']}"])
    yield c
    c.stop()


def test_a_plaintext_reader_is_told_the_data_server_speaks_tls(tls_data_plain_coordinator):
    c = tls_data_plain_coordinator
    address = c.data[0].address
    c.create_job("tls-data-python")
    # Without the probe this re-routes until the job's units run out of
    # data servers, for ever: the code and message say the cause was found.
    with pytest.raises(sluice.ReaderError) as error:
        with sluice.Reader(c.address, "tls-data-python") as reader:
            next(iter(reader))
    assert error.value.code.name == "FAILED_PRECONDITION"
    assert f"data server {address} speaks TLS, but this client connects in plaintext" in \
        error.value.message


def test_sluicectl_read_is_told_the_data_server_speaks_tls(tls_data_plain_coordinator):
    c = tls_data_plain_coordinator
    c.create_job("tls-data-cpp")
    out = subprocess.run([os.path.join(BIN, "sluicectl"), "read", "--job=tls-data-cpp",
                          f"--coordinator={c.address}"], capture_output=True, text=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert (f"FAILED_PRECONDITION: data server {c.data[0].address} speaks TLS, but this client "
            "connects in plaintext") in out.stderr


def test_a_tls_reader_is_told_the_coordinator_speaks_plaintext(tls_data_plain_coordinator, tmp_path):
    c = tls_data_plain_coordinator
    pki = make_pki(str(tmp_path / "pki"))
    with pytest.raises(sluice.ReaderError) as error:
        with sluice.Reader(c.address, "any", ca_cert=pki["ca.crt"]) as reader:
            next(iter(reader))
    assert error.value.code.name == "FAILED_PRECONDITION"
    assert f"coordinator {c.address} speaks plaintext, but this client connects with TLS" in \
        error.value.message
    with pytest.raises(ConnectionError, match="speaks plaintext"):
        sluice.barrier("tls-mismatch", participants=1, participant="only", coordinator=c.address,
                       timeout=5, ca_cert=pki["ca.crt"])
