"""Loading an engine release's own Python modules straight from its wheel.

A wheel is a zip file; Python imports pure-Python modules from a zip through zipimport. What the
release's hashing and event modules import that cannot (or need not) run here — torch, the GPU
kernels, the configuration tree, the engine's package __init__ files — is replaced by an inert
stand-in, and every stand-in is recorded so the output file's header can name it. Nothing of the
engine is copied into the repository: the modules are read from the cached wheel at run time.
"""
import hashlib
import importlib.abc
import importlib.util
import os
import subprocess
import sys
import types
import zipimport

WHEELS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".cache", "wheels")


def fetch(name, version):
    """The wheel of name==version under .cache/wheels (pip download --no-deps when absent):
    (path, file name, sha256)."""
    os.makedirs(WHEELS, exist_ok=True)
    prefix = name.replace("-", "_") + "-" + version + "-"
    found = [f for f in os.listdir(WHEELS) if f.startswith(prefix) and f.endswith(".whl")]
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-input",
                        "--only-binary=:all:", "--python-version", "3.11", "-d", WHEELS,
                        f"{name}=={version}"], check=True)
        found = [f for f in os.listdir(WHEELS) if f.startswith(prefix) and f.endswith(".whl")]
    if len(found) != 1:
        raise SystemExit(f"vecgen: want one wheel {prefix}*.whl in {WHEELS}, found {found}")
    path = os.path.join(WHEELS, found[0])
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return path, found[0], h.hexdigest()


class _Inert(type):
    """The type of inert stand-ins: a class attribute is another inert class."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert(name, (cls,), {})

    def __or__(cls, other):
        return cls

    __ror__ = __or__

    def __getitem__(cls, k):
        return cls


class Anything(metaclass=_Inert):
    """An inert value: every attribute, call, item and operator gives another one."""

    def __init__(self, *a, **k):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Anything()

    def __call__(self, *a, **k):
        return Anything()

    def __getitem__(self, k):
        return Anything()

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class InertModule(types.ModuleType):
    """A module whose every attribute is a fresh inert class (usable as a base, decorator, type)."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        v = type(name, (Anything,), {"__module__": self.__name__})
        setattr(self, name, v)
        return v


class Loader:
    """Imports `real` modules of one package from a wheel; stands in for the rest.

    real: module names read from the wheel and run. Every other module of the package, and every
    third-party module under a name in heavy (torch, numpy, ...), becomes an InertModule; packages on the way to a real
    module are created empty (their __init__ is not run). `stubs` lists what was stood in for.
    """

    def __init__(self, wheel, package, real, overrides=None, heavy=()):
        self.wheel, self.package, self.real, self.heavy = wheel, package, set(real), set(heavy)
        self.overrides = overrides or {}
        self.stubs = []

    def __enter__(self):
        self.saved = dict(sys.modules)
        for name in [n for n in sys.modules if n == self.package or n.startswith(self.package + ".")]:
            del sys.modules[name]
        self.finder = _Finder(self)
        sys.meta_path.insert(0, self.finder)
        return self

    def __exit__(self, *exc):
        sys.meta_path.remove(self.finder)
        for name in list(sys.modules):
            if name not in self.saved:
                del sys.modules[name]
        return False

    def load(self, name):
        return importlib.import_module(name)

    def stub_list(self):
        return sorted(set(self.stubs))


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, loader):
        self.l = loader

    def find_spec(self, name, path=None, target=None):
        l = self.l
        if name in l.overrides:
            return importlib.util.spec_from_loader(name, self, is_package=False)
        if name == l.package or name.startswith(l.package + "."):
            rel = name.replace(".", "/")
            if name in l.real:
                pkg, _, _ = rel.rpartition("/")
                return zipimport.zipimporter(f"{l.wheel}/{pkg}").find_spec(name)
            # A package on the way to a real module (empty, its __init__ not run) or a stand-in.
            return importlib.util.spec_from_loader(name, self, is_package=True)
        # Third-party modules named as heavy (torch, numpy, ...): a stand-in; the rest import normally.
        if name.split(".")[0] in l.heavy:
            return importlib.util.spec_from_loader(name, self, is_package=True)
        return None

    def create_module(self, spec):
        l = self.l
        name = spec.name
        if name in l.overrides:
            m = types.ModuleType(name)
            l.overrides[name](m)
            m.__doc__ = l.overrides[name].__doc__
            l.stubs.append(f"{name} (stand-in: {m.__doc__})")
            return m
        if any(r.startswith(name + ".") for r in l.real):
            m = types.ModuleType(name)
            m.__path__ = [f"{l.wheel}/{name.replace('.', '/')}"]
            l.stubs.append(f"{name} (package: its __init__ not run)")
            return m
        m = InertModule(name)
        m.__path__ = []
        l.stubs.append(f"{name} (inert)")
        return m

    def exec_module(self, module):
        pass
