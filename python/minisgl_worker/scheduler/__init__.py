"""The scheduler, split by job: the loop (`loop.py`), prefill admission (`prefill.py`),
the decode set (`decode.py`), request slots (`table.py`), pages (`cache.py`), ZMQ (`io.py`)."""

from .io import ZmqIO
from .loop import follow, serve
from .scheduler import Scheduler

__all__ = ["Scheduler", "ZmqIO", "follow", "serve"]
