"""Sluice across hosts (network namespaces, tests/multihost/network.py),
against what the same links carry without it. Root only.

    multihost_bench.py [--rate=2gbit] [--rounds=3] [--hosts=4] [--rtt_ms=1]

1. Link: a trainer host reads raw 100 KB samples from a data server on
   another host over a link limited to --rate (tbf on the bridge's port to
   the trainer), against iperf3's bulk TCP from the server's host to the
   trainer's over the same link (reverse mode: the server sends); rounds
   alternate, medians compared.
2. Locality: --hosts trainer hosts, each with a data server of its own
   (the node-local layout) and its link limited to --rate, read one job
   together: the share of samples read on the trainer's own node
   (sluice_coordinator_granted_samples_total{locality}) and the job's
   throughput, against the same layout with the data servers naming
   another node (routing by shard hash alone, as without locality).
3. Grant latency at --rtt_ms: the coordinator on the head, a trainer host
   whose round trip to it is --rtt_ms longer (half of it added to each
   host's packets on their way out, `Network.delay`), 64 sessions paced at
   2,000 lease operations/s (`coordinator_bench --mode=remote_grants`:
   Complete sent -> next Grant received), against the bare gRPC server of
   the coordinator benchmark on the head, over the same link; and the
   link's bare TCP round trip (one byte echoed) for reference.

Prints a line per figure and one JSON line last.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MULTIHOST = os.path.join(HERE, "..", "multihost")
sys.path.insert(0, MULTIHOST)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hosts = _load("sluice_multihost_fixtures", os.path.join(MULTIHOST, "conftest.py"))

SAMPLE_BYTES = 100_000  # the .bin field; write_shards makes 2 x bin_repeat


def _read_all(c, job, ranks, epochs):
    """Every rank reads `epochs` epochs on its host; (samples, seconds from
    the start to the last sample)."""
    started = time.monotonic()
    readers = [c.read(c.trainers[r], job, rank=r, epochs=epochs) for r in range(ranks)]
    got = [r.finish(600) for r in readers]
    last = max(r.times[-1] for r in readers)
    return sum(len(g) for g in got), last - started


def link_rounds(tmp, rate, rounds):
    c = hosts.HostCluster(os.path.join(tmp, "link"), name="blink", data_hosts=1,
                          trainer_hosts=1, shards=16, per_shard=100,
                          bin_repeat=SAMPLE_BYTES // 2)
    try:
        server, trainer = c.data_hosts[0], c.trainers[0]
        c.net.limit(trainer, rate)
        sluice, tcp = [], []
        for i in range(rounds):
            c.create_job(f"link{i}", world_size=1, epochs=2)
            samples, seconds = _read_all(c, f"link{i}", 1, 2)
            sluice.append(samples * SAMPLE_BYTES / seconds)
            iperf = server.popen(["iperf3", "-s", "-1", "-B", server.ip],
                                 stdout=subprocess.DEVNULL)
            hosts.wait_for(lambda: ":5201 " in server.run(["ss", "-ltn"]).stdout, 10,
                           "iperf3 to listen")
            got = trainer.run(["iperf3", "-c", server.ip, "-R", "-t", "4", "-J"])
            iperf.wait(timeout=10)
            tcp.append(json.loads(got.stdout)["end"]["sum_received"]["bits_per_second"] / 8)
            print(f"link round {i}: Sluice {sluice[-1] / 1e6:.0f} MB/s, "
                  f"iperf3 {tcp[-1] / 1e6:.0f} MB/s", file=sys.stderr, flush=True)
        return statistics.median(sluice), statistics.median(tcp)
    finally:
        c.close()


def locality_run(tmp, rate, n, local):
    c = hosts.HostCluster(os.path.join(tmp, f"loc{int(local)}"), name=f"bloc{int(local)}",
                          trainer_hosts=n, node_local=True, shards=4 * n, per_shard=100,
                          bin_repeat=SAMPLE_BYTES // 2,
                          data_flags=() if local else ["--node=elsewhere"])
    try:
        for t in c.trainers:
            c.net.limit(t, rate)
        c.create_job("j", world_size=n, epochs=2)
        samples, seconds = _read_all(c, "j", n, 2)

        def granted(where):
            return c.coordinator.metric(
                f'sluice_coordinator_granted_samples_total{{locality="{where}",sluice_job="j"}}')
        same, other = granted("same_node"), granted("other_node")
        return samples * SAMPLE_BYTES / seconds, same / (same + other)
    finally:
        c.close()


_ECHO = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], 9100)); s.listen(); print("ready", flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while (d := c.recv(64)):
    c.sendall(d)
"""
_PING = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 9100))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
t = []
for _ in range(500):
    start = time.perf_counter(); c.sendall(b"x"); c.recv(64)
    t.append(time.perf_counter() - start)
t.sort(); print(t[len(t) // 2] * 1e3)
"""


def tcp_rtt_ms(server, client):
    """The median round trip of one byte over TCP from `client` to `server`."""
    echo = server.popen(["/usr/bin/python3", "-c", _ECHO, server.ip], stdout=subprocess.PIPE,
                        text=True)
    assert echo.stdout.readline().strip() == "ready"
    got = client.run(["/usr/bin/python3", "-c", _PING, server.ip])
    echo.wait(timeout=10)
    return float(got.stdout)


def grant_latency(tmp, rtt_ms, rounds):
    c = hosts.HostCluster(os.path.join(tmp, "grants"), name="bgrant", data_hosts=1,
                          trainer_hosts=1)
    try:
        head, trainer = c.head, c.trainers[0]
        port_file = os.path.join(c.tmp, "grant-echo.ports")
        bench = os.path.join(hosts.BIN, "coordinator_bench")
        head.popen([bench, "--mode=grant_echo_server", f"--listen={head.ip}:0",
                    f"--port_file={port_file}"])
        hosts.wait_for(lambda: os.path.exists(port_file), 20, "the bare gRPC server")
        baseline = open(port_file).read().split("=", 1)[1].strip()
        c.net.delay(head, rtt_ms / 2)
        c.net.delay(trainer, rtt_ms / 2)
        rtt = tcp_rtt_ms(head, trainer)
        got = trainer.run([bench, "--mode=remote_grants", f"--coordinator={c.coordinator.address}",
                           f"--baseline={baseline}", "--sessions=64", "--paced_ops_per_s=2000",
                           "--seconds=3", f"--rounds={rounds}"])
        sys.stderr.write(got.stderr)
        assert got.returncode == 0, got.stderr
        return rtt, json.loads(got.stdout.strip().splitlines()[-1])
    finally:
        c.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bin_dir", nargs="?", default=os.environ.get("SLUICE_BIN_DIR", ""))
    p.add_argument("--rate", default="2gbit")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hosts", type=int, default=4)
    p.add_argument("--rtt_ms", type=float, default=1.0)
    a = p.parse_args()
    if a.bin_dir:
        hosts.BIN = os.path.abspath(a.bin_dir)
    if os.geteuid() != 0:
        print("multihost_bench.py: skipped: network namespaces need root", file=sys.stderr)
        print(json.dumps({"bench": "multihost", "skipped": "network namespaces need root"}))
        return
    with tempfile.TemporaryDirectory(prefix="sluice-multihost-bench-") as tmp:
        sluice, tcp = link_rounds(tmp, a.rate, a.rounds)
        print(f"one trainer host over a {a.rate} link: Sluice {sluice / 1e6:.0f} MB/s, "
              f"iperf3 {tcp / 1e6:.0f} MB/s, ratio {sluice / tcp:.2f} (target >= 0.9)")
        local_bps, local_share = locality_run(tmp, a.rate, a.hosts, True)
        hash_bps, hash_share = locality_run(tmp, a.rate, a.hosts, False)
        rtt, grants = grant_latency(tmp, a.rtt_ms, a.rounds)
    print(f"{a.hosts} trainer hosts, node-local data servers, {a.rate} links: "
          f"{local_share:.1%} of samples read on the trainer's node (target >= 95 %), "
          f"{local_bps / 1e6:.0f} MB/s; by shard hash alone: {hash_share:.1%}, "
          f"{hash_bps / 1e6:.0f} MB/s; ratio {local_bps / hash_bps:.2f}")
    print(f"grant latency at {a.rtt_ms:g} ms added round trip (TCP echo {rtt:.2f} ms): "
          f"p50 {grants['grant_p50_ms']:.2f} ms, p99 {grants['grant_p99_ms']:.2f} ms; "
          f"bare gRPC p50 {grants['baseline_grant_p50_ms']:.2f} ms, "
          f"p99 {grants['baseline_grant_p99_ms']:.2f} ms; ratio p50 {grants['ratio_p50']:.2f}, "
          f"p99 {grants['ratio_p99']:.2f}")
    print(json.dumps({"bench": "multihost", "rate": a.rate,
                      "link_bytes_per_s": round(sluice), "iperf3_bytes_per_s": round(tcp),
                      "link_ratio": round(sluice / tcp, 2), "hosts": a.hosts,
                      "same_node_share": round(local_share, 3),
                      "local_bytes_per_s": round(local_bps),
                      "hash_bytes_per_s": round(hash_bps),
                      "hash_same_node_share": round(hash_share, 3),
                      "locality_ratio": round(local_bps / hash_bps, 2),
                      "rtt_ms": round(rtt, 3), "grant_p50_ms": grants["grant_p50_ms"],
                      "grant_p99_ms": grants["grant_p99_ms"],
                      "bare_grpc_p50_ms": grants["baseline_grant_p50_ms"],
                      "bare_grpc_p99_ms": grants["baseline_grant_p99_ms"],
                      "grant_ratio_p50": grants["ratio_p50"]}))


if __name__ == "__main__":
    main()
