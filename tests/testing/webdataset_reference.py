#!/usr/bin/python3
"""Reference grouping: what the `webdataset` library yields for a tar.

A line-for-line restatement of webdataset's tar_file_iterator (tariterators.py)
and group_by_keys with base_plus_ext, written for the tests (the library is not
packaged in Debian). Python's tarfile reads the archive, as webdataset does.

  webdataset_reference.py split NAMES_FILE   one hex name per line ->
                                             "hexkey hexfield" or "-"
  webdataset_reference.py group TAR          one sample per line:
      hexkey [!duplicate] field=hexdata ...
"""
import re
import sys
import tarfile

META_PREFIX, META_SUFFIX = "__", "__"
SKIP_META = r"__[^/]*__($|/)"


def base_plus_ext(path):
    match = re.match(r"^((?:.*/|)[^.]+)[.]([^/]*)$", path)
    if not match:
        return None, None
    return match.group(1), match.group(2)


def tar_file_iterator(path):
    with tarfile.open(path, mode="r|*") as stream:
        for tarinfo in stream:
            fname = tarinfo.name
            if not tarinfo.isreg():
                continue
            if fname is None:
                continue
            if "/" not in fname and fname.startswith(META_PREFIX) and fname.endswith(META_SUFFIX):
                continue
            if re.match(SKIP_META, fname):
                continue
            yield fname, stream.extractfile(tarinfo).read()


def group_by_keys(files):
    current = None
    for fname, value in files:
        prefix, suffix = base_plus_ext(fname)
        if prefix is None:
            continue
        suffix = suffix.lower()
        if current is None or prefix != current["__key__"]:
            if current is not None:
                yield current
            current = {"__key__": prefix, "fields": [], "duplicate": False}
        names = [n for n, _ in current["fields"]]
        if suffix in names:
            current["duplicate"] = True  # webdataset raises ValueError here
            continue
        current["fields"].append((suffix, value))
    if current is not None:
        yield current


def split_meta(name):
    if "/" not in name and name.startswith(META_PREFIX) and name.endswith(META_SUFFIX):
        return True
    return re.match(SKIP_META, name) is not None


def main():
    mode, path = sys.argv[1], sys.argv[2]
    out = sys.stdout
    if mode == "split":
        for line in open(path):
            name = bytes.fromhex(line.strip()).decode("utf-8", "surrogateescape")
            key, ext = base_plus_ext(name)
            if key is None or split_meta(name):
                out.write("-\n")
            else:
                out.write(key.encode("utf-8", "surrogateescape").hex() + " " +
                          ext.lower().encode("utf-8", "surrogateescape").hex() + "\n")
    elif mode == "group":
        for sample in group_by_keys(tar_file_iterator(path)):
            parts = [sample["__key__"].encode("utf-8", "surrogateescape").hex()]
            if sample["duplicate"]:
                # webdataset raises; Sluice reports the sample as skipped.
                out.write(parts[0] + " !duplicate\n")
                continue
            for name, value in sample["fields"]:
                parts.append(name.encode("utf-8", "surrogateescape").hex() + "=" + value.hex())
            out.write(" ".join(parts) + "\n")


if __name__ == "__main__":
    main()
