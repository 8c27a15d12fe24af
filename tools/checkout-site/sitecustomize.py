"""An editable install of a checkout that is not installed: a finder mapping the folders pyproject.toml's
package-dir maps into ``kvconform`` (conformance/ is ``kvconform.conformance``, ...) from this checkout, as the
editable install's finder does. Put this folder first on PYTHONPATH, where Python imports ``sitecustomize`` at
start-up: the RDMA VM does (it shares the checkout read-only at /mnt/project), and so does tools/mutation.py for
its mutated copies of the checkout."""

import importlib.util
import sys
import tomllib
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

_PROJECT = Path(__file__).resolve().parents[2]
_CONFIG = tomllib.loads((_PROJECT / "pyproject.toml").read_text("utf-8"))
_FOLDERS = {name: _PROJECT / folder for name, folder in _CONFIG["tool"]["setuptools"]["package-dir"].items()}


class _PackageDirFinder:
    @staticmethod
    def find_spec(name: str, path: object = None, target: ModuleType | None = None) -> ModuleSpec | None:
        folder = _FOLDERS.get(name)
        if folder is None:
            return None
        return importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


sys.meta_path.insert(0, _PackageDirFinder)
