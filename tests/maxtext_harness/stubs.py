"""Stubs for optional packages MaxText 0.2.5 imports at module level but whose code the config loader, the
mesh builder and the abstract model never call (the test harness only; layoutsearch never stubs anything).

Stubbed, and why each is not installed instead:

* ``grain`` (input pipelines), ``tiktoken`` and ``sentencepiece`` (tokenizers), ``PIL`` (images): data
  loading, which the harness does not do;
* ``tokamax`` (fused kernels; pulls a profiler of ~100 MB), ``qwix`` (quantization), ``drjax`` (DiLoCo),
  ``sympy`` (imported by a kernel helper): code paths off by default in base.yml.

Every attribute of a stubbed module is a permissive placeholder class: usable as a base class, a
decorator, a type annotation or a call, returning another placeholder.
"""

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ("grain", "tiktoken", "sentencepiece", "tokamax", "PIL", "sympy", "drjax", "qwix")


class _Any(type):
    def __getattr__(cls, name):
        return _Any(name, (), {})

    def __call__(cls, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return _Any("result", (), {})

    def __getitem__(cls, k):
        return cls

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __iter__(cls):
        return iter(())

    def __mro_entries__(cls, bases):
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Any(name, (), {})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install():
    sys.meta_path.insert(0, _Finder())
