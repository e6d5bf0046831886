"""Image datasets for the tests and benchmarks: photo-like JPEGs and
WebDataset tars of them (no cluster, no binaries: importable anywhere)."""
import io
import os
import tarfile


def photo_like_jpegs(n, width=500, height=375, quality=90, seed=7):
    """`n` distinct JPEGs (gradients that differ per image, with noise),
    about 500x375 photos' size by default."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    out = []
    for i in range(n):
        img = np.stack([(x * (i % 251 + 1)) % 256, (y * 3 + i * 17) % 256, ((x + y) * 2) % 256],
                       -1)
        img = (img + rng.integers(0, 40, img.shape)).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(img).save(buf, format="JPEG", quality=quality)
        out.append(buf.getvalue())
    return out


def write_tars(directory, shards, per_shard, sample, name):
    """Tars {name}-{S:03d}.tar of `per_shard` samples each; sample(s, i)
    gives a sample's key and its [(extension, bytes)]. Returns
    [(path, per_shard)]."""
    os.makedirs(directory, exist_ok=True)
    urls = []
    for s in range(shards):
        path = os.path.join(directory, f"{name}-{s:03d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for i in range(per_shard):
                key, fields = sample(s, i)
                for ext, data in fields:
                    info = tarfile.TarInfo(f"{key}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        urls.append((path, per_shard))
    return urls


def write_jpeg_shards(directory, shards, per_shard, jpegs, name="bench"):
    """Samples {S:03d}_{I:05d}, each a .jpg (the sample's number in the
    dataset modulo len(jpegs) picks it) and a .cls."""
    return write_tars(
        directory, shards, per_shard,
        lambda s, i: (f"{s:03d}_{i:05d}", [("jpg", jpegs[(s * per_shard + i) % len(jpegs)]),
                                           ("cls", str(i % 1000).encode())]),
        name)
