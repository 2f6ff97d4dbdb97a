"""Write a byte-for-byte reproducible zip of the .pyc files under a directory.

Usage: python3.11 -I -S mkzip.py STAGE_DIR OUT_ZIP

Entries are sorted by name, stamped 1980-01-01 00:00:00 (the zip epoch), given
one fixed mode, and deflated at level 9, so the same inputs and the same zlib
give the same bytes. No directory entries are written: zipimport finds
packages by their __init__.pyc and does not need them.
"""

import os
import sys
import zipfile


def main(stage, out):
    names = []
    for root, dirs, files in os.walk(stage):
        dirs.sort()
        for f in files:
            if f.endswith(".pyc"):
                rel = os.path.relpath(os.path.join(root, f), stage)
                names.append(rel.replace(os.sep, "/"))
    names.sort()
    if not names:
        sys.exit(f"mkzip: no .pyc files under {stage}")
    with zipfile.ZipFile(out, "w") as z:
        for name in names:
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.create_system = 3  # unix, so external_attr carries the mode
            info.external_attr = 0o100444 << 16
            with open(os.path.join(stage, name), "rb") as f:
                z.writestr(info, f.read(), compresslevel=9)
    print(f"mkzip: {len(names)} files -> {out}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
