"""Layout-aware block sparsity: token layout, tile selection, block lists for the sparse forms."""
