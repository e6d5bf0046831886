"""The README's "Your own data" section, run as a user runs it: its shell
block in bash, line for line, over WebDataset tars of real JPEGs, and the
training loop of "Training with it" as `my_train.py`. Only what a test must
change is changed: the data directory, the coordinator's port (through
$SLUICE_COORDINATOR, which every sluicectl command reads), 2 epochs for 90,
and the loop's body (`...`), which records what it was given.
"""
import collections
import io
import json
import os
import re
import signal
import subprocess
import tarfile

from PIL import Image

from conftest import BIN, free_port

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "..", "README.md")
SHARDS, PER_SHARD = 4, 6


def _block(text, heading, language):
    """The first ```language block under the ## heading."""
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def _write_jpeg_shards(directory):
    os.makedirs(directory)
    for s in range(SHARDS):
        with tarfile.open(os.path.join(directory, f"mine-{s:04d}.tar"), "w") as tar:
            for i in range(PER_SHARD):
                image = io.BytesIO()
                Image.new("RGB", (48 + 8 * i, 40), (40 * s, 30 * i, 200)).save(image, "JPEG")
                for ext, data in (("jpg", image.getvalue()), ("cls", str(s).encode())):
                    info = tarfile.TarInfo(f"m{s}_{i}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def test_your_own_data_runs_as_written(tmp_path):
    text = open(README, encoding="utf-8").read()
    shell = _block(text, "Your own data", "sh")
    loop = _block(text, "Training with it", "python")
    data = str(tmp_path / "data" / "mine")
    _write_jpeg_shards(data)
    address = f"127.0.0.1:{free_port()}"

    assert "range(90)" in loop and "--epochs=90" in shell
    body = re.search(r"^( +)\.\.\.$", loop, re.M)
    assert body, "the loop's body is `...`"
    indent = body.group(1)
    record = (f"{indent}seen.extend((epoch, k) for k in batch['__key__'])\n"
              f"{indent}shapes.add(tuple(batch['jpg'].shape[1:]))")
    loop = (loop.replace('"127.0.0.1:7070"', repr(address)).replace("range(90)", "range(2)")
            .replace(body.group(0), record))
    loop = ("seen, shapes = [], set()\n" + loop +
            "import json\nprint(json.dumps({'seen': seen, 'shapes': sorted(shapes)}))\n")
    (tmp_path / "my_train.py").write_text(loop)

    shell = shell.replace("/data/mine", data).replace("--epochs=90", "--epochs=2")
    script = tmp_path / "quickstart.sh"
    # The repository's build/ is where the README's `export` points; here
    # the binaries and package under test.
    # The trap stops the cluster when a line fails, too.
    script.write_text("set -e\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\ncd " + str(tmp_path) + "\n" +
                      shell.replace("$PWD/build/bin", BIN)
                      .replace("$PWD/build/python", os.environ.get("PYTHONPATH", "")) +
                      "kill %1\nwait\n")
    env = dict(os.environ, SLUICE_COORDINATOR=address)
    # Its own process group: whatever happens, the cluster it starts is
    # stopped with it.
    proc = subprocess.Popen(["bash", str(script)], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.communicate(timeout=60)
    assert proc.returncode == 0, stdout[-500:] + stderr[-6000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    per_epoch = collections.Counter(e for e, _ in result["seen"])
    assert per_epoch == {0: SHARDS * PER_SHARD, 1: SHARDS * PER_SHARD}
    assert len({tuple(s) for s in result["seen"]}) == 2 * SHARDS * PER_SHARD
    assert result["shapes"] == [[3, 224, 224]]
