"""Keep the code Python compiles from an Ansible module's AnsiballZ zip, for the test suite's plays.

Every module task runs a fresh zip of the module and its module_utils; zipimport finds no bytecode
in it and compiles ansible.module_utils.basic and the rest from source at every task: about 0.15 of
the 0.33 CPU-s a `stat` loop item's module process took on 2 cores. The code objects are kept in
``$HSX_ANSIBALLZ_CACHE`` by the hash of their source and the interpreter's bytecode tag, so a
changed source or another Python never reads them. Only the test suite puts this directory on
PYTHONPATH; without ``$HSX_ANSIBALLZ_CACHE`` it does nothing.
"""

import os
import sys
import zipimport

_CACHE = os.environ.get("HSX_ANSIBALLZ_CACHE")

if _CACHE and hasattr(zipimport, "_compile_source"):
    _compile = zipimport._compile_source

    def _compile_source(pathname, source):
        import hashlib
        import marshal

        path = os.path.join(_CACHE, f"{hashlib.sha256(source).hexdigest()}.{sys.implementation.cache_tag}")
        try:
            with open(path, "rb") as f:
                return marshal.loads(f.read())
        except (OSError, ValueError, EOFError, TypeError):
            pass
        code = _compile(pathname, source)
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(marshal.dumps(code))
            os.replace(tmp, path)  # whole or not at all: plays on two hosts may write the same entry
        except OSError:
            pass
        return code

    zipimport._compile_source = _compile_source
