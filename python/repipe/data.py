"""Data: Fashion-MNIST as arrays, and repipe.Stream, the engine's sample order."""
import ctypes
import os
import threading

import numpy as np

from ._lib import (
    _Dataset, _Err, _Stream, _check, _dataset_free, _dataset_load_idx, _ptr, _stream_free,
    _stream_init, _stream_update)


# ---- data -----------------------------------------------------------------------------------

def fashion_mnist(directory="/usr/share/datasets/fashion-mnist", train=True):
    """IDX images and labels (Debian's dataset-fashion-mnist by default) as (x, y) arrays:
    x float32 (n, 1, 28, 28) scaled to [0, 1], y int32, as `repipe train` reads them."""
    d, err = ctypes.POINTER(_Dataset)(), _Err()
    _check(_dataset_load_idx(ctypes.byref(d), os.fsencode(directory), train, ctypes.byref(err)),
           err)
    try:
        s = d.contents.sample
        shape = tuple(s.dim[i] for i in range(s.ndim))
        n = d.contents.n
        x = np.ctypeslib.as_array(d.contents.x, shape=(n * int(np.prod(shape)),)).copy()
        y = np.ctypeslib.as_array(d.contents.labels, shape=(n,)).copy()
        return x.reshape((n,) + shape), y
    finally:
        _dataset_free(d)


class Stream:
    """`repipe train`'s sample order: epoch e is a permutation fixed by (seed, e); update u
    takes the next per_update samples of its epoch (indices into the dataset)."""

    def __init__(self, seed, n, per_update, sequential=False):
        self._s, err = _Stream(), _Err()
        _check(_stream_init(ctypes.byref(self._s), seed, n, per_update, ctypes.byref(err)), err)
        self._s.sequential = sequential
        self.per_update = per_update
        # the C stream reshuffles its permutation in place when the epoch changes: calls
        # from several threads take turns, or one would read another's half-made epoch
        self._lock = threading.Lock()

    def update(self, u):
        idx, err = np.empty(self.per_update, dtype=np.int64), _Err()
        with self._lock:
            _check(_stream_update(ctypes.byref(self._s), u, _ptr(idx, ctypes.c_int64),
                                  ctypes.byref(err)), err)
        return idx

    def __del__(self):
        if getattr(self, "_s", None) is not None:
            _stream_free(ctypes.byref(self._s))
            self._s = None
