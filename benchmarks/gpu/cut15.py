"""Cuts files into pieces that fill carried folders of at most CAP bytes each, for run_15b.sh stage.

    python cut15.py FIRST PREFIX CAP NAME=FILE...

The files are laid end to end (in the order given); FIRST (the folder already holding the code) is filled up to CAP
with the first pieces, in FIRST/parts, then PREFIX01, PREFIX02... Each piece is named NAME.NNN (NNN counting per
file); FIRST/MANIFEST lists every piece with its size, in order, which is how the pipeline knows it has them all.
"""

from __future__ import annotations

import sys
from pathlib import Path

CHUNK = 8 << 20


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    first, prefix, cap = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    folder, number = first / "parts", 0
    room = cap - folder_bytes(first) - (64 << 10)  # the MANIFEST written last
    manifest = []
    for name, path in (arg.split("=", 1) for arg in sys.argv[4:]):
        left, count = Path(path).stat().st_size, 0
        with open(path, "rb") as src:
            while left > 0:
                if room <= 0:
                    number += 1
                    folder, room = Path(f"{prefix}{number:02d}"), cap
                    folder.mkdir(parents=True)
                size = min(room, left)
                piece = folder / f"{name}.{count:03d}"
                with open(piece, "wb") as out:
                    todo = size
                    while todo:
                        data = src.read(min(CHUNK, todo))
                        out.write(data)
                        todo -= len(data)
                manifest.append(f"{piece.name} {size}")
                room, left, count = room - size, left - size, count + 1
    (first / "MANIFEST").write_text("\n".join(manifest) + "\n")
    print(f"{len(manifest)} pieces: {first}/parts, then {number} folders {prefix}01..{number:02d}")


if __name__ == "__main__":
    main()
