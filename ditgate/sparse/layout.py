"""Token layout: what each stretch of a packed attention sequence holds.

Only video/image tokens are sparsifiable. Text, conditioning, audio and unknown tokens stay dense (their
rows attend everything, their columns are visited by every query), padding is dropped, and a tile that
straddles a boundary is dense. A layout is a description of where the segments are; it says nothing about
any tensor's values, so the tile geometry derived from it is cached per layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SPARSIFIABLE = frozenset({"video", "image"})
KINDS = frozenset({"video", "image", "text", "conditioning", "audio", "unknown", "padding"})


@dataclass(frozen=True)
class Segment:
    start: int
    end: int  # exclusive
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown segment kind {self.kind!r}; known: {sorted(KINDS)}")
        if not 0 <= self.start < self.end:
            raise ValueError(f"empty or negative segment [{self.start}, {self.end})")


@dataclass(frozen=True)
class TokenLayout:
    """Segments covering [0, length) in order, without gaps or overlaps."""

    length: int
    segments: tuple[Segment, ...]
    grid: tuple[int, int, int] | None = None  # frames, height, width of the video segment, if known
    source: str = ""  # how the layout was found, for explain()

    def __post_init__(self) -> None:
        pos = 0
        for seg in self.segments:
            if seg.start != pos:
                raise ValueError(f"segments must tile [0, {self.length}) in order; gap or overlap at {pos}")
            pos = seg.end
        if pos != self.length:
            raise ValueError(f"segments end at {pos}, the sequence has {self.length} tokens")

    @classmethod
    def of(cls, *stretches: tuple[str, int], grid=None, source="") -> TokenLayout:
        """(kind, count) stretches in sequence order, e.g. ``of(("text", 512), ("image", 4096))``; empty stretches
        are left out, and neighbours of one kind make one segment."""
        segs, pos = [], 0
        for kind, n in stretches:
            if n <= 0:
                continue
            if segs and segs[-1].kind == kind:
                segs[-1] = Segment(segs[-1].start, pos + n, kind)
            else:
                segs.append(Segment(pos, pos + n, kind))
            pos += n
        return cls(pos, tuple(segs), grid, source)

    @classmethod
    def video_then(cls, video: int, rest: tuple[tuple[str, int], ...] = (), grid=None, source="") -> TokenLayout:
        """Video tokens first, then (kind, count) stretches."""
        return cls.of(("video", video), *rest, grid=grid, source=source)

    @property
    def keys_end(self) -> int:
        """Where the keys a query may see end: before a trailing padding segment, if there is one."""
        last = self.segments[-1] if self.segments else None
        return last.start if last is not None and last.kind == "padding" else self.length

    def summary(self) -> str:
        """"video 32 | text 6 | padding 2, grid 2x4x4": the segments in order, for explain()."""
        text = " | ".join(f"{seg.kind} {seg.end - seg.start}" for seg in self.segments)
        return text + (f", grid {'x'.join(map(str, self.grid))}" if self.grid else "")

    def visual(self) -> Segment | None:
        """The one video/image segment (None when there is none or more than one)."""
        found = [s for s in self.segments if s.kind in SPARSIFIABLE]
        return found[0] if len(found) == 1 else None

    def token_kinds(self) -> list[str]:
        out = []
        for seg in self.segments:
            out += [seg.kind] * (seg.end - seg.start)
        return out

    def tile_sparsifiable(self, block: int) -> torch.Tensor:
        """Bool [n_tiles]: True where every token of the tile is video/image (straddling tiles are dense)."""
        n = -(-self.length // block)
        flags = torch.ones(n, dtype=torch.bool)
        for seg in self.segments:
            if seg.kind in SPARSIFIABLE:
                continue
            flags[seg.start // block: (seg.end - 1) // block + 1] = False
        if self.length % block:  # a partial last tile is not a whole video tile
            flags[-1] = flags[-1] and self.segments[-1].kind in SPARSIFIABLE
        return flags

    def tile_padding(self, block: int) -> torch.Tensor:
        """Bool [n_tiles]: True where every token of the tile is padding (dropped as keys)."""
        n = -(-self.length // block)
        pad = torch.zeros(n, dtype=torch.bool)
        for seg in self.segments:
            if seg.kind == "padding":
                first = -(-seg.start // block)
                last = seg.end // block if seg.end < self.length else n
                pad[first:last] = True
        return pad

    def video_diagonal(self, rows: int, block: int) -> torch.Tensor:
        """Bool [query tiles of ``rows`` tokens, key tiles of ``block``]: the video key tiles each video
        query tile shares a token with (its own tile for square tiles, two for 192 over 128). Every
        consumer keeps these, so a video token always sees its neighbours."""
        q = torch.arange(-(-self.length // rows))
        k = torch.arange(-(-self.length // block))
        overlap = (q[:, None] * rows < (k[None, :] + 1) * block) & (k[None, :] * block < (q[:, None] + 1) * rows)
        return overlap & self.tile_sparsifiable(rows)[:, None] & self.tile_sparsifiable(block)[None, :]
