"""Shadow checking (`handler.fidelity_sample`): a reduced-precision worker also runs a share of the texts it serves
on the float32 model, in the same forward call, and records each sampled text's cosine to float32. The answers are
the reduced engine's, computed as without sampling; the float32 run only observes them.

Which texts are sampled is a pure function of each text's tokens (`sampled`): deterministic, the same for a text
whatever its batch, and about `share` of distinct texts. The cosines go out as a histogram and a gauge of the
worker's minimum (`metrics.Samples`); a sample below `handler.min_cosine` is logged as a warning, never answered
otherwise.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from bucketing.metrics import Samples

logger = logging.getLogger(__name__)


def sampled(tokens: np.ndarray, share: float) -> bool:
    """Whether a text of these tokens (its real ones, special tokens included) is shadow-checked at this share: a
    hash of the tokens below `share` of its range."""
    if share <= 0.0:
        return False
    if share >= 1.0:
        return True
    digest = hashlib.blake2b(np.ascontiguousarray(tokens, dtype="<i8").tobytes(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < share * 2**64


class Shadow:
    """What a worker's shadow checks saw: the cosines since the last `drain`, and the minimum since it started."""

    def __init__(self, dtype: str, share: float, floor: float) -> None:
        self.dtype = dtype
        self.share = share
        self.floor = floor
        self.started = False  # off while the worker opens (calibration's passes are not served texts)
        self.cosines: list[float] = []
        self.minimum: float | None = None

    def describe(self) -> str:
        """For the ready line."""
        return f"shadow-checking a share of {self.share:g} of served texts in float32 (handler.fidelity_sample)"

    def start(self) -> None:
        """Sample from now on (the worker is open and serving)."""
        self.started = True

    def picks(self, ids: np.ndarray, mask: np.ndarray) -> list[int]:
        """The rows of a padded pass to check (none before `start`)."""
        if not self.started:
            return []
        return [row for row in range(len(ids)) if sampled(ids[row][mask[row] > 0], self.share)]

    def record(self, cosines: np.ndarray, lengths: np.ndarray) -> None:
        """Sampled rows' cosines to float32 (and their token counts, for the warning line)."""
        for cosine, length in zip(cosines.tolist(), lengths.tolist()):
            self.cosines.append(cosine)
            self.minimum = cosine if self.minimum is None else min(self.minimum, cosine)
            if cosine < self.floor:
                logger.warning(
                    "%s shadow check: a served text of %d tokens has cosine %.6f to float32, below "
                    "handler.min_cosine %g (answered in %s as computed; the start-up probe does not cover it)",
                    self.dtype,
                    length,
                    cosine,
                    self.floor,
                    self.dtype,
                )

    def drain(self) -> Samples:
        """The checks since the last drain (for one handler call's metrics), and the minimum so far."""
        taken, self.cosines = tuple(self.cosines), []
        return Samples(taken, self.minimum, self.floor)
