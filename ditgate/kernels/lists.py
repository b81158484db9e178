"""Block-sparse selections as the kernels and the sparse stage exchange them (no Triton needed here)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@dataclass(frozen=True)
class KeyBlockLists:
    """A block-sparse selection: per (batch, head, query block) the key blocks to visit.

    This is what an attention call's ``attn_mask`` carries when the sparse stage selected tiles; the
    block sizes are the kernel's (``block_m`` query rows, ``block_n`` key rows per block).
    """

    kv_index: torch.Tensor  # int32 [B, H, n_query_blocks, L], each row's first kv_count entries ascending
    kv_count: torch.Tensor  # int32 [B, H, n_query_blocks]
    block_m: int
    block_n: int

    @classmethod
    def from_tile_mask(cls, tiles: torch.Tensor, batch: int, heads: int, block: int,
                       block_n: int | None = None) -> KeyBlockLists:
        """Lists from a bool [n_m, n_n] tile mask shared by every batch and head (a static pattern);
        ``block`` query rows per tile, ``block_n`` key rows (by default ``block``)."""
        return cls.from_block_mask(tiles.expand(batch, heads, *tiles.shape), block, block_n or block)

    def tile_mask(self, seq_k: int) -> torch.Tensor:
        """Bool [B, H, n_query_blocks, n_key_blocks]: which tiles these lists visit."""
        B, H, n_m, L = self.kv_index.shape
        n_n = _cdiv(seq_k, self.block_n)
        blocks = torch.zeros(B, H, n_m, n_n + 1, dtype=torch.bool, device=self.kv_index.device)
        take = torch.arange(L, device=self.kv_index.device) < self.kv_count[..., None]
        blocks.scatter_(3, torch.where(take, self.kv_index.long(), n_n), True)  # unused slots: a spill column
        return blocks[..., :n_n]

    @classmethod
    def from_block_mask(cls, blocks: torch.Tensor, block_m: int, block_n: int) -> KeyBlockLists:
        """Lists from a bool [B, H, n_m, n_n] tile mask (each row ascending, padded to n_n slots)."""
        count = blocks.sum(-1).to(torch.int32)
        order = torch.argsort((~blocks).to(torch.int8), dim=-1, stable=True)  # kept ids first, ascending
        index = torch.where(torch.arange(blocks.shape[-1], device=blocks.device) < count[..., None], order, 0)
        return cls(index.to(torch.int32).contiguous(), count.contiguous(), block_m, block_n)

    def coarsen_queries(self, factor: int, seq_q: int, seq_k: int) -> KeyBlockLists:
        """The same selection for query blocks ``factor`` times taller: each visits the union of the key
        blocks of the query blocks it covers (a consumer whose query tile is larger sees a superset)."""
        if factor == 1:
            return self
        blocks = self.tile_mask(seq_k)
        B, H, n_m, n_n = blocks.shape
        rows = _cdiv(seq_q, self.block_m * factor)
        blocks = torch.nn.functional.pad(blocks, (0, 0, 0, rows * factor - n_m))
        return KeyBlockLists.from_block_mask(blocks.view(B, H, rows, factor, n_n).any(3), self.block_m * factor,
                                             self.block_n)

    def refine_queries(self, factor: int, seq_q: int) -> KeyBlockLists:
        """The same selection for query blocks ``factor`` times shorter: each inherits the list of the
        block it lies in, so the token mask is unchanged (a 192-row selection for a consumer whose
        query tiles are 64 rows)."""
        if factor == 1:
            return self
        if self.block_m % factor:
            raise ValueError(f"{self.block_m}-row query blocks do not split into {factor}")
        n_m = _cdiv(seq_q, self.block_m // factor)
        return KeyBlockLists(self.kv_index.repeat_interleave(factor, 2)[:, :, :n_m].contiguous(),
                             self.kv_count.repeat_interleave(factor, 2)[:, :, :n_m].contiguous(),
                             self.block_m // factor, self.block_n)

    def index_per_key_block(self, seq_k: int) -> torch.Tensor:
        """``kv_index`` with exactly one slot per key block (flex's BlockMask and fa4 want that width)."""
        n_n = _cdiv(seq_k, self.block_n)
        index = self.kv_index[..., :n_n]
        return torch.nn.functional.pad(index, (0, n_n - index.shape[-1]))

    def density(self, seq_k: int) -> float:
        """Fraction of (query block, key block) pairs visited, over every batch and head."""
        return float(self.kv_count.float().mean()) / _cdiv(seq_k, self.block_n)

    def token_mask(self, seq_q: int, seq_k: int) -> torch.Tensor:
        """The boolean [B, H, Sq, Sk] mask these lists mean, token by token (for references and tests)."""
        mask = self.tile_mask(seq_k).repeat_interleave(self.block_m, 2).repeat_interleave(self.block_n, 3)
        return mask[:, :, :seq_q, :seq_k]

    def to_flex_block_mask(self, seq_q: int, seq_k: int):
        """The same selection as a flex_attention ``BlockMask`` made of full blocks only (no mask_mod,
        so the compiled kernel never evaluates a per-token mask)."""
        from torch.nn.attention.flex_attention import BlockMask

        if self.block_m != self.block_n:
            raise ValueError("flex block masks here use square blocks")
        index = self.index_per_key_block(seq_k)
        zeros = torch.zeros_like(self.kv_count)
        return BlockMask.from_kv_blocks(zeros, torch.zeros_like(index), self.kv_count, index,
                                        BLOCK_SIZE=self.block_m, seq_lengths=(seq_q, seq_k))
