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

    kv_index: torch.Tensor  # int32 [B, H, n_query_blocks, L]
    kv_count: torch.Tensor  # int32 [B, H, n_query_blocks]
    block_m: int
    block_n: int

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
        zeros = torch.zeros_like(self.kv_count)
        return BlockMask.from_kv_blocks(zeros, torch.zeros_like(self.kv_index), self.kv_count, self.kv_index,
                                        BLOCK_SIZE=self.block_m, seq_lengths=(seq_q, seq_k))
