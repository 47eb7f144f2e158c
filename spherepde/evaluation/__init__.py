"""How the attention mean is evaluated: methods behind a registry and one evaluator (issue #18).

The physics (:class:`spherepde.Attention`: B, V, beta and the requested accuracy) and the numerics that
evaluate its mean field are separate:

- :mod:`.methods` holds the methods, one class each in :data:`REGISTRY` ("direct", "pruned", "series",
  "fast_spectral", "circle_fft", "usa_direct"); each writes the targets it can certify and returns those
  it refuses;
- :class:`AttentionEvaluator` (one per model and run) chooses the method ("auto": a cost model), owns the
  fallback chain (:meth:`AttentionEvaluator.next_method`), its caches and its memory, and returns each
  field with a :class:`FieldInfo`.

::

    ev = sp.Attention(B, V, beta).evaluator()
    m, info = ev.mean_field(targets, sources, weights)
    info.method, info.bound, info.chain     # e.g. "fast_spectral", 3e-13, [("fast_spectral", 49152, 812), ...]

``Attention.mean_field(targets, sources, weights)`` is the stateless shortcut (a fresh evaluator per
call); the solver keeps one evaluator per attention head and checkpoints its state.
"""
from .evaluator import METHODS, AttentionEvaluator, FieldInfo, kernel_centres, selectable_methods
from .methods import REGISTRY, Method, SourceBlocks, Targets, register

__all__ = ["AttentionEvaluator", "FieldInfo", "METHODS", "REGISTRY", "Method", "SourceBlocks", "Targets",
           "kernel_centres", "register", "selectable_methods"]
