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
    def from_tile_mask(cls, tiles: torch.Tensor, batch: int, heads: int, block: int) -> KeyBlockLists:
        """Lists from a bool [n, n] tile mask shared by every batch and head (a static pattern)."""
        n = tiles.shape[0]
        count = tiles.sum(1).to(torch.int32)
        width = max(1, int(count.max()))
        order = torch.argsort((~tiles).to(torch.int8), dim=1, stable=True)[:, :width]  # kept ids first, ascending
        index = torch.where(torch.arange(width, device=tiles.device) < count[:, None], order, 0).to(torch.int32)
        return cls(index.expand(batch, heads, n, width).contiguous(), count.expand(batch, heads, n).contiguous(),
                   block, block)

    def density(self, seq_k: int) -> float:
        """Fraction of (query block, key block) pairs visited, over every batch and head."""
        return float(self.kv_count.float().mean()) / _cdiv(seq_k, self.block_n)

    def token_mask(self, seq_q: int, seq_k: int) -> torch.Tensor:
        """The boolean [B, H, Sq, Sk] mask these lists mean, token by token (for references and tests)."""
        B, H, n_m, L = self.kv_index.shape
        n_n = _cdiv(seq_k, self.block_n)
        blocks = torch.zeros(B, H, n_m, n_n + 1, dtype=torch.bool, device=self.kv_index.device)
        take = torch.arange(L, device=self.kv_index.device) < self.kv_count[..., None]
        idx = torch.where(take, self.kv_index.long(), n_n)  # unused slots go to a spill column
        blocks.scatter_(3, idx, True)
        blocks = blocks[..., :n_n]
        mask = blocks.repeat_interleave(self.block_m, 2).repeat_interleave(self.block_n, 3)
        return mask[:, :, :seq_q, :seq_k]

    def to_flex_block_mask(self, seq_q: int, seq_k: int):
        """The same selection as a flex_attention ``BlockMask`` made of full blocks only (no mask_mod,
        so the compiled kernel never evaluates a per-token mask)."""
        from torch.nn.attention.flex_attention import BlockMask

        if self.block_m != self.block_n:
            raise ValueError("flex block masks here use square blocks")
        n_n = _cdiv(seq_k, self.block_n)
        index = self.kv_index[..., :n_n]
        index = torch.nn.functional.pad(index, (0, n_n - index.shape[-1]))  # flex wants one slot per key block
        zeros = torch.zeros_like(self.kv_count)
        return BlockMask.from_kv_blocks(zeros, torch.zeros_like(index), self.kv_count, index,
                                        BLOCK_SIZE=self.block_m, seq_lengths=(seq_q, seq_k))
