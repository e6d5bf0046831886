"""Real launchers for the examples' tests: a single-node SLURM cluster
(munged, slurmctld, slurmd from Debian's munge and slurm-wlm) configured in
a temporary directory, and a local Sluice cluster started with `sluicectl
up`. Every daemon is started here and stopped by its PID.

The SLURM configuration avoids what a container lacks: no cgroups
(ProctrackType=proctrack/linuxproc, TaskPlugin=task/none), no accounting, the
daemons and jobs run as the current user (root in CI), and the node claims 8
CPUs (SlurmdParameters=config_overrides) so 4-task jobs fit on 2 cores.
munged runs with --force: it refuses to run as root otherwise.
"""
import collections
import io
import json
import os
import random
import re
import signal
import socket
import subprocess
import tarfile
import threading
import time

import pytest

BIN = os.environ.get("SLUICE_BIN_DIR",
                     os.path.join(os.path.dirname(__file__), "..", "..", "build", "bin"))
EXAMPLES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "client",
                                         "examples"))


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)  # polling with a deadline
    raise TimeoutError(f"timed out waiting for {what}")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(proc, timeout=30):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Slurm:
    """munged + slurmctld + slurmd in `d`; `env` runs SLURM commands
    against it (SLURM_CONF)."""

    def __init__(self, d):
        self.dir = d
        os.chmod(d, 0o755)  # munged wants its socket's directory reachable
        for sub in ("state", "spool"):
            os.makedirs(os.path.join(d, sub))
        key = os.path.join(d, "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        self.procs = []
        self.munge_socket = os.path.join(d, "munge.socket")
        self._start("munged", ["munged", "-F", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--log-file={d}/munged.log",
                               f"--pid-file={d}/munged.pid", f"--seed-file={d}/munged.seed"])
        wait_for(lambda: os.path.exists(self.munge_socket), 30, "munged")
        host = socket.gethostname().split(".")[0]
        self.conf = os.path.join(d, "slurm.conf")
        with open(self.conf, "w") as f:
            f.write(f"""ClusterName=sluicetest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
NodeName={host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
""")
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        self._start("slurmctld", ["slurmctld", "-D", "-f", self.conf])
        self._start("slurmd", ["slurmd", "-D", "-f", self.conf])

        wait_for(self.idle, 60, "the SLURM node to be idle (logs in " + d + ")")

    def idle(self):
        """Whether the node runs nothing (a job's cleanup included)."""
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], env=self.env, capture_output=True,
                             text=True)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _start(self, name, argv):
        log = open(os.path.join(self.dir, f"{name}.out"), "wb")
        self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def log_lines(self, job):
        """The lines of slurmctld's and slurmd's logs that name `job`, for a
        failure message."""
        out = []
        for name in ("slurmctld.log", "slurmd.log"):
            try:
                with open(os.path.join(self.dir, name), errors="replace") as f:
                    out += [f"{name}: {line.rstrip()}" for line in f
                            if re.search(rf"(JobId={job}\b|job {job}\b|StepId={job}\.|"
                                         rf"job_id {job}\b|JOB {job}\b)", line)]
            except OSError as e:
                out.append(f"{name}: {e}")
        return "\n".join(out[-80:])

    def run(self, argv, timeout=300, **kw):
        env = dict(self.env, **kw.pop("env", {}))
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout,
                              **kw)

    def sbatch(self, argv, timeout=600, **kw):
        """Submits a batch job and waits until it ends (polling its state:
        sbatch --wait polls at growing intervals). Returns (exit code,
        scontrol's record of the job)."""
        job = self.submit(argv, **kw)
        code, info = self.wait(job, timeout)
        return job, code, info

    def submit(self, argv, **kw):
        """Submits a batch job; returns its id."""
        out = self.run(["sbatch", "--parsable", *argv], **kw)
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout.strip().split(";")[0]

    def wait(self, job, timeout=600):
        """Waits until batch job `job` ends; returns (exit code, scontrol's
        record of it)."""
        def ended():
            info = self.run(["scontrol", "show", "job", job]).stdout
            state = re.search(r"JobState=(\S+)", info)
            if state and state.group(1) not in ("PENDING", "CONFIGURING", "RUNNING",
                                                "COMPLETING", "REQUEUED"):
                return info
            return None
        info = wait_for(ended, timeout, f"batch job {job}")
        code = int(re.search(r"\bExitCode=(\d+):", info).group(1))
        return code, info

    def stop(self):
        for proc in reversed(self.procs):
            stop(proc)


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    s = Slurm(str(tmp_path_factory.mktemp("slurm")))
    yield s
    s.stop()


class LocalSluice:
    """`sluicectl up` over `shards`: a coordinator (with
    `coordinator_flags`) and `data_servers` data servers."""

    def __init__(self, d, shards, data_servers=1, coordinator_flags=()):
        os.makedirs(shards, exist_ok=True)
        self.log = os.path.join(d, "up.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "sluicectl"), "up", f"--dir={d}/up", f"--shards={shards}",
                 f"--data_servers={data_servers}", "--coordinator=127.0.0.1:0",
                 "--", *coordinator_flags],
                stdout=log, stderr=subprocess.STDOUT)

        def address():
            assert self.proc.poll() is None, open(self.log).read()
            for line in open(self.log):
                if line.startswith("coordinator ") and "(metrics" in line:
                    return line.split()[1]
            return None
        self.address = wait_for(address, 60, "sluicectl up")

    def stop(self):
        stop(self.proc)


class Nginx:
    """Debian's nginx serving `www` on a free loopback port; `gets(path)`
    counts the GETs of `path` that it answered 200."""

    def __init__(self, d, www):
        self.dir, self.port = d, free_port()
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""worker_processes 1;
{"user root root;" if os.geteuid() == 0 else ""}
pid {d}/nginx.pid;
error_log {d}/nginx-error.log;
events {{ worker_connections 256; }}
http {{
  access_log {d}/access.log;
  client_body_temp_path {d}/nb; proxy_temp_path {d}/np;
  fastcgi_temp_path {d}/nf; uwsgi_temp_path {d}/nu; scgi_temp_path {d}/ns;
  server {{ listen 127.0.0.1:{self.port}; root {www}; }}
}}
""")
        with open(os.path.join(d, "nginx.out"), "wb") as log:
            self.proc = subprocess.Popen(["/usr/sbin/nginx", "-p", d, "-c", conf, "-e",
                                          f"{d}/nginx-error.log", "-g", "daemon off;"],
                                         stdout=log, stderr=subprocess.STDOUT)

        def up():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.port)) == 0
        wait_for(up, 20, "nginx to listen")
        self.url = f"http://127.0.0.1:{self.port}"

    def gets(self, path):
        with open(os.path.join(self.dir, "access.log")) as f:
            return sum(1 for line in f if f'"GET {path} ' in line and '" 200 ' in line)

    def stop(self):
        stop(self.proc)


# ---------------------------------------------------------------- autoscaling

def write_jpeg_shards(directory, shards, per_shard):
    """Shards of noisy 320x240 JPEGs (slow to decode: a data server with one
    decode thread is the bottleneck of a trainer with no step)."""
    from PIL import Image
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(7)
    for s in range(shards):
        with tarfile.open(os.path.join(directory, f"shard-{s:03d}.tar"), "w") as tar:
            for i in range(per_shard):
                image = Image.effect_noise((320, 240), 30 + rng.randrange(20)).convert("RGB")
                jpeg = io.BytesIO()
                image.save(jpeg, "JPEG", quality=90)
                for ext, data in (("jpg", jpeg.getvalue()), ("cls", str(i).encode())):
                    info = tarfile.TarInfo(f"s{s}_{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


class Reading:
    """`sluicectl read` of decoded samples at most `rate` a second (0: no
    step); (epoch, shard, index) of each."""

    def __init__(self, coordinator, job, epochs, rate):
        self.proc = subprocess.Popen(
            [os.path.join(BIN, "sluicectl"), "read", f"--coordinator={coordinator}",
             f"--job={job}", "--rank=0", f"--read_epochs={epochs}", f"--rate={rate}",
             "--decode"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.samples, self.err = [], []
        self._threads = [threading.Thread(target=self._read, daemon=True),
                         threading.Thread(target=self._errors, daemon=True)]
        for t in self._threads:
            t.start()

    def _read(self):
        for line in self.proc.stdout:
            d = json.loads(line)
            self.samples.append((d["epoch"], d["shard"], d["index"]))

    def _errors(self):
        for line in self.proc.stderr:
            self.err.append(line)

    def finish(self, timeout):
        """Waits for the exit; the closing summary line."""
        code = self.proc.wait(timeout=timeout)
        for t in self._threads:
            t.join(timeout=10)
        assert code == 0, "".join(self.err)[-3000:]
        return self.err[-1].strip()


def find_line(lines, pattern, start=0):
    """The first match of `pattern` in `lines` from `start` on, or None."""
    for line in lines[start:]:
        m = re.search(pattern, line)
        if m:
            return m
    return None


def follow_the_need(coordinator, shards_dir, work, lines, started, drained):
    """A load step under an autoscaler of `coordinator`'s data servers (one
    running, with one decode thread, over `shards_dir`), whose output lines
    so far `lines()` returns. A trainer with no step waits for input: the
    autoscaler must print a line matching `started` (one more server) while
    it reads. Then a trainer with a 10 ms step does not wait: it must print
    one matching `drained` (a server drained) while that trainer reads.
    Every epoch exactly once across both changes, and no stream failed
    (nothing re-routed)."""
    ctl = os.path.join(BIN, "sluicectl")
    manifest = os.path.join(work, "manifest.json")
    subprocess.run([ctl, "index", shards_dir, "-o", manifest], check=True, capture_output=True)
    listed = json.load(open(manifest))["shards"]
    total = sum(int(s["num_samples"]) for s in listed)
    subprocess.run([ctl, "job", "create", f"--coordinator={coordinator}", "--name=need",
                    f"--manifest={manifest}", "--world_size=1", "--epochs=0", "--mode=dynamic",
                    "--max_samples_per_lease=20"], check=True, capture_output=True)
    fast = Reading(coordinator, "need", epochs=24, rate=0)
    wait_for(lambda: find_line(lines(), started), 60, "a second data server to be started")
    assert fast.proc.poll() is None, "the trainer finished before the fleet grew"
    summaries = [fast.finish(180)]

    mark = len(lines())
    slow = Reading(coordinator, "need", epochs=6, rate=100)
    wait_for(lambda: find_line(lines(), drained, mark), 60, "a data server to be drained")
    status = subprocess.run([ctl, "status", f"--coordinator={coordinator}"],
                            capture_output=True, text=True).stdout
    share = re.search(r"waiting for input (\d+)%", status)
    assert share and int(share.group(1)) < 10, status
    assert slow.proc.poll() is None, "the trainer finished before the fleet shrank"
    summaries.append(slow.finish(180))

    seen = collections.Counter(fast.samples + slow.samples)
    assert max(seen.values()) == 1, [s for s, n in seen.items() if n > 1][:5]
    per_epoch = collections.Counter(e for e, _, _ in seen)
    assert per_epoch == {e: total for e in range(30)}, per_epoch
    for reading, summary in zip((fast, slow), summaries):
        # A failure shows the reader's own account (each re-route is logged
        # with its cause) and what the data servers printed last.
        assert " 0 re-routed," in summary, "\n".join(
            [summary, "".join(reading.err)[-3000:], "--- data servers:", *lines()[-30:]])
