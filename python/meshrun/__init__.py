"""meshrun's Python side: what programs launched by meshrun can call.

- ``meshrun.ft``: restart-free recovery for PyTorch programs (a manager per
  replica group over meshrun's step quorum), as torchft does.
- ``meshrun.heartbeat()``: tell the agent this worker makes progress, for
  ``--hang-timeout``'s precise detection.

The gRPC stubs (``meshrun.v1``) are generated from proto/ when the package is
built (python/generate_grpc_stubs.py); the tests find them in the build tree,
hence the path extension.
"""

import pkgutil

__path__ = pkgutil.extend_path(__path__, __name__)
__version__ = "0.1.0"

from meshrun._heartbeat import heartbeat  # noqa: E402

__all__ = ["heartbeat"]
