"""What ``strata-train synth`` is asked: the :class:`SynthSpec` of a synthetic volume, its
checks and :class:`SynthError`, and :func:`parse_shape` for the command line. The volume's
earth model is :mod:`trainer.earthmodel`'s; writing it, :mod:`trainer.synth`'s.
"""

from __future__ import annotations

from dataclasses import dataclass

from trainer.presets import Shape3

DEFAULT_CHUNKS: Shape3 = (64, 64, 64)
"""Default amplitude chunk shape: 1 MiB of float32, as ``prepare`` writes."""

MAX_FAULTS = 8
"""Most faults a volume may have (each can double the reflectors per trace)."""


class SynthError(Exception):
    """The synthetic volume cannot be written; the message is one line."""


@dataclass(frozen=True)
class SynthSpec:
    """What to generate.

    Attributes:
        shape: Volume shape (inlines, crosslines, samples per trace).
        chunks: Amplitude chunk shape (inline, crossline, time).
        seed: Seed of everything random (>= 0).
        sample_interval_ms: Time between samples, whole milliseconds.
        peak_frequency_hz: Ricker wavelet peak frequency.
        noise: Noise level: rms of the noise added to the reflectivity relative
            to the reflectivity's rms (0 for none).
        faults: Number of normal faults.
        fold_amplitude: Largest fold displacement, as a fraction of the trace length.
        layer_thickness: Mean layer thickness in samples; ``None`` for
            ``clip(samples / 40, 3, 12)``.
        dead_fraction: Fraction of traces marked dead (NaN, trace mask False).
        first_inline: Number of the first inline.
        first_crossline: Number of the first crossline.
        bin_size_m: Trace spacing for the ``cdp_x``/``cdp_y`` coordinates, metres.
    """

    shape: Shape3
    chunks: Shape3 = DEFAULT_CHUNKS
    seed: int = 0
    sample_interval_ms: int = 4
    peak_frequency_hz: float = 25.0
    noise: float = 0.1
    faults: int = 3
    fold_amplitude: float = 0.08
    layer_thickness: float | None = None
    dead_fraction: float = 0.0
    first_inline: int = 1
    first_crossline: int = 1
    bin_size_m: float = 25.0

    def validate(self) -> None:
        """Check the values.

        Raises:
            SynthError: On a value out of range.
        """
        checks = [
            (
                len(self.shape) == 3 and min(self.shape) >= 1,
                f"shape {self.shape} must be 3 sizes >= 1",
            ),
            (len(self.chunks) == 3 and min(self.chunks) >= 1, f"chunks {self.chunks} must be >= 1"),
            (self.seed >= 0, f"seed must be >= 0, got {self.seed}"),
            (self.sample_interval_ms >= 1, "sample interval must be >= 1 ms"),
            (
                0 < self.peak_frequency_hz < 500.0 / self.sample_interval_ms,
                f"peak frequency {self.peak_frequency_hz} Hz must be in (0, Nyquist "
                f"{500.0 / self.sample_interval_ms:g} Hz)",
            ),
            (self.noise >= 0, f"noise must be >= 0, got {self.noise}"),
            (0 <= self.faults <= MAX_FAULTS, f"faults must be in [0, {MAX_FAULTS}]"),
            (0 <= self.fold_amplitude <= 1, "fold amplitude must be in [0, 1]"),
            (
                self.layer_thickness is None or self.layer_thickness >= 1,
                "layer thickness must be >= 1 sample",
            ),
            (
                0 <= self.dead_fraction < 1,
                f"dead fraction must be in [0, 1), got {self.dead_fraction}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise SynthError(message)


def parse_shape(text: str, what: str = "shape") -> Shape3:
    """Parse ``"IxXxT"`` (e.g. ``"512x512x1024"``) into three positive ints.

    Args:
        text: The text.
        what: Name used in the error message.

    Returns:
        The three sizes.

    Raises:
        SynthError: If the text is not three positive integers joined by ``x``.
    """
    parts = text.lower().replace("×", "x").split("x")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 3 or min(values) < 1:
        raise SynthError(f"{what} must look like IxXxT with positive integers, got {text!r}")
    return (values[0], values[1], values[2])
