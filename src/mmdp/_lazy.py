"""A package face that imports nothing until a name is used (PEP 562's module __getattr__).

    __getattr__, __dir__, __all__ = lazy_face(__name__, {"mmdp.packing.packers": ["pack"]})

`import mmdp` then costs one small file; `mmdp.pack` (or `from mmdp import pack`) imports
mmdp.packing.packers the first time and keeps the name, so torch, transformers and datasets load
only with the first name that needs them.
"""

import importlib


def lazy_face(package: str, names_by_module: dict[str, list[str]]):
    """The module-level __getattr__ and __dir__ of a lazy `package`, and its __all__."""
    module_of = {name: module for module, names in names_by_module.items() for name in names}

    def __getattr__(name: str):
        if name not in module_of:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module_of[name]), name)
        setattr(importlib.import_module(package), name, value)  # the next use is a plain lookup
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *module_of})

    return __getattr__, __dir__, list(module_of)
