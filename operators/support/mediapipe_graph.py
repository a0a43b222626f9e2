"""MediaPipe models as the stages use them: the model files ship inside the pinned wheel (nothing
is downloaded), and a stage holding a MediaPipe graph releases it exactly once.
"""

from __future__ import annotations

import contextlib
from typing import Self

MEDIAPIPE_DIST = "mediapipe"
MEDIAPIPE_PIN = "mediapipe==0.10.14"


class MediaPipeGraph:
    """Lifecycle of a stage that holds a MediaPipe graph in the attribute named by ``graph_attr``:
    ``close()`` releases it (idempotent), also as a context manager and when the stage is
    garbage-collected."""

    graph_attr = "graph"

    def close(self) -> None:
        """Release the MediaPipe graph (idempotent)."""
        graph = getattr(self, self.graph_attr, None)
        setattr(self, self.graph_attr, None)
        if graph is not None:
            with contextlib.suppress(Exception):  # already closed, or interpreter shutting down
                graph.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        self.close()
