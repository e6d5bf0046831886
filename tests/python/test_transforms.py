"""Image transforms on the data servers against torchvision: pixels for the
same geometry, RandomResizedCrop's sampling, bit-identical augmentations
through different data servers and after a resume, masks transformed with
their image, bad specs refused by field name."""
import hashlib
import io
import json
import math
import os
import subprocess
import tarfile

import numpy as np
import pytest
from PIL import Image
import torch
import torchvision.transforms as TV
import torchvision.transforms.functional as F

import sluice
from sluice import transforms as T

from conftest import BIN, Cluster

PHOTO = "/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg"
M32 = 0xFFFFFFFF


def philox4x32(counter, key):
    """Philox4x32-10, as server/dataserver/augment_random.h describes it."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0) & M32, p1 & M32, ((p0 >> 32) ^ c3 ^ k1) & M32, \
            p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def words(seed, epoch, shard, index, position, draw):
    counter = (index & M32, ((index >> 32) & 0x3FFFF) | (draw << 18) | (position << 24),
               shard & M32, epoch & M32)
    return philox4x32(counter, (seed & M32, seed >> 32))


def rrc_box(width, height, seed, epoch, shard, index, position=0, scale=(0.08, 1.0),
            ratio=(3 / 4, 4 / 3)):
    """RandomResizedCrop's window (top, left, h, w) from the documented
    derivation: torchvision's get_params with Philox words as its draws."""
    area = width * height
    lo, hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(10):
        u = [x / 2 ** 32 for x in words(seed, epoch, shard, index, position, attempt)]
        target = area * (scale[0] + (scale[1] - scale[0]) * u[0])
        aspect = math.exp(lo + (hi - lo) * u[1])
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(u[2] * (height - h + 1)), int(u[3] * (width - w + 1)), h, w
    in_ratio = width / height
    if in_ratio < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif in_ratio > ratio[1]:
        h, w = height, round(height * ratio[1])
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def jpeg_bytes(img, quality=92):
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def png_bytes(array):
    buf = io.BytesIO()
    Image.fromarray(array).save(buf, format="PNG")
    return buf.getvalue()


def write_tar(path, samples):
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
        for key, fields in samples:
            for ext, data in fields.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """A cluster with two data servers over two shards of photo crops (jpg)
    and one of images with masks (png + seg.png)."""
    tmp = tmp_path_factory.mktemp("transforms")
    c = Cluster(tmp, shards=1, per_shard=1, data_servers=2)
    photo = Image.open(PHOTO).convert("RGB")
    rng = np.random.default_rng(3)
    shard_dir = os.path.join(c.tmp, "shards")
    c.photo_urls = []
    for s in range(2):
        samples = []
        for i in range(12):
            w = int(rng.integers(200, 512))
            h = int(rng.integers(200, 600))
            x, y = int(rng.integers(0, 512 - w + 1)), int(rng.integers(0, 600 - h + 1))
            samples.append((f"p{s}_{i}", {"jpg": jpeg_bytes(photo.crop((x, y, x + w, y + h))),
                                          "cls": str(i).encode()}))
        path = os.path.join(shard_dir, f"photos-{s}.tar")
        write_tar(path, samples)
        c.photo_urls.append((path, 12))
    # Image + mask: the mask labels the image's bright/mid/dark areas (0/3/9).
    masks = []
    for i in range(6):
        gray = np.asarray(photo.crop((i * 20, i * 30, i * 20 + 300, i * 30 + 240)).convert("L"))
        img = np.stack([gray] * 3, -1)
        seg = np.where(gray > 170, 9, np.where(gray > 85, 3, 0)).astype(np.uint8)
        masks.append((f"m{i}", {"png": png_bytes(img), "seg.png": png_bytes(seg)}))
    c.mask_url = os.path.join(shard_dir, "masks.tar")
    write_tar(c.mask_url, masks)
    yield c
    c.stop()


def create(c, name, urls, seed=7, epochs=1, world_size=0):
    manifest = os.path.join(c.tmp, f"{name}.json")
    with open(manifest, "w") as f:
        json.dump({"shards": [{"url": u, "num_samples": n} for u, n in urls]}, f)
    out = subprocess.run([os.path.join(BIN, "sluicectl"), "job", "create",
                          f"--coordinator={c.address}", f"--name={name}", f"--manifest={manifest}",
                          f"--seed={seed}", f"--epochs={epochs}", f"--world_size={world_size}"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def read_all(c, job, transform, **kw):
    with sluice.Reader(c.address, job, transform=transform, **kw) as reader:
        return {(s.epoch, s.shard_index, s.index): s for s in reader}


def photo(url, index):
    with tarfile.open(url) as tar:
        data = tar.extractfile(f"{os.path.basename(url)[7]}".join(["p", f"_{index}.jpg"])).read()
    return Image.open(io.BytesIO(data)).convert("RGB")


def assert_same_pixels(got, want, what):
    """Every byte equal: the decode is libjpeg-turbo's, as Pillow's, and the
    resize Pillow's own arithmetic (server/dataserver/pil_resample.h)."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: {got.shape} != {want.shape}"
    d = np.abs(got.astype(int) - want.astype(int))
    assert d.max() == 0, (f"{what}: {np.count_nonzero(d)} of {d.size} bytes differ, "
                          f"mean {d.mean():.3f}, max {d.max()}")


def test_eval_transform_matches_torchvision(images):
    create(images, "tf-eval", images.photo_urls)
    got = read_all(images, "tf-eval", T.Compose([T.Resize(256), T.CenterCrop(224)]))
    ref = TV.Compose([TV.Resize(256), TV.CenterCrop(224)])
    assert len(got) == 24
    for (_, shard, index), s in got.items():
        img = s.fields["jpg"]
        assert img.dtype == np.uint8 and img.shape == (224, 224, 3)
        assert_same_pixels(img, ref(photo(images.photo_urls[shard][0], index)), f"{shard}/{index}")


def test_exact_pixels_decodes_at_full_size_where_the_default_scales_the_dct(images):
    # Resize(64) of crops at least 200 pixels on their shorter side: by
    # default the JPEG is decoded at 1/2 or 1/4 scale first (faster, a few
    # levels off); with exact_pixels every byte is torchvision's.
    create(images, "tf-exact", images.photo_urls[:1])
    create(images, "tf-scaled", images.photo_urls[:1])
    ref = TV.Compose([TV.Resize(64), TV.CenterCrop(64)])
    exact = read_all(images, "tf-exact",
                     T.Compose([T.Resize(64), T.CenterCrop(64)], exact_pixels=True))
    scaled = read_all(images, "tf-scaled", T.Compose([T.Resize(64), T.CenterCrop(64)]))
    assert len(exact) == len(scaled) == 12
    scalable = differing = 0
    for key, s in exact.items():
        src = photo(images.photo_urls[0][0], key[2])
        want = np.asarray(ref(src))
        assert_same_pixels(s.fields["jpg"], want, f"exact {key}")
        # Half the shorter side still twice the 64 pixels it is resized to.
        if min(src.size) // 2 >= 128:
            scalable += 1
            differing += int(not np.array_equal(scaled[key].fields["jpg"], want))
        else:
            assert_same_pixels(scaled[key].fields["jpg"], want, f"not scaled {key}")
    assert scalable >= 6 and differing == scalable


def test_random_resized_crop_and_flip_match_torchvision_on_the_same_window(images):
    seed = 11
    create(images, "tf-train", images.photo_urls, seed=seed, epochs=2)
    tf = T.Compose([T.RandomResizedCrop(160), T.RandomHorizontalFlip(), T.PILToTensor()])
    got = read_all(images, "tf-train", tf)
    assert len(got) == 48
    flipped = 0
    for (epoch, shard, index), s in got.items():
        img = s.fields["jpg"]
        assert img.dtype == np.uint8 and img.shape == (3, 160, 160)  # CHW
        src = photo(images.photo_urls[shard][0], index)
        top, left, h, w = rrc_box(src.width, src.height, seed, epoch, shard, index)
        want = F.resized_crop(src, top, left, h, w, [160, 160])
        flip = words(seed, epoch, shard, index, 1, 0)[0] / 2 ** 32 < 0.5
        if flip:
            want = F.hflip(want)
            flipped += 1
        assert_same_pixels(img.transpose(1, 2, 0), want, f"epoch {epoch} {shard}/{index}")
    assert 10 <= flipped <= 38
    # A new epoch gets new windows.
    same = sum(np.array_equal(got[(0, s, i)].fields["jpg"], got[(1, s, i)].fields["jpg"])
               for s in range(2) for i in range(12))
    assert same <= 2


def test_crop_sampling_follows_torchvision(images):
    # The documented derivation against torchvision's own get_params: the
    # same distribution of area fraction and aspect ratio.
    n = 4000
    ours = [rrc_box(500, 375, 5, 0, 0, i) for i in range(n)]
    torch.manual_seed(0)
    theirs = [TV.RandomResizedCrop.get_params(Image.new("RGB", (500, 375)), (0.08, 1.0),
                                              (3 / 4, 4 / 3)) for _ in range(n)]

    def stats(boxes):
        area = np.array([h * w / (500 * 375) for _, _, h, w in boxes])
        ratio = np.log([w / h for _, _, h, w in boxes])
        return np.percentile(area, [10, 50, 90]), np.percentile(ratio, [10, 50, 90])
    (a1, r1), (a2, r2) = stats(ours), stats(theirs)
    assert np.abs(a1 - a2).max() < 0.04, (a1, a2)
    assert np.abs(r1 - r2).max() < 0.04, (r1, r2)


def digest(samples):
    return {k: hashlib.sha256(s.fields["jpg"].tobytes()).hexdigest() for k, s in samples.items()}


def test_the_same_sample_is_bit_identical_on_any_data_server_and_after_a_resume(images):
    tf = T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.RandomVerticalFlip()])
    create(images, "tf-both", images.photo_urls, seed=21)
    both = digest(read_all(images, "tf-both", tf))
    assert len(both) == 24
    # Resume: half the epoch, the cursor, then a new reader from it.
    create(images, "tf-resume", images.photo_urls, seed=21)
    first = {}
    with sluice.Reader(images.address, "tf-resume", transform=tf) as reader:
        for s in reader:
            first[(s.epoch, s.shard_index, s.index)] = s
            if len(first) == 10:
                cursor = reader.cursor()
                break
    rest = read_all(images, "tf-resume", tf, resume_from=cursor)
    assert len(first) + len(rest) == 24
    assert {**digest(first), **digest(rest)} == both
    # One data server gone: every sample now comes from the other one.
    images.data[0].stop()
    try:
        create(images, "tf-one", images.photo_urls, seed=21)
        assert digest(read_all(images, "tf-one", tf)) == both
    finally:
        images.restart_data_server(0)


def test_a_mask_gets_the_images_geometry_and_keeps_its_values(images):
    create(images, "tf-masks", [(images.mask_url, 6)], seed=5)
    tf = T.Compose([T.RandomResizedCrop(128, scale=(0.2, 0.6)), T.RandomHorizontalFlip()],
                   nearest_fields=("seg.png",))
    got = read_all(images, "tf-masks", tf)
    assert len(got) == 6
    for key, s in got.items():
        img, seg = s.fields["png"], s.fields["seg.png"]
        assert img.shape == (128, 128, 3) and seg.shape == (128, 128, 1)
        assert set(np.unique(seg)) <= {0, 3, 9}, key
        # The mask labels the transformed image's own brightness: the same
        # window and flip (a different one would agree at chance level).
        gray = img[..., 0].astype(int)
        expected = np.where(gray > 170, 9, np.where(gray > 85, 3, 0))
        agree = (expected == seg[..., 0]).mean()
        assert agree > 0.9, f"{key}: mask agrees with its image at {agree:.2f}"


def test_float_output_and_normalize_match_torchvision(images):
    create(images, "tf-float", images.photo_urls[:1])
    mean, std = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
    got = read_all(images, "tf-float", T.Compose([T.CenterCrop(200), T.ToTensor(),
                                                  T.Normalize(mean, std)]))
    ref = TV.Compose([TV.CenterCrop(200), TV.ToTensor(), TV.Normalize(mean, std)])
    for (_, shard, index), s in got.items():
        x = s.fields["jpg"]
        assert x.dtype == np.float32 and x.shape == (3, 200, 200)
        want = ref(photo(images.photo_urls[shard][0], index)).numpy()
        assert np.abs(x - want).max() < 1e-5
    create(images, "tf-half", images.photo_urls[:1])
    half = read_all(images, "tf-half", T.Compose([T.CenterCrop(64), T.ToTensor(half=True),
                                                  T.Normalize(mean, std)]))
    ref_half = TV.Compose([TV.CenterCrop(64), TV.ToTensor(), TV.Normalize(mean, std)])
    for (_, shard, index), s in half.items():
        x = s.fields["jpg"]
        assert x.dtype == np.float16 and x.shape == (3, 64, 64)
        want = ref_half(photo(images.photo_urls[shard][0], index)).half().numpy()
        # float32 values a rounding apart can round to neighbouring halves.
        assert np.abs(x.astype(np.float32) - want.astype(np.float32)).max() <= 2 ** -8


@pytest.mark.parametrize("tf, field", [
    (T.Compose([T.RandomResizedCrop(0)]), "decode.transforms[0].random_resized_crop.height is 0"),
    (T.Compose([T.RandomResizedCrop(8, scale=(0.5, 1.5))]),
     "decode.transforms[0].random_resized_crop.scale_max is 1.5"),
    (T.Compose([T.RandomResizedCrop(8, ratio=(2, 1))]),
     "decode.transforms[0].random_resized_crop.ratio_min (2) is greater than ratio_max"),
    (T.Compose([T.CenterCrop(8), T.ToTensor(), T.Normalize([0.5], [0.5])]),
     "decode.to_float.mean has 1 values for an image of 3 channels"),
])
def test_bad_specs_are_refused_naming_the_field(images, tf, field):
    name = "tf-bad-" + hashlib.sha1(repr(tf).encode()).hexdigest()[:8]
    create(images, name, images.photo_urls[:1])
    with pytest.raises(sluice.ReaderError) as e:
        read_all(images, name, tf)
    assert field in str(e.value)


def test_sluicectl_read_takes_a_decode_spec(images):
    create(images, "tf-cli", images.photo_urls[:1])
    ctl = [os.path.join(BIN, "sluicectl"), "read", "--job=tf-cli", f"--coordinator={images.address}"]
    spec = ("transforms { random_resized_crop { height: 32 width: 48 } } "
            "transforms { horizontal_flip { p: 0.5 } } layout: IMAGE_LAYOUT_CHW")
    out = subprocess.run(ctl + [f"--decode_spec={spec}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(lines) == 12 and all(d["fields"]["jpg"] == 32 * 48 * 3 for d in lines)
    # Decoded tensors also give their shape (CHW here).
    assert all(d["shapes"] == {"jpg": [3, 32, 48]} for d in lines)
    bad = subprocess.run(ctl + ["--decode_spec=transforms { no_such_op {} }"], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "--decode_spec" in bad.stderr


def test_a_unit_resumed_mid_way_on_another_data_server_gets_the_same_pixels(images):
    # A re-route reads the rest of a unit from another data server with
    # ReadRequest.start: the samples after it must come out as the first
    # server would have made them.
    import grpc
    from sluice.v1 import common_pb2, dataserver_pb2

    url = images.photo_urls[0][0]
    spec = T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip()]).decode_spec()

    def read(address, start, epoch=0):
        lease = common_pb2.Lease(lease_id=f"tf/e{epoch}/s{start}", job="tf", epoch=epoch,
                                 augment_seed=21, fence=1,
                                 unit=common_pb2.WorkUnit(
                                     shard=common_pb2.ShardRange(shard_index=0, url=url),
                                     begin=0, end=12))
        with grpc.insecure_channel(address) as channel:
            call = channel.unary_stream("/sluice.v1.DataServer/ReadSamples",
                                        request_serializer=dataserver_pb2.ReadRequest.SerializeToString,
                                        response_deserializer=dataserver_pb2.SampleBatch.FromString)
            request = dataserver_pb2.ReadRequest(lease=lease, start=start, decode=spec)
            return {s.index: s.fields[0].tensor.data for b in call(request, timeout=30)
                    for s in b.samples}
    whole = read(images.data[0].address, 0)
    rest = read(images.data[1].address, 5)
    assert sorted(whole) == list(range(12)) and sorted(rest) == list(range(5, 12))
    assert all(rest[i] == whole[i] for i in range(5, 12))
    other_epoch = read(images.data[1].address, 5, epoch=1)
    assert sum(other_epoch[i] == whole[i] for i in range(5, 12)) <= 1


def test_png_crops_of_every_colour_type_match_pil(images):
    # A centre crop above the last row inflates only the rows down to its
    # bottom; palette (with and without a transparent entry), 1-bit, gray +
    # alpha and RGBA files come out as PIL converts them.
    photo_img = Image.open(PHOTO).convert("RGB").crop((0, 0, 96, 80))
    palette = photo_img.quantize(colors=16)
    transparent = palette.copy()
    transparent.info["transparency"] = 3
    kinds = {
        "pal": (palette, "RGB"),
        "paltrns": (transparent, "RGBA"),
        "bit": (photo_img.convert("1"), "L"),
        "la": (photo_img.convert("LA"), "LA"),
        "rgba": (photo_img.convert("RGBA"), "RGBA"),
    }
    samples = []
    for key, (img, _) in kinds.items():
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        samples.append((key, {"png": buf.getvalue()}))
    path = os.path.join(images.tmp, "shards", "png-kinds.tar")
    write_tar(path, samples)
    create(images, "png-kinds", [(path, len(samples))])
    got = read_all(images, "png-kinds", T.Compose([T.CenterCrop((30, 50))]))
    assert len(got) == len(kinds)
    for s in got.values():
        img, mode = kinds[s.key]
        want = np.asarray(TV.CenterCrop((30, 50))(img.convert(mode)))
        have = s.fields["png"]
        assert have.dtype == np.uint8
        assert have.reshape(want.shape).tolist() == want.tolist(), s.key
