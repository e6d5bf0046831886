"""Image transforms the data servers run, named and parametrised as
torchvision.transforms, so a pipeline ports line by line:

    from sluice import transforms as T
    train = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(),
                       T.ToTensor(), T.Normalize(mean, std)])
    ds = ShardLeaseDataset(coordinator, job, transform=train)

Every image field of a sample (jpg/jpeg/png) goes through the transforms with
the same geometry (an image and its mask get the same crop and flip); fields
named in Compose(nearest_fields=...) are resampled with nearest neighbour
(masks, label maps), the others with antialiased bilinear, as torchvision's
default on PIL images. Without ToTensor/PILToTensor images are uint8 [H, W, C]
(4x smaller on the wire than floats).

Random choices (crop windows, flips) are a pure function of the job's seed,
the epoch, the shard, the sample's index and the transform's position: the
same sample gets the same crop on any data server, after a re-route and
after a resume, and a new epoch gets new ones.

Geometric transforms come first; ToTensor / PILToTensor and Normalize, which
only change the output's layout and type, come last.
"""
import math
import numbers

from sluice.v1 import dataserver_pb2


def _size(size, what):
    if isinstance(size, numbers.Integral):
        return int(size), int(size)
    size = tuple(size)
    if len(size) == 1:
        return int(size[0]), int(size[0])
    if len(size) != 2:
        raise ValueError(f"{what}: size must be an int or (height, width), not {size!r}")
    return int(size[0]), int(size[1])


class Resize:
    """Resize(int): the shorter side becomes `size`, the longer one keeps the
    aspect ratio (floor), as torchvision's Resize(int). Resize((h, w)): exactly
    that size."""

    def __init__(self, size):
        if isinstance(size, numbers.Integral) or len(tuple(size)) == 1:
            side = int(size) if isinstance(size, numbers.Integral) else int(tuple(size)[0])
            self._proto = dataserver_pb2.Resize(shorter_side=side)
        else:
            h, w = _size(size, "Resize")
            self._proto = dataserver_pb2.Resize(height=h, width=w)

    def _transform(self):
        return dataserver_pb2.Transform(resize=self._proto)

    def __repr__(self):
        p = self._proto
        return f"Resize({p.shorter_side or (p.height, p.width)})"


class CenterCrop:
    def __init__(self, size):
        self.size = _size(size, "CenterCrop")

    def _transform(self):
        h, w = self.size
        return dataserver_pb2.Transform(center_crop=dataserver_pb2.CenterCrop(height=h, width=w))

    def __repr__(self):
        return f"CenterCrop({self.size})"


class RandomResizedCrop:
    """torchvision's sampling: area fraction uniform in `scale`, log aspect
    ratio uniform in log(`ratio`), 10 attempts, then the central crop."""

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0)):
        self.size = _size(size, "RandomResizedCrop")
        self.scale = (float(scale[0]), float(scale[1]))
        self.ratio = (float(ratio[0]), float(ratio[1]))

    def _transform(self):
        h, w = self.size
        return dataserver_pb2.Transform(random_resized_crop=dataserver_pb2.RandomResizedCrop(
            height=h, width=w, scale_min=self.scale[0], scale_max=self.scale[1],
            ratio_min=self.ratio[0], ratio_max=self.ratio[1]))

    def __repr__(self):
        return f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio})"


class RandomHorizontalFlip:
    def __init__(self, p=0.5):
        self.p = float(p)

    def _transform(self):
        return dataserver_pb2.Transform(horizontal_flip=dataserver_pb2.RandomFlip(p=self.p))

    def __repr__(self):
        return f"RandomHorizontalFlip(p={self.p})"


class RandomVerticalFlip:
    def __init__(self, p=0.5):
        self.p = float(p)

    def _transform(self):
        return dataserver_pb2.Transform(vertical_flip=dataserver_pb2.RandomFlip(p=self.p))

    def __repr__(self):
        return f"RandomVerticalFlip(p={self.p})"


class PILToTensor:
    """uint8 [C, H, W], as torchvision's PILToTensor."""

    def __repr__(self):
        return "PILToTensor()"


class ToTensor:
    """float32 [C, H, W] in [0, 1], as torchvision's ToTensor (half=True:
    float16, half the bytes on the wire)."""

    def __init__(self, half=False):
        self.half = bool(half)

    def __repr__(self):
        return f"ToTensor(half={self.half})" if self.half else "ToTensor()"


class Normalize:
    """(x - mean[c]) / std[c] per channel, after ToTensor."""

    def __init__(self, mean, std):
        self.mean = [float(m) for m in mean]
        self.std = [float(s) for s in std]
        if len(self.mean) != len(self.std):
            raise ValueError(f"Normalize: {len(self.mean)} means and {len(self.std)} stds")
        if any(s == 0 or not math.isfinite(s) for s in self.std):
            raise ValueError(f"Normalize: std must be finite and non-zero, not {self.std}")

    def __repr__(self):
        return f"Normalize(mean={self.mean}, std={self.std})"


_GEOMETRIC = (Resize, CenterCrop, RandomResizedCrop, RandomHorizontalFlip, RandomVerticalFlip)


class Compose:
    """The transforms, in order. `nearest_fields`: image fields ("seg.png")
    resampled with nearest neighbour. `exact_pixels`: decode every JPEG at
    full size before resizing it, so every pixel is torchvision's; by
    default a region at least twice the resize's size is decoded
    DCT-scaled first, which is faster and differs by a few levels."""

    def __init__(self, transforms, nearest_fields=(), exact_pixels=False):
        self.transforms = list(transforms)
        self.nearest_fields = tuple(nearest_fields)
        self.exact_pixels = bool(exact_pixels)
        self._spec = self._build()

    def _build(self):
        spec = dataserver_pb2.DecodeSpec(decode=True, nearest_fields=list(self.nearest_fields),
                                         exact_pixels=self.exact_pixels)
        output_stage = False
        for i, t in enumerate(self.transforms):
            if isinstance(t, _GEOMETRIC):
                if output_stage:
                    raise ValueError(f"transform {i} ({t!r}) comes after ToTensor/PILToTensor/"
                                     "Normalize; put geometric transforms first")
                spec.transforms.append(t._transform())
            elif isinstance(t, PILToTensor):
                output_stage = True
                spec.layout = dataserver_pb2.IMAGE_LAYOUT_CHW
            elif isinstance(t, ToTensor):
                output_stage = True
                spec.layout = dataserver_pb2.IMAGE_LAYOUT_CHW
                spec.to_float.enabled = True
                spec.to_float.half = t.half
            elif isinstance(t, Normalize):
                if not spec.to_float.enabled:
                    raise ValueError(f"transform {i} (Normalize) needs ToTensor before it")
                if spec.to_float.mean:
                    raise ValueError(f"transform {i}: a second Normalize")
                spec.to_float.mean.extend(t.mean)
                spec.to_float.std.extend(t.std)
            else:
                raise ValueError(f"transform {i} ({t!r}) is not one of sluice.transforms "
                                 "(the data servers run them; apply others in the training "
                                 "loop)")
        return spec

    def decode_spec(self):
        """The DecodeSpec sent to the data servers."""
        spec = dataserver_pb2.DecodeSpec()
        spec.CopyFrom(self._spec)
        return spec

    def __repr__(self):
        return "Compose([" + ", ".join(repr(t) for t in self.transforms) + "])"
