"""Execution configurations (repipe.Config) and replica groupings (repipe.groups)."""
import ctypes
import json
import os

from ._lib import (
    _Derived, _Err, _Grouping, _check, _config_derive, _config_load_file,
    _config_load_string, _config_save_file, _config_size, _config_to_json,
    _grouping_group_of, _grouping_popxl, _take_string)


# ---- configurations -------------------------------------------------------------------------

class Config:
    """An execution configuration (IPUConfig's vocabulary): Config.load(path) or Config(**keys).
    Its keys read as attributes (cfg.micro_batch_size); cfg.replace(**keys) gives a changed
    copy, validated again; cfg.save(path) writes it for `repipe train --config`."""

    def __init__(self, **keys):
        self._buf = ctypes.create_string_buffer(_config_size())
        text = json.dumps(keys).encode()
        err = _Err()
        _check(_config_load_string(self._buf, text, len(text), b"Config(...)", ctypes.byref(err)),
               err)

    @classmethod
    def load(cls, path):
        c = cls.__new__(cls)
        c._buf = ctypes.create_string_buffer(_config_size())
        err = _Err()
        _check(_config_load_file(c._buf, os.fsencode(path), ctypes.byref(err)), err)
        return c

    @classmethod
    def _of(cls, base):
        """A new configuration from base: None (the defaults), a path, a dict or a Config."""
        if base is None:
            return cls()
        if isinstance(base, dict):
            return cls(**base)
        if isinstance(base, Config):
            c = cls.__new__(cls)
            c._buf = ctypes.create_string_buffer(base._buf.raw, len(base._buf))  # a flat struct
            return c
        return cls.load(base)

    @property
    def derived(self):
        """Workers, samples per micro-batch, update and host call, as `repipe config show`."""
        d = _Derived()
        _config_derive(self._buf, ctypes.byref(d))
        return {name: getattr(d, name) for name, _ in _Derived._fields_}

    def to_dict(self):
        out, err = ctypes.c_void_p(), _Err()
        _check(_config_to_json(self._buf, ctypes.byref(out), ctypes.byref(err)), err)
        return json.loads(_take_string(out))

    def __getattr__(self, key):
        if key.startswith("_"):
            raise AttributeError(key)
        d = self.to_dict()
        if key not in d:
            raise AttributeError("Config has no key %r (docs/configuration.md)" % key)
        return d[key]

    def replace(self, **keys):
        """A copy with these keys changed, through the C side's validation."""
        return Config(**dict(self.to_dict(), **keys))

    def save(self, path):
        err = _Err()
        _check(_config_save_file(self._buf, os.fsencode(path), ctypes.byref(err)), err)
        return path

    def __eq__(self, other):
        return isinstance(other, Config) and self.to_dict() == other.to_dict()

    def __repr__(self):
        return "repipe.Config(%s)" % ", ".join("%s=%r" % kv for kv in self.to_dict().items())


def groups(replicas, group_size=None, stride=None):
    """PopXL's ir.replica_grouping(stride, group_size) on `replicas` replicas: the
    group of each replica, as a list (PopXL's assignment). Not given, the
    stride is 1 and the group size replicas / stride."""
    g, err = _Grouping(), _Err()
    ref = lambda v: None if v is None else ctypes.byref(ctypes.c_int(v))
    _check(_grouping_popxl(ctypes.byref(g), replicas, ref(stride), ref(group_size),
                           ctypes.byref(err)), err)
    return [_grouping_group_of(ctypes.byref(g), r) for r in range(replicas)]
