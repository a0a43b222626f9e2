"""MediaPipe models as the stages use them: the model files ship inside the pinned wheel (nothing
is downloaded; ``mediapipe_load_error`` says so when one does not load), and a stage holding a
MediaPipe graph releases it exactly once.
"""

from __future__ import annotations

import contextlib
from typing import Self

from operators.support.models import ModelLoadError

MEDIAPIPE_DIST = "mediapipe"
MEDIAPIPE_PIN = "mediapipe==0.10.14"


def mediapipe_load_error(what: str, why: str, exc: BaseException | None, ships: str, stage: str) -> ModelLoadError:
    """The error of a MediaPipe model that did not load: ``what`` (the model and its files), ``why``
    (and the cause, when there is one), where the model ``ships`` inside the wheel, and the
    ``stage`` whose nodes need the pinned wheel."""
    return ModelLoadError(
        f"cannot load MediaPipe {what}: {why}{f': {exc}' if exc is not None else ''}. {ships}; install "
        f"{MEDIAPIPE_PIN} on every node that runs {stage} (no download is needed or attempted)."
    )


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
