"""repipe from Python: plan, configure and train through the C library.

A thin layer over librepipe (ctypes, numpy), in the C API's shapes:

    import repipe
    plan = repipe.plan("graph.txt", machines=[8, 2], bandwidth=[4e9, 2e9])
    cfg = repipe.Config.load("examples/fmnist.json")     # or repipe.Config(micro_batch_size=64)
    with repipe.Session(repipe.Model.load("examples/fmnist-mlp.model"), cfg) as s:
        losses = s.run(x, y)                               # numpy arrays, as the C side reads them
        w = s.weights()                                    # {"1.weight": array, ...}

Errors raise repipe.Error with the C side's message. Arrays cross the boundary
without a copy: they must already be C-contiguous float32 (inputs), int32
(labels) and int64 (sample ids); anything else is refused, not converted.

The library is found at $REPIPE_LIBRARY, beside an installed package
(PREFIX/lib), in the build tree (build/), or on the loader's path.
"""
from ._lib import Error, __version__, _Err, _check, _lib, _sig  # noqa: F401 (the torch modules')
from .config import Config, groups  # noqa: F401
from .plan import Plan, plan  # noqa: F401
from .session import (Model, Session, from_llama, load_weights, save_weights,  # noqa: F401
                      to_llama)
from .data import Stream, fashion_mnist  # noqa: F401

for _c in (Error, Config, Model, Session, Plan, Stream):
    _c.__module__ = "repipe"  # their public home

__all__ = ["Error", "Config", "Model", "Session", "Plan", "plan", "groups", "load_weights",
           "save_weights", "fashion_mnist", "Stream"]
