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
import os
import re
import signal
import socket
import subprocess
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
    """`sluicectl up` over `shards`: a coordinator and one data server."""

    def __init__(self, d, shards):
        os.makedirs(shards, exist_ok=True)
        self.log = os.path.join(d, "up.log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [os.path.join(BIN, "sluicectl"), "up", f"--dir={d}/up", f"--shards={shards}",
                 "--data_servers=1", "--coordinator=127.0.0.1:0"],
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

