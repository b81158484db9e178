"""What a compiled graph runs for a linear site whose weights are settled: each form's ``graph_serve``, a plain function
of tensors, by form name.

Every call of a compiled model checks all of the graph's guards. A site that ran its form's methods inside the trace
reached the form, its attributes and its weights' holder along a path of its own (the module, its forward, the
router, the plan's forms), and dynamo guarded each attribute it read along each such path: some 40 guards per site,
thousands in a model. The mapping below is one module-level constant, so every site reaches the same functions along
one path, and the graph guards on them once. It is read-only (a ``MappingProxyType``) and made at import: no state.
"""

from __future__ import annotations

from types import MappingProxyType

from .linear import linear_classes

GRAPH_SERVES = MappingProxyType({name: cls.graph_serve for name, cls in linear_classes().items()})
