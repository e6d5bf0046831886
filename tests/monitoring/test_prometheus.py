"""The dashboards and alerts against a real Prometheus scraping a live cluster.

A coordinator and two data servers (local shards plus remote ones behind
Debian's nginx, so the shard cache works too) run a 3-rank job and a job
mixing two sources; Debian's
Prometheus scrapes them every second and evaluates dashboards/alerts.yml.
Then:
  * every PromQL expression of every dashboard panel (and template
    variable) and of every alert rule returns a non-empty result, and names
    only metrics the servers export;
  * `promtool check metrics` passes on both servers' /metrics under load,
    `promtool check rules` and `promtool test rules` pass;
  * the trainers are SIGKILLed in a burst and SluiceLeaseExpiryStorm fires in
    the live Prometheus;
  * the Kubernetes ConfigMap / PrometheusRule are in sync with dashboards/;
  * the main panels are rendered from the live data into a PNG.

Every process is started here, on 127.0.0.1, and stopped by its own PID.
"""
import ctypes
import io
import json
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request
import zlib

import pytest
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
DASHBOARDS = os.path.join(ROOT, "dashboards")
BIN = os.environ.get("SLUICE_BIN_DIR", os.path.join(ROOT, "build", "bin"))
SCREENSHOT = os.environ.get("SLUICE_SCREENSHOT",
                            os.path.join(os.path.dirname(BIN), "sluice-overview.png"))
NAMESPACE = "sluice-test"
# Grafana's variables as "All" / a short rate window.
VARIABLES = {"$namespace": ".*", "$job": ".*", "$__rate_interval": "30s", "${datasource}": ""}
QUERY_DEADLINE_S = 90
# `make screenshot` lets the workload run this long before rendering, so the
# picture shows minutes of history; 0 in the test run.
HISTORY_S = float(os.environ.get("SLUICE_MONITORING_HISTORY_S", "0"))


def wait_for(predicate, timeout, what, interval=0.2):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)  # polling with a deadline


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def png(width, height, seed):
    """A small RGB PNG (no imaging library needed)."""
    rows = b"".join(b"\0" + bytes((x * 7 + y * 3 + seed) % 256 for x in range(width * 3))
                    for y in range(height))

    def chunk(kind, data):
        return (struct.pack(">I", len(data)) + kind + data +
                struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


def write_shard(path, shard, samples):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(samples):
            for ext, data in (("png", png(16, 12, shard * 31 + i)), ("cls", str(i % 10).encode())):
                info = tarfile.TarInfo(f"s{shard}_{i}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def _die_with_parent():
    # PR_SET_PDEATHSIG: if pytest itself is killed, its children go too.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


class Proc:
    """A child process with its log; stopped by its own PID."""

    def __init__(self, argv, log_path, env=None):
        self.log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     preexec_fn=_die_with_parent)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


class Server(Proc):
    """A Sluice server on 127.0.0.1:0 reporting its ports through --port_file."""

    def __init__(self, binary, workdir, args):
        os.makedirs(workdir, exist_ok=True)
        port_file = os.path.join(workdir, "ports")
        super().__init__([os.path.join(BIN, binary), "--listen=127.0.0.1:0",
                          "--metrics_listen=127.0.0.1:0", f"--port_file={port_file}", *args],
                         os.path.join(workdir, "log"))

        def ports():
            assert self.proc.poll() is None, f"{binary} exited: see {workdir}/log"
            if not os.path.exists(port_file):
                return None
            kv = dict(line.split("=", 1) for line in open(port_file).read().split())
            return kv if "grpc" in kv else None
        kv = wait_for(ports, 30, f"{binary} to listen")
        self.address, self.metrics = kv["grpc"], kv["metrics"]

    def metrics_text(self):
        return urllib.request.urlopen(f"http://{self.metrics}/metrics", timeout=10).read().decode()


def ctl(coordinator, *args):
    out = subprocess.run([os.path.join(BIN, "sluicectl"), *args, f"--coordinator={coordinator}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, f"sluicectl {args}: {out.stderr}"
    return out.stdout


class Live:
    """The cluster, nginx, Prometheus and the workload."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.procs = []
        self.started = time.monotonic()
        shards = os.path.join(tmp, "shards")
        www = os.path.join(tmp, "www")
        os.makedirs(shards)
        os.makedirs(www)
        manifest = []
        self.nginx_port = free_port()
        for s in range(24):
            remote = s % 3 == 0  # a third of the shards over http, through the cache
            path = os.path.join(www if remote else shards, f"shard-{s:03d}.tar")
            write_shard(path, s, 20)
            url = f"http://127.0.0.1:{self.nginx_port}/shard-{s:03d}.tar" if remote else path
            manifest.append({"url": url, "num_samples": 20, "size_bytes": os.path.getsize(path)})
        # One damaged shard: a member's data cut short. Its samples arrive
        # skipped and count as corrupt.
        damaged = os.path.join(shards, "damaged.tar")
        write_shard(damaged, 99, 20)
        with open(damaged, "r+b") as f:
            f.truncate(3000)
        manifest.append({"url": damaged, "num_samples": 20, "size_bytes": 3000})
        with open(os.path.join(tmp, "manifest.json"), "w") as f:
            json.dump({"shards": manifest}, f)
        self.start_nginx(www)
        self.coordinator = self.spawn_server("sluice-coordinator", "coordinator",
                                             [f"--journal_dir={tmp}/journal",
                                              "--heartbeat_interval=250ms"])
        self.dataservers = [
            self.spawn_server("sluice-dataserver", f"dataserver-{i}",
                              [f"--roots={shards}", f"--cache_dir={tmp}/cache-{i}",
                               f"--coordinator={self.coordinator.address}"])
            for i in range(2)]
        self.start_prometheus()
        ctl(self.coordinator.address, "job", "create", "--name=train",
            f"--manifest={tmp}/manifest.json", "--world_size=3", "--epochs=0", "--lease_ttl=2s",
            "--max_samples_per_lease=10")
        # A second job mixing two datasets (the local shards split in two),
        # read by one slow trainer: the per-source series.
        local = [m for m in manifest if m["url"].startswith("/") and m["url"] != damaged]
        for name, part in (("web", local[0::2]), ("books", local[1::2])):
            with open(os.path.join(tmp, f"{name}.json"), "w") as f:
                json.dump({"shards": part}, f)
        ctl(self.coordinator.address, "job", "create", "--name=mixed", "--world_size=1",
            "--epochs=0", "--lease_ttl=2s", "--samples_per_epoch=100",
            "--source", f"name=web,manifest={tmp}/web.json,weight=0.7",
            "--source", f"name=books,manifest={tmp}/books.json,weight=0.3")
        self.mix_reader = None  # started by start_mix_reader
        self.trainers = []
        self.start_trainers()

    def spawn_server(self, binary, name, args):
        server = Server(binary, os.path.join(self.tmp, name), args)
        self.procs.append(server)
        return server

    def start_nginx(self, www):
        conf = os.path.join(self.tmp, "nginx.conf")
        with open(conf, "w") as f:
            f.write(f"""worker_processes 1;
{"user root root;" if os.geteuid() == 0 else ""}
pid {self.tmp}/nginx.pid;
error_log {self.tmp}/nginx-error.log;
events {{ worker_connections 256; }}
http {{
  access_log {self.tmp}/nginx-access.log;
  client_body_temp_path {self.tmp}/nb; proxy_temp_path {self.tmp}/np;
  fastcgi_temp_path {self.tmp}/nf; uwsgi_temp_path {self.tmp}/nu; scgi_temp_path {self.tmp}/ns;
  server {{ listen 127.0.0.1:{self.nginx_port}; root {www}; }}
}}
""")
        self.nginx = Proc(["/usr/sbin/nginx", "-p", self.tmp, "-c", conf, "-e",
                           f"{self.tmp}/nginx-error.log", "-g", "daemon off;"],
                          os.path.join(self.tmp, "nginx.out"))
        self.procs.append(self.nginx)

        def up():
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", self.nginx_port)) == 0
        wait_for(up, 20, "nginx to listen")

    def start_prometheus(self):
        self.prom_port = free_port()
        targets = lambda servers: [s.metrics for s in servers]  # noqa: E731
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [os.path.join(DASHBOARDS, "alerts.yml")],
            "scrape_configs": [
                {"job_name": "sluice-coordinator",
                 "static_configs": [{"targets": targets([self.coordinator]),
                                     "labels": {"namespace": NAMESPACE}}]},
                {"job_name": "sluice-dataserver",
                 "static_configs": [{"targets": targets(self.dataservers),
                                     "labels": {"namespace": NAMESPACE}}]},
            ],
        }
        path = os.path.join(self.tmp, "prometheus.yml")
        with open(path, "w") as f:
            json.dump(config, f)  # JSON is YAML
        self.prometheus = Proc(["/usr/bin/prometheus", f"--config.file={path}",
                                f"--storage.tsdb.path={self.tmp}/tsdb",
                                f"--web.listen-address=127.0.0.1:{self.prom_port}",
                                "--log.level=warn"],
                               os.path.join(self.tmp, "prometheus.log"))
        self.procs.append(self.prometheus)
        wait_for(lambda: self.api_ok("/-/ready"), 60, "Prometheus to be ready")

    def start_trainers(self):
        for rank in range(3):
            self.trainers.append(Proc(
                [os.path.join(BIN, "sluicectl"), "read", "--job=train", f"--rank={rank}",
                 "--decode", "--rate=40", f"--coordinator={self.coordinator.address}"],
                os.path.join(self.tmp, f"trainer-{len(self.trainers)}.log")))

    def start_mix_reader(self):
        if self.mix_reader is None:
            self.mix_reader = Proc(
                [os.path.join(BIN, "sluicectl"), "read", "--job=mixed", "--rank=0", "--rate=20",
                 f"--coordinator={self.coordinator.address}"],
                os.path.join(self.tmp, "mix-reader.log"))
            self.procs.append(self.mix_reader)

    def kill_trainers(self):
        for t in self.trainers:
            t.kill()

    def api_ok(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.prom_port}{path}", timeout=5) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.prom_port}{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr):
        return self.api("/api/v1/query", query=expr)["result"]

    def close(self):
        for t in self.trainers:
            t.stop()
        for p in reversed(self.procs):
            p.stop()


@pytest.fixture(scope="module")
def live():
    for tool in ("/usr/bin/prometheus", "/usr/bin/promtool", "/usr/sbin/nginx"):
        assert os.path.exists(tool), f"{tool} missing: run `make deps`"
    tmp = tempfile.mkdtemp(prefix="sluice-monitoring-")
    cluster = Live(tmp)
    try:
        yield cluster
    finally:
        cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


# ------------------------------------------------------------- expressions

def dashboard():
    with open(os.path.join(DASHBOARDS, "sluice-overview.json")) as f:
        return json.load(f)


def panel_queries(board):
    """(panel title, expr) for every target of every panel, rows included."""
    out = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                out.append((p["title"], t["expr"]))
    walk(board["panels"])
    return out


def variable_queries(board):
    """label_values(metric{sel}, label) variables as `count by (label) (metric{sel})`."""
    out = []
    for v in board["templating"]["list"]:
        if v["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", v["definition"])
        assert m, f"variable {v['name']}: unsupported query {v['definition']}"
        out.append((f"variable {v['name']}", f"count by ({m.group(2)}) ({m.group(1)})"))
    return out


def alert_rules():
    import yaml
    with open(os.path.join(DASHBOARDS, "alerts.yml")) as f:
        rules = yaml.safe_load(f)
    return [(r["alert"], r["expr"]) for g in rules["groups"] for r in g["rules"]]


def substitute(expr):
    for name, value in VARIABLES.items():
        expr = expr.replace(name, value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def with_bool(expr):
    """`a > 1` -> `a > bool 1`: the comparison's inputs, whether or not it
    holds right now (an alert that is not firing has an empty result)."""
    out, depth, quoted, i = [], 0, False, 0
    while i < len(expr):
        c = expr[i]
        if c == '"':
            quoted = not quoted
        elif not quoted and c == "{":
            depth += 1
        elif not quoted and c == "}":
            depth -= 1
        if not quoted and depth == 0:
            m = re.match(r"(==|!=|>=|<=|>|<)", expr[i:])
            if m:
                out.append(m.group(1) + " bool")
                i += len(m.group(1))
                continue
        out.append(c)
        i += 1
    return "".join(out)


SUFFIXES = ("_bucket", "_sum", "_count")


def unknown_metrics(expr, exported):
    """Metric names in `expr` that the servers do not export."""
    # Label names are not metric names: drop matchers and grouping clauses.
    bare = re.sub(r'\{[^}]*\}', "", expr)
    bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
    names = set(re.findall(r"\b(sluice_[a-z0-9_]+|up)\b", bare))
    missing = []
    for name in sorted(names):
        base = name
        for s in SUFFIXES:
            if name.endswith(s) and name[: -len(s)] in exported:
                base = name[: -len(s)]
        if base not in exported and name not in exported:
            missing.append(name)
    return missing


def exported_names(live):
    names = set()
    for server in [live.coordinator, *live.dataservers]:
        for line in server.metrics_text().splitlines():
            if line.startswith("# TYPE "):
                names.add(line.split()[2])
    return names | {"up"}


# ------------------------------------------------------------------- tests

def test_targets_are_scraped(live):
    def all_up():
        targets = live.api("/api/v1/targets")["activeTargets"]
        return len(targets) == 3 and all(t["health"] == "up" for t in targets)
    wait_for(all_up, 60, "all three targets up")


def test_promtool_check_metrics_under_load(live):
    # Load: trainers reading (decoding) from both data servers right now.
    wait_for(lambda: "sluice_dataserver_samples_served_total 0" not in
             live.dataservers[0].metrics_text(), 60, "the data servers to serve samples")
    for server in [live.coordinator, *live.dataservers]:
        text = server.metrics_text()
        out = subprocess.run(["/usr/bin/promtool", "check", "metrics"], input=text,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and not out.stdout.strip() and not out.stderr.strip(), (
            f"{server.metrics}: {out.stdout}{out.stderr}")


def test_rules_check_and_unit_tests():
    for args in (["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]):
        out = subprocess.run(["/usr/bin/promtool", *args], cwd=DASHBOARDS, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}{out.stderr}"


def test_the_checker_rejects_a_metric_the_servers_do_not_export(live):
    exported = exported_names(live)
    assert unknown_metrics("rate(sluice_dataserver_samples_served_total[1m])", exported) == []
    assert unknown_metrics("rate(sluice_dataserver_samples_sent_total[1m])", exported) == [
        "sluice_dataserver_samples_sent_total"]
    assert unknown_metrics("histogram_quantile(0.9, rate(sluice_dataserver_decode_seconds_bucket[1m]))",
                           exported) == []
    assert live.query("sluice_dataserver_samples_sent_total") == []


def expressions():
    board = dashboard()
    return ([("panel", t, substitute(e)) for t, e in panel_queries(board) + variable_queries(board)] +
            [("alert", a, with_bool(e)) for a, e in alert_rules()])


def test_lease_expiry_alert_fires_after_trainers_are_killed(live):
    # First of the tests that change the workload. The trainers hold more
    # leases than half their sessions (the alert's bar); kill them all at
    # once.
    wait_for(lambda: live.query('sum(sluice_coordinator_live_leases) > 3'), 60,
             "trainers to hold leases")
    live.kill_trainers()

    def firing():
        alerts = live.api("/api/v1/alerts")["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "SluiceLeaseExpiryStorm"
                and a["state"] == "firing"]
    alerts = wait_for(firing, 60, "SluiceLeaseExpiryStorm to fire")
    assert alerts[0]["labels"]["sluice_job"] == "train"
    assert alerts[0]["labels"]["namespace"] == NAMESPACE
    expired = live.query('sum(sluice_coordinator_leases_expired_total{sluice_job="train"})')
    assert float(expired[0]["value"][1]) >= 3
    # The survivors' replacements pick the work up: progress resumes.
    before = float(live.query("sum(sluice_coordinator_leases_completed_total)")[0]["value"][1])
    live.start_trainers()
    wait_for(lambda: float(live.query("sum(sluice_coordinator_leases_completed_total)")[0]
                           ["value"][1]) > before, 60, "progress after the restart")


def test_every_dashboard_and_alert_expression_returns_data(live):
    live.start_mix_reader()  # the per-source series
    exprs = expressions()
    assert len([e for e in exprs if e[0] == "panel"]) >= 30
    assert len([e for e in exprs if e[0] == "alert"]) == 14
    exported = exported_names(live)
    unknown = {f"{kind} {title}: {m}" for kind, title, e in exprs for m in unknown_metrics(e, exported)}
    assert not unknown, "queries name metrics the servers do not export:\n" + "\n".join(sorted(unknown))
    pending = {(kind, title, e) for kind, title, e in exprs}

    def all_have_data():
        for item in sorted(pending):
            if live.query(item[2]):
                pending.discard(item)
        return not pending
    try:
        wait_for(all_have_data, QUERY_DEADLINE_S, "every expression to return data", interval=1)
    except AssertionError:
        raise AssertionError("expressions with an empty result:\n" +
                             "\n".join(f"{k} {t}: {e}" for k, t, e in sorted(pending)))


def test_the_input_panel_sees_the_trainers_waits(live):
    # The workload's trainers report every sample they take: the histogram's
    # count grows in Prometheus, and the panel's share is a fraction.
    board = dashboard()
    expr = next(e for t, e in panel_queries(board) if t == "Is input the bottleneck?")

    def counted():
        result = live.query("sum(sluice_trainer_input_wait_seconds_count)")
        return result and float(result[0]["value"][1]) > 0
    wait_for(counted, QUERY_DEADLINE_S, "trainers' input waits in Prometheus", interval=1)

    def share():
        result = live.query(substitute(expr))
        values = [float(r["value"][1]) for r in result]
        return values and all(0 <= v <= 1 for v in values)
    wait_for(share, QUERY_DEADLINE_S, "the input-wait share to be a fraction", interval=1)


def test_the_autoscaler_reads_the_coordinators_estimate(live):
    # The HPA of k8s/components/autoscaling scales the data servers to the
    # external metric prometheus-adapter serves with this rule: its query,
    # with the adapter's template filled in as for a metric that is not
    # namespaced, returns the coordinator's estimate from the live
    # Prometheus.
    path = os.path.join(ROOT, "k8s", "components", "autoscaling",
                        "prometheus-adapter-rules.yaml")
    with open(path) as f:
        config = yaml.safe_load(yaml.safe_load(f)["data"]["config.yaml"])
    rule, pool_rule = config["externalRules"]

    def query(r, matchers=""):
        return (r["metricsQuery"].replace("<<.Series>>", r["seriesQuery"])
                .replace("<<.LabelMatchers>>", matchers).replace("<<.GroupBy>>", ""))

    def estimate(expr):
        result = live.query(expr)
        return result and float(result[0]["value"][1]) >= 1 and result
    (sample,) = wait_for(lambda: estimate(query(rule)), QUERY_DEADLINE_S,
                         "the coordinator's estimate", interval=1)
    direct = live.query("sluice_coordinator_desired_data_servers")
    assert float(sample["value"][1]) == max(float(r["value"][1]) for r in direct)
    # The default pool's estimate, as an HPA selecting {pool: ""} reads it:
    # the one pool here, so the whole estimate.
    (pooled,) = wait_for(lambda: estimate(query(pool_rule, 'pool=""')), QUERY_DEADLINE_S,
                         "the default pool's estimate", interval=1)
    assert pooled["metric"].get("pool", "") == ""
    assert float(pooled["value"][1]) == float(sample["value"][1])
    with open(os.path.join(ROOT, "k8s", "components", "autoscaling", "hpa.yaml")) as f:
        hpa = yaml.safe_load(f)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}


def test_kubernetes_forms_are_in_sync():
    out = subprocess.run(["/usr/bin/python3", os.path.join(DASHBOARDS, "sync_k8s.py"), "--check"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_render_main_panels_from_live_data(live):
    if HISTORY_S > 0:
        time.sleep(HISTORY_S)  # collecting history for the picture, not synchronising
    render = os.path.join(HERE, "render_dashboard.py")
    minutes = max(1.0, (time.monotonic() - live.started) / 60)
    out = subprocess.run(["/usr/bin/python3", render, f"--prometheus=http://127.0.0.1:{live.prom_port}",
                          f"--output={SCREENSHOT}", f"--minutes={minutes:.1f}"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert os.path.getsize(SCREENSHOT) > 20000
    assert "panels with data: 8/8" in out.stdout, out.stdout
