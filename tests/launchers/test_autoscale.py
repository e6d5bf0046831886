"""`sluicectl up --autoscale` on a head node: local data servers follow the
coordinator's estimate of what the trainers need, starting when they wait
for input and draining (SIGTERM) when they do not, without a failed stream
and with every epoch read exactly once."""
import os
import signal
import subprocess
import threading

from conftest import (BIN, EXAMPLES, LocalSluice, find_line, follow_the_need, wait_for,
                      write_jpeg_shards)

# The coordinator re-estimates every second over 4 s of history; its
# estimate falls only after 5 s of lower recommendations.
FAST_FLEET = ["--fleet_interval=1s", "--fleet_window=4s", "--fleet_up_cooldown=1s",
              "--fleet_down_stabilization=5s"]


def test_sluicectl_up_autoscale_follows_the_trainers_need(tmp_path):
    write_jpeg_shards(tmp_path / "shards", 8, 60)
    # One decode thread per data server: each is about one core's worth.
    up = subprocess.Popen(
        [os.path.join(BIN, "sluicectl"), "up", f"--dir={tmp_path}/up",
         f"--shards={tmp_path}/shards", "--coordinator=127.0.0.1:0", "--autoscale=1:2",
         "--data_server_flags=--decode_threads=1", "--", *FAST_FLEET],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []

    def read_lines():
        for line in up.stdout:
            lines.append(line.rstrip("\n"))
    reader = threading.Thread(target=read_lines, daemon=True)
    reader.start()
    try:
        first = wait_for(lambda: find_line(lines, r"^coordinator (\S+)"), 60, "sluicectl up")
        wait_for(lambda: find_line(lines, r"^autoscale: 1 to 2"), 30, "the autoscaler")
        follow_the_need(first.group(1), str(tmp_path / "shards"), str(tmp_path), lambda: lines,
                        started=r"wants ([2-9]|\d\d+) data servers .*; starting 1",
                        drained=r"input wait \d+%\); draining 1")
        # The drained server left by itself, cleanly: its log ends "stopped".
        logs = tmp_path / "up" / "logs"
        stopped = [p for p in os.listdir(logs) if p.startswith("dataserver-")
                   and "stopped" in (logs / p).read_text()]
        assert len(stopped) == 1, os.listdir(logs)
    finally:
        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=60) == 0
        reader.join(timeout=10)


def test_the_slurm_data_server_job_follows_the_trainers_need(slurm, tmp_path):
    # client/examples/slurm/data_servers.sbatch in a 2-task allocation: a
    # data-server step per server the coordinator wants, 1 to 2.
    write_jpeg_shards(tmp_path / "shards", 8, 60)
    os.makedirs(tmp_path / "sluice")
    coordinator = LocalSluice(str(tmp_path / "sluice"), str(tmp_path / "shards"),
                              data_servers=0, coordinator_flags=FAST_FLEET)
    out = tmp_path / "data-servers.out"
    job = None
    try:
        env = {"SLUICE_COORDINATOR": coordinator.address, "SHARDS": str(tmp_path / "shards"),
               "SLUICE_BIN": BIN, "MIN": "1", "MAX": "2", "INTERVAL": "1",
               "DATASERVER_FLAGS": "--decode_threads=1"}
        job = slurm.submit(["--ntasks=2", f"--output={out}",
                            os.path.join(EXAMPLES, "slurm", "data_servers.sbatch")],
                           env=env)

        def lines():
            return out.read_text().splitlines() if out.exists() else []
        wait_for(lambda: find_line(lines(), r"registered with coordinator"), 60,
                 "the first data-server step to register")
        follow_the_need(coordinator.address, str(tmp_path / "shards"), str(tmp_path), lines,
                        started=r"started data server \S+; 2 running",
                        drained=r"draining data server \S+; 1 running")
        # The drained server's step ended by itself, cleanly.
        wait_for(lambda: find_line(lines(), r"sluice-dataserver: stopped"), 30,
                 "the drained server to stop")
    finally:
        if job is not None:
            slurm.run(["scancel", job])
            slurm.wait(job, timeout=120)
        coordinator.stop()
    assert len([x for x in lines() if "sluice-dataserver: stopped" in x]) == 2, lines()[-40:]
