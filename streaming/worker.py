"""This process's identity: the worker id recorded on the segments it generates.

Liveness (heartbeats, who is dead) is the presence backend's (``streaming.presence``).
"""

from __future__ import annotations

import os
import socket
import time

WORKER_ID = f"{socket.gethostname()}:{os.getpid()}:{int(time.time())}"
