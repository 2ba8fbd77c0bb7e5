"""Models, weights and training sessions: repipe.Model, repipe.Session, the weight
files and the LLaMA-family names."""
import ctypes
import os
import threading

import numpy as np

from ._lib import (
    Error, _Err, _MAX_DIMS, _Model, _Result, _Tensor, _Weights, _array, _check,
    _llama_export, _llama_import, _llama_names_of, _model_check_tokens, _model_free,
    _model_generate, _model_load, _model_parse, _profile_free, _profile_measure,
    _profile_measure_alone, _profile_write, _ptr, _safetensors_load, _safetensors_save,
    _session_create, _session_free, _session_get_weights, _session_loss,
    _session_per_call, _session_predict, _session_run, _session_set_weights,
    _weights_free, _weights_from_params, _weights_load, _weights_save, _weights_to_params)


# ---- models, sessions, weights --------------------------------------------------------------

class Model:
    """A model spec: Model.load(path) or Model.parse(text)."""

    def __init__(self, handle):
        self._h = handle

    @classmethod
    def load(cls, path):
        h, err = ctypes.c_void_p(), _Err()
        _check(_model_load(ctypes.byref(h), os.fsencode(path), ctypes.byref(err)), err)
        return cls(h)

    @classmethod
    def parse(cls, text, name="model"):
        h, err, b = ctypes.c_void_p(), _Err(), text.encode()
        _check(_model_parse(ctypes.byref(h), b, len(b), name.encode(), ctypes.byref(err)), err)
        return cls(h)

    @property
    def _m(self):
        return ctypes.cast(self._h, ctypes.POINTER(_Model)).contents

    @property
    def input_shape(self):
        s = self._m.input
        return tuple(s.dim[i] for i in range(s.ndim))

    @property
    def num_params(self):
        return self._m.num_params

    @property
    def targets(self):
        """Labels per sample: 1, or T for a token model."""
        return self._m.num_targets

    def generate(self, weights, prompt, n=256, temperature=1.0, top_k=40, seed=1):
        """Continues prompt by n tokens drawn from a token model with these weights
        ({name: float32 array}, as Session.weights() or load_weights() give them), as
        `repipe generate` does: scores divided by temperature (0: the most likely token), the
        top_k most likely (0: all), draws from seed's stream. prompt: bytes or str (UTF-8;
        returns bytes) or token ids (returns an int32 array of prompt and continuation)."""
        err = _Err()
        _check(_model_check_tokens(self._h, b"generate", ctypes.byref(err)), err)
        text = isinstance(prompt, (str, bytes))
        ids = np.frombuffer(prompt.encode() if isinstance(prompt, str) else prompt,
                            dtype=np.uint8) if text else _array(prompt, np.int32, "prompt")
        if ids.ndim != 1 or ids.size == 0:
            raise Error("prompt: give at least one token")
        tokens = np.empty(ids.size + n, dtype=np.int32)
        tokens[:ids.size] = ids
        params = self._params(weights)
        _check(_model_generate(self._h, _ptr(params, ctypes.c_float),
                               _ptr(tokens, ctypes.c_int32), ids.size, n, temperature, top_k,
                               seed, ctypes.byref(err)), err)
        if text:
            if tokens.max(initial=0) > 255:
                raise Error("generate: a vocabulary of more than 256 tokens does not give bytes;"
                            " pass the prompt as token ids")
            return tokens.astype(np.uint8).tobytes()
        return tokens

    def _params(self, weights):
        """The flat parameters of {name: array} (each variable present with its shape)."""
        tensors, err = _tensors(weights), _Err()
        w = _Weights(len(tensors), tensors)
        params = np.empty(max(self.num_params, 1), dtype=np.float32)
        _check(_weights_to_params(self._h, ctypes.byref(w), 0, _ptr(params, ctypes.c_float),
                                  ctypes.byref(err)), err)
        return params

    def profile(self, out="graph.txt", micro_batch=64, repeats=20, alone=False):
        """Measures each layer on micro_batch rows (the median of `repeats` runs; inside whole
        passes of the model, or each alone with alone=True) and writes the planner's graph.txt
        to `out`, as `repipe profile` does. Returns the path."""
        p, err = ctypes.c_void_p(), _Err()
        measure = _profile_measure_alone if alone else _profile_measure
        _check(measure(self._h, micro_batch, repeats, ctypes.byref(p), ctypes.byref(err)), err)
        try:
            _check(_profile_write(p, None, os.fsencode(out), ctypes.byref(err)), err)
        finally:
            _profile_free(p)
        return out

    def __del__(self):
        if getattr(self, "_h", None):
            _model_free(self._h)
            self._h = None


def _model_weights(model, params):
    """{name: array} of a model's flat parameters."""
    w, err = ctypes.POINTER(_Weights)(), _Err()
    _check(_weights_from_params(model._h, _ptr(params, ctypes.c_float), ctypes.byref(w),
                                ctypes.byref(err)), err)
    try:
        return _weights_dict(w)
    finally:
        _weights_free(w)


def _weights_dict(w, all_replicas=False):
    """{name: array}: a tensor with several copies (groups, or replicas) gets a leading axis."""
    out = {}
    for i in range(w.contents.num_tensors):
        t = w.contents.tensors[i]
        shape = tuple(t.shape.dim[k] for k in range(t.shape.ndim))
        n = t.groups * int(np.prod(shape))
        a = np.ctypeslib.as_array(t.data, shape=(n,)).copy()
        out[t.name.decode()] = a.reshape(((t.groups,) if t.groups > 1 or all_replicas else ())
                                         + shape)
    return out


def _tensors(weights, shapes=None):
    """{name: float32 array} as rp_tensors that point into the arrays (kept alive by the
    caller's dict). An array with one axis more than its tensor's shape in `shapes` holds a
    copy per group (or replica) along its first axis."""
    arrays = {k: _array(v, np.float32, "weights[%r]" % k) for k, v in weights.items()}
    tensors = (_Tensor * len(arrays))()
    for t, (name, a) in zip(tensors, arrays.items()):
        lead = shapes is not None and name in shapes and a.ndim == len(shapes[name]) + 1
        shape = a.shape[1:] if lead else a.shape
        if len(shape) > _MAX_DIMS:
            raise Error("weights[%r]: %d dimensions, at most %d" % (name, len(shape), _MAX_DIMS))
        t.name = name.encode()
        t.shape.ndim = len(shape)
        for i, d in enumerate(shape):
            t.shape.dim[i] = d
        t.groups = a.shape[0] if lead else 1
        t.data = _ptr(a, ctypes.c_float)
    return tensors


def _tensor_shapes(h):
    """{name: shape} of a session's tensors, without their group axis."""
    w, err = ctypes.POINTER(_Weights)(), _Err()
    _check(_session_get_weights(h, 0, ctypes.byref(w), ctypes.byref(err)), err)
    try:
        return {t.name.decode(): tuple(t.shape.dim[k] for k in range(t.shape.ndim))
                for t in (w.contents.tensors[i] for i in range(w.contents.num_tensors))}
    finally:
        _weights_free(w)


def _mode(mode):
    modes = {"one_per_group": 0, "all_replicas": 1}
    if mode not in modes:
        raise Error("mode %r: expected 'one_per_group' or 'all_replicas'" % (mode,))
    return modes[mode]


def _is_safetensors(path):
    return os.fspath(path).endswith(".safetensors")


def load_weights(path):
    """A weight file (or a checkpoint's weights) as {name: array}; a file whose name ends in
    .safetensors is read as one (F32, F16, BF16 or F64 tensors, as float32, under its own
    names)."""
    w, err = ctypes.POINTER(_Weights)(), _Err()
    load = _safetensors_load if _is_safetensors(path) else _weights_load
    _check(load(ctypes.byref(w), os.fsencode(path), ctypes.byref(err)), err)
    try:
        return _weights_dict(w)
    finally:
        _weights_free(w)


def save_weights(path, weights):
    """Writes {name: float32 array} as a weight file, each array one tensor of its shape
    (written to a temporary file, synced and renamed, as the C side writes them); a name
    ending in .safetensors writes that format (float32, in the dict's order)."""
    tensors = _tensors(weights)
    w, err = _Weights(len(tensors), tensors), _Err()
    save = _safetensors_save if _is_safetensors(path) else _weights_save
    _check(save(ctypes.byref(w), os.fsencode(path), ctypes.byref(err)), err)


_LLAMA_NAMES = {"meta": 0, "hf": 1}


def _llama_names(names):
    if names not in _LLAMA_NAMES:
        raise Error("names %r: expected 'meta' or 'hf'" % (names,))
    return _LLAMA_NAMES[names]


def from_llama(model, state, names=None):
    """repipe's weights ({"0.weight": array, ...}) of a LLaMA-family model from a state_dict
    under Meta's names (names="meta": {"tok_embeddings.weight": array, ...}) or Hugging
    Face's ("hf": {"model.embed_tokens.weight": ...}, each head's Q and K rows in its rotary
    order); None: by the state's embedding. state: as load_weights gives a .safetensors file,
    or numpy arrays of a torch state_dict. Q, K and V are joined into the model's fused rows;
    every tensor must fit, and none may be left over."""
    tensors = _tensors(state)
    w, err = _Weights(len(tensors), tensors), _Err()
    found = ctypes.c_int(0)  # by the embedding the state holds, as the C side tells it
    scheme = (found.value if _llama_names_of(ctypes.byref(w), ctypes.byref(found)) else 0) \
        if names is None else _llama_names(names)
    params = np.zeros(max(model.num_params, 1), np.float32)
    _check(_llama_import(model._h, ctypes.byref(w), scheme, b"state_dict",
                         _ptr(params, ctypes.c_float), ctypes.byref(err)), err)
    return _model_weights(model, params)


def to_llama(model, weights, names="meta"):
    """A LLaMA-family model's weights (repipe's names) under Meta's names ("meta") or Hugging
    Face's ("hf"), in the order of that scheme's state_dict: what from_llama reads."""
    scheme = _llama_names(names)
    params = model._params(weights)
    out, err = ctypes.POINTER(_Weights)(), _Err()
    _check(_llama_export(model._h, _ptr(params, ctypes.c_float), scheme, ctypes.byref(out),
                         ctypes.byref(err)), err)
    try:
        return _weights_dict(out)
    finally:
        _weights_free(out)


class Session:
    """Workers running a model under a configuration, on threads (the local backend).

    A session serves one call at a time: calls from several threads wait their turn (the
    workers are one set), and close() waits for the call under way. After close() every
    call raises Error."""

    def __init__(self, model, config):
        self.model, self.config = model, config  # the C side reads both while it lives
        self._lock = threading.Lock()
        self._h, err = ctypes.c_void_p(), _Err()
        _check(_session_create(model._h, config._buf, ctypes.byref(self._h), ctypes.byref(err)),
               err)
        self.samples_per_call = _session_per_call(self._h)
        self._next_id = 0
        self._shapes = _tensor_shapes(self._h)

    def _rows(self, x, n=None):
        """x as n rows (any number when n is None) of the model's input, float32."""
        x = _array(x, np.float32, "x", None if n is None else (n,) + self.model.input_shape)
        if tuple(x.shape[1:]) != self.model.input_shape:
            raise Error("x: shape %s, expected (n,) + %s" % (tuple(x.shape),
                                                             self.model.input_shape))
        return x

    def _labels(self, y, n):
        """y as the labels of n rows, int32: one each, or T for a token model."""
        T = self.model.targets
        return _array(y, np.int32, "y", (n,) if T == 1 else (n, T))

    def run(self, x, y, ids=None):
        """One host call: x (samples_per_call, *input) float32, y (samples_per_call[, T])
        int32, ids int64 (default: consecutive numbers). Returns the losses."""
        with self._lock:
            self._open()
            n = self.samples_per_call
            x, y = self._rows(x, n), self._labels(y, n)
            if ids is None:
                ids = np.arange(self._next_id, self._next_id + n, dtype=np.int64)
                self._next_id += n
            ids = _array(ids, np.int64, "ids", (n,))
            res, err = _Result(), _Err()
            _check(_session_run(self._h, _ptr(x, ctypes.c_float), _ptr(y, ctypes.c_int32),
                                _ptr(ids, ctypes.c_int64), ctypes.byref(res),
                                ctypes.byref(err)), err)
            dims = tuple(res.dims[i] for i in range(res.ndim))
            return np.ctypeslib.as_array(res.losses, shape=(res.count,)).copy().reshape(dims)

    def predict(self, x):
        """The predicted class of each row of x (n, *input) float32."""
        with self._lock:
            self._open()
            x = self._rows(x)
            pred, err = np.empty(x.shape[0], dtype=np.int32), _Err()
            _check(_session_predict(self._h, _ptr(x, ctypes.c_float), x.shape[0],
                                    _ptr(pred, ctypes.c_int32), ctypes.byref(err)), err)
            return pred

    def loss(self, x, y):
        """The mean loss of rows x with labels y, on replica 0's weights (a validation loss;
        per token for a token model)."""
        with self._lock:
            self._open()
            x = self._rows(x)
            n = x.shape[0]
            y = self._labels(y, n)
            mean, err = ctypes.c_double(), _Err()
            _check(_session_loss(self._h, _ptr(x, ctypes.c_float), _ptr(y, ctypes.c_int32), n,
                                 ctypes.byref(mean), ctypes.byref(err)), err)
            return mean.value

    def weights(self, mode="one_per_group"):
        """{name: array}: in "one_per_group" mode a tensor of a grouping with G > 1 groups has a
        leading dimension G (each group's value); in "all_replicas" mode every tensor has a
        leading dimension R, the replicas in order (PopXL's retrieval modes)."""
        with self._lock:
            self._open()
            m, w, err = _mode(mode), ctypes.POINTER(_Weights)(), _Err()
            _check(_session_get_weights(self._h, m, ctypes.byref(w), ctypes.byref(err)), err)
            try:
                return _weights_dict(w, all_replicas=m == 1)
            finally:
                _weights_free(w)

    def set_weights(self, weights, mode="one_per_group"):
        """Replaces weights from {name: float32 array}: an array of the tensor's own shape sets
        every group (every replica); one with a leading dimension sets each group, or in
        "all_replicas" mode each replica (refused where a group's replicas would differ)."""
        with self._lock:
            self._open()
            m, tensors = _mode(mode), _tensors(weights, self._shapes)
            w, err = _Weights(len(tensors), tensors), _Err()
            _check(_session_set_weights(self._h, ctypes.byref(w), m, ctypes.byref(err)), err)

    def _open(self):
        if not self._h:
            raise Error("the session is closed")

    def close(self):
        """Stops the workers and frees the session, after the call under way if any."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before it
            return
        with lock:
            if self._h:
                _session_free(self._h)
                self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()
