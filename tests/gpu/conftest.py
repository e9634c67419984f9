"""With SPARKS_RECORD_TRITON=FILE, every engine Triton kernel these GPU tests compile is recorded — its signature,
constexprs, specialisation attributes and launch options — and written to FILE as JSON when the session ends.
tests/fixtures/triton_launches.json is such a record (bench/record_triton_launches.sh makes it on the lent GPU);
tests/engine/test_gb10_compile.py compiles every entry for the GB10 (sm_121) without a GPU."""

from __future__ import annotations

import json
import os

RECORD = os.environ.get("SPARKS_RECORD_TRITON")
_launches: dict[str, dict] = {}


def _plain(value):
    """A constexpr or attribute value as JSON (Triton's own constexpr objects unwrapped)."""
    value = getattr(value, "value", value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


if RECORD:
    from triton.runtime.jit import JITFunction

    _compile = JITFunction._do_compile

    def _recording(self, key, signature, device, constexprs, options, attrs, warmup):
        # Gluon kernels (engine/ops/triton_dense.py) are compiled for sm_121 by tests/engine/test_dense_triton.py
        if self.fn.__module__.startswith("engine.") and not self.is_gluon():
            entry = {
                "module": self.fn.__module__,
                "kernel": self.fn.__name__,
                "signature": {name: str(kind) for name, kind in signature.items()},
                "constexprs": [[list(k), _plain(v)] for k, v in constexprs.items()],
                "attrs": [[list(k), _plain(v)] for k, v in attrs.items()],
                "num_warps": options.num_warps,
                "num_stages": options.num_stages,
                **({} if options.enable_fp_fusion else {"enable_fp_fusion": False}),
            }
            _launches.setdefault(json.dumps(entry, sort_keys=True), entry)
        return _compile(self, key, signature, device, constexprs, options, attrs, warmup)

    JITFunction._do_compile = _recording


def pytest_sessionfinish(session, exitstatus):
    if RECORD:
        entries = sorted(_launches.values(), key=lambda e: (e["module"], e["kernel"], json.dumps(e, sort_keys=True)))
        # under pytest-xdist each worker writes its own part (bench/record_triton_launches.sh merges them)
        worker = os.environ.get("PYTEST_XDIST_WORKER")
        with open(f"{RECORD}.{worker}" if worker else RECORD, "w") as out:
            json.dump(entries, out, indent=1)
